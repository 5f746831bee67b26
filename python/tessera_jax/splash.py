"""Splash attention as a differentiable JAX function over tessera's splash kernels.

`splash_attention(q, k, v, mask=..., block_sizes=...)` asks tessera for the attention's
kernel plans (the forward kernel with its block-sparsity tables; the backward's
preprocessing, dK/dV and dQ kernels, or the fused backward and its dQ reduction) and calls
each kernel through the `tessera_kernel` primitive. A `jax.custom_vjp` ties them: the forward
saves `out` and the logsumexp, the backward runs tessera's backward kernels on them, so
`jax.grad` never differentiates a kernel. A call that is not differentiated runs the forward
without its logsumexp (tessera's inference plan, as JAX's splash without `save_residuals`). Works under `jax.jit`, `jax.grad` and
`jax.shard_map` (each device calls the kernels on its local blocks).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from . import _tessera
from ._arrays import from_triple, numpy_dtype, tessera_dtype
from ._primitive import call


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes of the splash kernels (JAX's `BlockSizes` names). The forward computes
    `block_q` queries by `block_kv` keys per grid step, `block_kv_compute` keys at a time;
    the dK/dV (or fused) kernel uses the `*_dkv` sizes, the dQ kernel the `*_dq` ones.
    Unset sizes default as in JAX: dkv and dq blocks to the forward's, compute blocks to
    their blocks, except `block_kv_dq_compute` (JAX's dQ has none), which tessera picks by
    `block_kv_dq` (`tessera_splash::default_dq_compute_block`). `block_diagonal` (not in
    JAX's): the sub-tile every kernel cuts causal-diagonal square blocks into, skipping those
    above the diagonal (tokamax's `qk_diag_skip`); unset, each kernel's default
    (`tessera_splash::default_*diagonal_block`: 256 for blocks of 1024 or more)."""

    block_q: int = 128
    block_kv: int = 128
    block_kv_compute: int | None = None
    block_q_dkv: int | None = None
    block_kv_dkv: int | None = None
    block_kv_dkv_compute: int | None = None
    block_q_dq: int | None = None
    block_kv_dq: int | None = None
    block_kv_dq_compute: int | None = None
    block_diagonal: int | None = None
    use_fused_bwd_kernel: bool = False

    def __post_init__(self):
        # Checked here: a negative size would reach tessera as an unsigned integer and fail
        # with Python's OverflowError instead of a sentence.
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "use_fused_bwd_kernel" or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _tessera.TesseraError(
                    f"BlockSizes.{field.name} = {value!r}: a block size is a positive whole "
                    "number of queries or keys (e.g. 128)"
                )


@functools.lru_cache(maxsize=64)
def _plan(q, k, v, dtype, mask, blocks: BlockSizes, segmented, sinks, soft_cap, scale):
    plan = _tessera.splash_plan(
        list(q),
        list(k),
        list(v),
        dtype,
        mask,
        blocks.block_q,
        blocks.block_kv,
        block_kv_compute=blocks.block_kv_compute,
        block_q_dkv=blocks.block_q_dkv,
        block_kv_dkv=blocks.block_kv_dkv,
        block_kv_dkv_compute=blocks.block_kv_dkv_compute,
        block_q_dq=blocks.block_q_dq,
        block_kv_dq=blocks.block_kv_dq,
        block_kv_dq_compute=blocks.block_kv_dq_compute,
        block_diagonal=blocks.block_diagonal,
        fused_bwd=blocks.use_fused_bwd_kernel,
        segmented=segmented,
        sinks=sinks,
        soft_cap=soft_cap,
        scale=scale,
    )
    return _Plan(
        forward=tuple(_stage(s) for s in plan["forward"]),
        inference=tuple(_stage(s) for s in plan["inference"]),
        backward=tuple(_stage(s) for s in plan["backward"]),
    )


@dataclasses.dataclass(frozen=True)
class _Stage:
    kernel: _tessera.Kernel
    # ("const", numpy array), ("zeros", jax.ShapeDtypeStruct) or ("tensor", name), per
    # argument.
    args: tuple
    outputs: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    """The stages of one configured attention (compared by identity: `_plan` caches it)."""

    forward: tuple
    # The forward without its logsumexp, for a call no backward follows.
    inference: tuple
    backward: tuple


def _stage_arg(kind, value):
    if kind == "const":
        return ("const", from_triple(value))
    if kind == "zeros":
        shape, dtype = value
        return ("zeros", jax.ShapeDtypeStruct(tuple(shape), numpy_dtype(dtype)))
    return ("tensor", value)


def _stage(s) -> _Stage:
    args = tuple(_stage_arg(kind, value) for kind, value in s.args)
    return _Stage(kernel=s.kernel, args=args, outputs=tuple(s.outputs))


def stage_args(stage, env: dict) -> list:
    """A stage's arguments: its constants, zeros made in the program (`jnp.zeros`, a
    broadcast, not a constant the size of the buffer) and the tensors of `env` by name."""
    def arg(kind, value):
        if kind == "const":
            return jnp.asarray(value)
        if kind == "zeros":
            return jnp.zeros(value.shape, value.dtype)
        return env[value]

    return [arg(kind, value) for kind, value in stage.args]


def run_stages(stages, env: dict) -> dict:
    """Calls each stage's kernel on its arguments ([`stage_args`]); the outputs join `env`
    under their names. Returns `env`."""
    for stage in stages:
        env.update(zip(stage.outputs, call(stage.kernel, *stage_args(stage, env))))
    return env


def splash_attention(
    q,
    k,
    v,
    *,
    mask: str,
    block_sizes: BlockSizes,
    segment_ids=None,
    soft_cap: float | None = None,
    sinks=None,
    scale: float | None = None,
):
    """Splash attention of `q [B, H, Sq, D]`, `k [B, KVH, Skv, D]`, `v [B, KVH, Skv, Dv]`
    (f32 or bf16; `KVH` divides `H`: MHA, GQA, MQA), returning `out [B, H, Sq, Dv]`.

    - `mask`: tessera's mask syntax: `"causal"`, `"full"`, `"local:LEFT:RIGHT"` (keys from
      `q - LEFT` to `q + RIGHT`), `"chunked:SIZE"`, `"causal:OFFSET"`.
    - `block_sizes`: a `BlockSizes`.
    - `segment_ids`: `(q_ids [B, Sq], kv_ids [B, Skv])` int32 (packed sequences: a query
      sees only keys of its segment), or None.
    - `soft_cap`: logits become `soft_cap * tanh(logits / soft_cap)`.
    - `sinks`: `[H]` f32, one extra logit per head whose value is zero (differentiable).
    - `scale`: logits are `scale * q.k` (default `1 / sqrt(D)`).

    Differentiable in `q`, `k`, `v` and `sinks` through tessera's backward kernels.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.ndim(x) != 4:
            raise ValueError(f"{name} must be [B, heads, S, D], got shape {jnp.shape(x)}")
    if not isinstance(block_sizes, BlockSizes):
        raise TypeError(
            f"block_sizes must be a tessera_jax.BlockSizes, got {type(block_sizes).__name__}"
        )
    dtype = jnp.result_type(q)
    for name, x in (("k", k), ("v", v)):
        if jnp.result_type(x) != dtype:
            raise TypeError(f"q is {dtype} but {name} is {jnp.result_type(x)}; give one dtype")
    plan = _plan(
        tuple(jnp.shape(q)),
        tuple(jnp.shape(k)),
        tuple(jnp.shape(v)),
        tessera_dtype(dtype),
        mask,
        block_sizes,
        segment_ids is not None,
        sinks is not None,
        None if soft_cap is None else float(soft_cap),
        None if scale is None else float(scale),
    )
    extra = {}
    if segment_ids is not None:
        q_ids, kv_ids = segment_ids
        b, sq, skv = jnp.shape(q)[0], jnp.shape(q)[2], jnp.shape(k)[2]
        for name, ids, n in (("q_ids", q_ids, sq), ("kv_ids", kv_ids, skv)):
            if tuple(jnp.shape(ids)) != (b, n):
                raise ValueError(f"segment_ids {name} must be [{b}, {n}], got {jnp.shape(ids)}")
        extra["q_segment_ids"] = jnp.reshape(jnp.asarray(q_ids, jnp.int32), (b, 1, sq))
        extra["kv_segment_ids"] = jnp.reshape(jnp.asarray(kv_ids, jnp.int32), (b, 1, skv))
    if sinks is None:
        return _splash(plan, q, k, v, extra)
    heads = jnp.shape(q)[1]
    if tuple(jnp.shape(sinks)) != (heads,):
        raise ValueError(f"sinks must be [{heads}] (one per query head), got {jnp.shape(sinks)}")
    return _splash_sinks(plan, q, k, v, jnp.asarray(sinks, jnp.float32), extra)


def _forward(plan: _Plan, q, k, v, extra, sinks=None):
    env = {"q": q, "k": k, "v": v, **extra}
    if sinks is not None:
        env["sinks"] = sinks
    run_stages(plan.forward, env)
    return env["out"], env["lse"]


def _inference(plan: _Plan, q, k, v, extra, sinks=None):
    env = {"q": q, "k": k, "v": v, **extra}
    if sinks is not None:
        env["sinks"] = sinks
    run_stages(plan.inference, env)
    return env["out"]


def _backward(plan: _Plan, q, k, v, extra, sinks, out, lse, dout):
    env = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "dout": dout, **extra}
    if sinks is not None:
        env["sinks"] = sinks
    run_stages(plan.backward, env)
    grads = tuple(env[g].astype(x.dtype) for g, x in (("dq", q), ("dk", k), ("dv", v)))
    return grads, env["dsinks"]


def _no_cotangents(extra):
    return {name: None for name in extra}


# The primal of each custom_vjp runs where nothing differentiates the call: the inference
# plan. Under differentiation JAX runs the `_fwd` rule instead, which keeps the logsumexp.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _splash(plan, q, k, v, extra):
    return _inference(plan, q, k, v, extra)


def _splash_fwd(plan, q, k, v, extra):
    out, lse = _forward(plan, q, k, v, extra)
    return out, (q, k, v, extra, out, lse)


def _splash_bwd(plan, residuals, dout):
    q, k, v, extra, out, lse = residuals
    (dq, dk, dv), _ = _backward(plan, q, k, v, extra, None, out, lse, dout)
    return dq, dk, dv, _no_cotangents(extra)


_splash.defvjp(_splash_fwd, _splash_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _splash_sinks(plan, q, k, v, sinks, extra):
    return _inference(plan, q, k, v, extra, sinks)


def _splash_sinks_fwd(plan, q, k, v, sinks, extra):
    out, lse = _forward(plan, q, k, v, extra, sinks)
    return out, (q, k, v, sinks, extra, out, lse)


def _splash_sinks_bwd(plan, residuals, dout):
    q, k, v, sinks, extra, out, lse = residuals
    (dq, dk, dv), dsinks = _backward(plan, q, k, v, extra, sinks, out, lse, dout)
    return dq, dk, dv, jnp.reshape(dsinks, jnp.shape(sinks)), _no_cotangents(extra)


_splash_sinks.defvjp(_splash_sinks_fwd, _splash_sinks_bwd)


def plan_kernels(plan: _Plan) -> list[_tessera.Kernel]:
    """Every kernel of a plan, forward then backward (for inspection and tests)."""
    return [s.kernel for s in plan.forward + plan.backward]


__all__ = ["BlockSizes", "splash_attention", "run_stages"]
