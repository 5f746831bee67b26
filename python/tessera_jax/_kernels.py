"""The kernel registry from Python: listing, instantiating, describing, and running a kernel
in tessera's interpreter (the reference)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from . import _tessera
from ._arrays import from_triple, numpy_dtype, tessera_dtype, to_triple
from ._tessera import Kernel


def kernels() -> list[dict[str, Any]]:
    """The registry's kernels: `[{name, summary, on_mesh, params: [{name, default, help,
    size, sets}]}]`. `size` parameters only set default argument sizes (`sets`: the
    (argument, dim) pairs they set); the others are compile-time parameters. `on_mesh`
    kernels (the ring shift, the in-kernel all-gathers, the all-gather matmul) run on a
    device mesh (`devices` parameter), each device with its own arguments: `call` them
    inside `jax.shard_map` over that many devices."""
    return _tessera.kernels()


def _param_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


def _check_shape(name: str, index: int, shape: Sequence[Any]) -> None:
    """Refuses a shape with a dim that is not a count of elements, with a sentence (tessera
    takes dims as unsigned integers: a negative one would fail in Python's conversion)."""
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 0:
            raise _tessera.TesseraError(
                f"argument {index} of `{name}` has shape {tuple(shape)}: dim {dim!r} is not "
                "a count of elements (a whole number, 0 or more)"
            )


def kernel(
    name: str,
    params: Mapping[str, Any] | None = None,
    args: Sequence[Any] | None = None,
) -> Kernel:
    """The registry kernel `name` with compile-time parameters `params` (`{"BM": 128,
    "dtype": "bf16", "causal": True}`), instantiated for `args`: arrays or
    `jax.ShapeDtypeStruct`s, or `(shape, dtype)` pairs (default: the sizes in `params` and
    the registry's defaults). Raises `TesseraError` with tessera's sentence for a bad name,
    parameter or argument."""
    given = [(k, _param_text(v)) for k, v in (params or {}).items()]
    specs = None
    if args is not None:
        specs = []
        for i, a in enumerate(args):
            if isinstance(a, tuple) and len(a) == 2 and not hasattr(a, "shape"):
                shape, dtype = a
                _check_shape(name, i, shape)
                specs.append((list(shape), dtype if isinstance(dtype, str) else tessera_dtype(dtype)))
            else:
                specs.append((list(jax.numpy.shape(a)), tessera_dtype(a.dtype)))
    return _tessera.kernel(name, given, specs)


def describe(k: Kernel, *, tpu: bool = True) -> dict[str, Any]:
    """What tessera makes of `k`: its name, arguments, output shapes and dtypes, the
    StableHLO function text of the portable lowering and, with `tpu`, the Mosaic custom-call
    config (kernel name, body, backend config JSON, cost estimate, scoped VMEM limit), which
    checks the kernel against the TPU rules (a `TesseraError` names what does not fit)."""
    info = {
        "name": k.name,
        "args": [
            {"name": n, "role": r, "shape": tuple(s), "dtype": d} for n, r, s, d in k.args
        ],
        "outputs": [
            jax.ShapeDtypeStruct(tuple(s), numpy_dtype(d)) for _n, _r, s, d in k.outputs
        ],
        "stablehlo": k.stablehlo(),
    }
    if tpu:
        info["mosaic"] = k.mosaic()
    return info


def run_reference(k: Kernel, *arrays) -> list[np.ndarray]:
    """Runs `k` in tessera's interpreter on host arrays (in `k.args` order): tessera's own
    run, the reference its backends are checked against. A kernel on a mesh takes
    `run_reference_on_devices`."""
    return [from_triple(t) for t in k.run([to_triple(a) for a in arrays])]


def run_reference_on_devices(k: Kernel, per_device: Sequence[Sequence[Any]]) -> list[list[np.ndarray]]:
    """Runs the mesh kernel `k` in tessera's interpreter on every device at once:
    `per_device[d]` are device `d`'s host arrays (in `k.args` order); returns each device's
    outputs."""
    triples = [[to_triple(a) for a in arrays] for arrays in per_device]
    return [[from_triple(t) for t in outs] for outs in k.run_on_devices(triples)]
