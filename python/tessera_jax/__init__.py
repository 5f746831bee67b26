"""tessera kernels as JAX functions.

tessera is a Pallas-like kernel DSL in Rust; this package puts its kernels into JAX programs
through the tessera library itself (a Rust extension, no subprocess):

- `kernels()` lists the registry's kernels and their parameters; `kernel(name, params,
  args)` instantiates one; `describe(k)` gives its Mosaic custom-call config, the StableHLO
  text of its portable lowering and its output shapes; `run_reference(k, *arrays)` runs it in
  tessera's interpreter (`run_reference_on_devices` for a kernel on a device mesh).
- `call(k, *arrays)` calls a kernel from JAX: one `tessera_kernel` primitive, lowered to a
  Mosaic `tpu_custom_call` on TPU and to tessera's StableHLO elsewhere. A kernel on a device
  mesh (`k.devices > 1`: remote copies, semaphores across devices) is called inside
  `jax.shard_map` over a mesh of that many devices, each device on its own blocks.
  A kernel whose registry entry checks its run-time data (paged attention's page table and
  lengths) is checked by `call` on concrete arrays; `check_inputs(k, *arrays)` checks the
  arrays a jitted function will get (under `jax.jit` they are tracers: not checked there).
  A kernel that indexes with run-time data checks every index it cannot prove in range
  when it runs (`k.check_flags`): `call` raises `TesseraError` on a failed check for
  concrete arrays; under `jax.jit` a host callback raises it (the jitted call fails with
  JAX's runtime error carrying the sentence), or `call(..., return_check_flags=True)`
  returns the flags for `raise_on_check_flags(k, flags)`.
- `splash_attention(q, k, v, mask=..., block_sizes=BlockSizes(...))`: differentiable splash
  attention over tessera's forward and backward kernels (jit, grad, shard_map).
- `use_tessera_libtpu()` points JAX at the libtpu tessera pins, for compiling for a TPU
  topology on a machine without a TPU; `compiled_kernel_vmem(compiled)` reads the scoped
  VMEM the compiler gave each Mosaic kernel.

Errors from tessera are `TesseraError`s carrying tessera's sentence.
"""

from ._tessera import Kernel, TesseraError
from ._kernels import describe, kernel, kernels, run_reference, run_reference_on_devices
from ._primitive import call, check_inputs, raise_on_check_flags, tessera_kernel_p
from ._tpu import compiled_kernel_vmem, use_tessera_libtpu
from .splash import BlockSizes, splash_attention

__all__ = [
    "BlockSizes",
    "Kernel",
    "TesseraError",
    "call",
    "check_inputs",
    "compiled_kernel_vmem",
    "describe",
    "kernel",
    "kernels",
    "raise_on_check_flags",
    "run_reference",
    "run_reference_on_devices",
    "splash_attention",
    "tessera_kernel_p",
    "use_tessera_libtpu",
]
