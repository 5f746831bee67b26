#!/usr/bin/env python3
"""Generates tests/pallas_corpus/: JAX Pallas TPU kernels as Mosaic text, with their inputs and
the outputs of Pallas' interpret mode, for `tests/pallas_corpus.rs` to run through mosaic-eval.

usage: python3 scripts/gen_pallas_corpus.py [OUT_DIR]      (default: tests/pallas_corpus)

Run once; its outputs are checked in (the test needs neither Python nor JAX). It pins
jax[tpu]==0.10.2 in a venv of its own ($TESSERA_JAX_VENV, default ~/.cache/tessera/jax-0.10.2),
creating it on first use, and needs no TPU: each pallas_call is run in interpret mode on the
CPU for its outputs and lowered for a TPU topology (v5p:2x2x1) for its Mosaic module. The
Mosaic body of the `tpu_custom_call` is MLIR bytecode; jaxlib's MLIR bindings with the TPU
dialect registered read it back and the `mosaic-serde{serialize=false}` pass makes it the
readable text Mosaic compiles.

Per kernel, OUT_DIR/NAME/ holds `kernel.mlir`, the pallas_call's operands `arg0.npy`..
(scalar-prefetch tables first, as the custom call takes them) and its results `out0.npy`..
(bf16 as uint16 bits, which tessera's .npy reader takes as bf16); OUT_DIR/corpus.toml lists
the kernels, where each came from and which results are dead (scratch-like outputs that the
kernel's caller drops, undefined when a parallel grid dim is split between cores).
"""
import os
import subprocess
import sys

JAX_PIN = "jax[tpu]==0.10.2"
VENV = os.environ.get(
    "TESSERA_JAX_VENV", os.path.join(os.path.expanduser("~"), ".cache", "tessera", "jax-0.10.2")
)


def ensure_venv():
    """Re-runs this script inside the pinned venv, creating it first if needed (a marker file
    says the install finished, so an interrupted one is redone)."""
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    marker = os.path.join(VENV, "tessera-installed")
    if not os.path.exists(marker):
        print(f"installing {JAX_PIN} into {VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", JAX_PIN], check=True)
        with open(marker, "w") as f:
            f.write(JAX_PIN + "\n")
    os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])


ensure_venv()

# Everything below runs inside the venv.
# libtpu, compile-only: no cloud metadata server to wait for, and no lock against the other
# processes (tessera's tests) that may have it loaded.
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ["JAX_PLATFORMS"] = "cpu"
import base64  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax._src.interpreters import mlir as jax_mlir  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # noqa: E402
from jaxlib.mlir import ir, passmanager  # noqa: E402
from jaxlib.mosaic.python import tpu as tpu_dialect  # noqa: E402

assert jax.__version__ == "0.10.2", jax.__version__

# Every pallas_call made while a generator runs, in order: (kernel, kwargs, operands, results).
RECORDED = []
_pallas_call = pl.pallas_call


def recording_pallas_call(kernel, **kwargs):
    """`pl.pallas_call` in interpret mode that records its concrete operands and results
    (run under `jax.disable_jit`, so they are concrete)."""
    call = _pallas_call(kernel, **dict(kwargs, interpret=True))

    def run(*args):
        out = call(*args)
        RECORDED.append((kernel, kwargs, args, out))
        return out

    return run


pl.pallas_call = recording_pallas_call


@functools.cache
def tpu_device():
    topo = topologies.get_topology_desc(topology_name="v5p:2x2x1", platform="tpu")
    return topo.devices[0]


def mosaic_text(kernel, kwargs, args):
    """The Mosaic module of the pallas_call, lowered for a TPU, as readable MLIR text."""
    kw = dict(kwargs, interpret=False)
    one = jax.sharding.SingleDeviceSharding(tpu_device())
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), args)
    call = _pallas_call(kernel, **kw)
    text = jax.jit(lambda *a: call(*a)).trace(*specs).lower(lowering_platforms=("tpu",)).as_text()
    bodies = re.findall(r'backend_config = "((?:[^"\\]|\\.)*)"', text)
    if len(bodies) != 1:
        raise SystemExit(f"expected one tpu_custom_call, found {len(bodies)}")
    raw = re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), bodies[0])
    body = base64.b64decode(json.loads(raw)["custom_call_config"]["body"])
    # JAX's own context has the upstream dialects (func, arith, vector, scf, ...) loaded, so
    # their ops print in their custom form, as Mosaic's tools print them.
    ctx = jax_mlir.make_ir_context()
    tpu_dialect.register_dialect(ctx)
    # The bytecode's versioning dialect (`stable_mosaic`) has no ops; the serde pass reads it.
    ctx.allow_unregistered_dialects = True
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(body)
        passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(
            module.operation
        )
        return module.operation.get_asm(enable_debug_info=False)


def save_npy(path, a):
    a = np.asarray(a)
    if a.dtype == jnp.bfloat16:
        a = a.view(np.uint16)
    elif a.dtype not in (np.float32, np.int32, np.int8, np.bool_):
        raise SystemExit(f"{path}: dtype {a.dtype} has no .npy form tessera reads")
    np.save(path, np.ascontiguousarray(a), allow_pickle=False)


def rand(key, shape, dtype, scale=1.0):
    return (jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale).astype(dtype)


# ---------------------------------------------------------------- the kernels (ours, small)


def elementwise():
    """out = x * y + exp(x), f32, 2-D blocks over a 2-D grid."""

    def body(x_ref, y_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = x * y_ref[...] + jnp.exp(x)

    x, y = rand(1, (128, 256), jnp.float32), rand(2, (128, 256), jnp.float32)
    spec = pl.BlockSpec((64, 128), lambda i, j: (i, j))
    pl.pallas_call(
        body,
        grid=(2, 2),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x, y)


def matmul():
    """bf16 x bf16 -> bf16, an f32 accumulator in VMEM scratch across the `arbitrary` k dim,
    initialised at k == 0 and stored at the last k (`pl.when`)."""
    bm = bn = bk = 128

    def body(x_ref, y_ref, o_ref, acc_ref):
        k = pl.program_id(2)

        @pl.when(k == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(k == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    x, y = rand(3, (256, 384), jnp.bfloat16), rand(4, (384, 256), jnp.bfloat16)
    pl.pallas_call(
        body,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(2, 2, 3),
            in_specs=[
                pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                pl.BlockSpec((bk, bn), lambda i, j, k: (k, j)),
            ],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((256, 256), jnp.bfloat16),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
    )(x, y)


def softmax():
    """Row softmax of f32 rows, a block of 8 whole rows per step."""

    def body(x_ref, o_ref):
        x = x_ref[...]
        e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
        o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True)

    x = rand(5, (64, 256), jnp.float32, scale=3.0)
    spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
    pl.pallas_call(
        body,
        grid=(8,),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x)


def scalar_prefetch():
    """Gathers row blocks through a table in SMEM (the index map reads it) and scales each by
    a factor read from a second table inside the body."""

    def body(idx_ref, scale_ref, x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[...] = x_ref[...] * scale_ref[i].astype(jnp.float32)

    x = rand(6, (6 * 16, 128), jnp.bfloat16)
    idx = jnp.array([4, 0, 5, 5, 2, 1, 3, 0], jnp.int32)
    scale = jnp.array([1, -2, 3, 4, -1, 2, 7, 1], jnp.int32)
    pl.pallas_call(
        body,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(8,),
            in_specs=[pl.BlockSpec((16, 128), lambda i, idx, scale: (idx[i], 0))],
            out_specs=pl.BlockSpec((16, 128), lambda i, idx, scale: (i, 0)),
        ),
        out_shape=jax.ShapeDtypeStruct((8 * 16, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(idx, scale, x)


def splash():
    """JAX's own splash attention, causal, bf16, 2 heads, S = 256, D = 128: the forward with
    residuals (as training calls it) and the backward's dkv and dq kernels, recorded from
    one jax.vjp. Query blocks of 128, key blocks of 256 (so the kernels tile 128-lane
    values: `tpu.concatenate`)."""
    H, S, D = 2, 256, 128
    mask = sm.MultiHeadMask([sm.CausalMask((S, S))] * H)
    blocks = sk.BlockSizes(
        block_q=128, block_kv=256, block_kv_compute=256,
        block_q_dkv=128, block_kv_dkv=256, block_kv_dkv_compute=256,
        block_q_dq=128, block_kv_dq=256,
    )
    f = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=blocks, interpret=True)
    q, k, v = (rand(10 + i, (H, S, D), jnp.bfloat16) for i in range(3))
    do = rand(13, (H, S, D), jnp.bfloat16)
    out, vjp = jax.vjp(f, q, k, v)
    vjp(do)


# The generators, each making one or more pallas_calls.
KERNELS = [elementwise, matmul, softmax, scalar_prefetch, splash]

# Results the kernel's caller drops, by kernel: splash forward's m, l and o "outputs" are
# scratch in all but name, with a constant block index across the parallel head dim (so on a
# chip with two cores they are written back by both, and undefined).
DEAD = {"splash_mha_fwd_residuals": [0, 1, 2]}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "pallas_corpus"
    )
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    entries = []
    for gen in KERNELS:
        RECORDED.clear()
        with jax.disable_jit():
            gen()
        for kernel, kwargs, args, results in RECORDED:
            # JAX's kernels name their pallas_calls; ours are named after their generator.
            name = kwargs.get("name") or gen.__name__
            d = os.path.join(out_dir, name)
            os.makedirs(d)
            text = mosaic_text(kernel, kwargs, args)
            with open(os.path.join(d, "kernel.mlir"), "w") as f:
                f.write(text)
            leaves = jax.tree.leaves(args)
            for i, a in enumerate(leaves):
                save_npy(os.path.join(d, f"arg{i}.npy"), a)
            outs = jax.tree.leaves(results)
            for i, a in enumerate(outs):
                save_npy(os.path.join(d, f"out{i}.npy"), a)
            about = " ".join(gen.__doc__.split())
            entries.append((name, about, len(leaves), len(outs), DEAD.get(name, [])))
            print(f"{name}: {len(leaves)} operands, {len(outs)} results, "
                  f"{len(text.splitlines())} lines of Mosaic", file=sys.stderr)
    with open(os.path.join(out_dir, "corpus.toml"), "w") as f:
        f.write("# Generated by scripts/gen_pallas_corpus.py with jax[tpu]==0.10.2; do not edit.\n")
        f.write(f'jax = "{jax.__version__}"\n')
        for name, about, n_args, n_outs, dead in entries:
            f.write(f"\n[[kernel]]\nname = \"{name}\"\nabout = {json.dumps(about)}\n")
            f.write(f"args = {n_args}\noutputs = {n_outs}\ndead_outputs = {dead}\n")


if __name__ == "__main__":
    main()
