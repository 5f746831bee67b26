"""tessera_jax.splash_attention under jax.jit and jax.grad on JAX's CPU backend against dense
attention in f64: the output and the gradients of q, k, v (and sinks), MHA and GQA, causal
and local masks, segment ids, the fused backward, soft cap and sinks, bf16."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
import tessera_jax as tj

pytestmark = pytest.mark.usefixtures("x64")

B, S, D = 1, 256, 64


def inputs(heads, kv_heads, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(B, heads, S, D), (B, kv_heads, S, D), (B, kv_heads, S, D), (B, heads, S, D)]
    return [rng.uniform(-1, 1, s).astype(dtype) for s in shapes]


def forward_and_grads(attention, q, k, v, dout, *extra):
    """`out` and the gradients of `sum(out * dout)` with respect to q, k, v and `extra`."""

    def f(q, k, v, dout, *extra):
        out, vjp = jax.vjp(lambda q, k, v, *e: attention(q, k, v, *e), q, k, v, *extra)
        return out, vjp(dout.astype(out.dtype))

    out, grads = jax.jit(f)(q, k, v, dout, *extra)
    return np.asarray(out, np.float64), [np.asarray(g, np.float64) for g in grads]


def max_errors(got, want):
    return [float(np.abs(g - w).max()) for g, w in zip(got, want)]


CASES = {
    # name: heads, kv heads, mask, segment ids, fused backward
    "mha causal": (4, 4, "causal", False, False),
    "gqa local": (4, 2, "local:64:32", False, False),
    "gqa causal segment ids": (4, 2, "causal", True, False),
    "mqa causal fused backward": (4, 1, "causal", False, True),
}


@pytest.mark.parametrize("case", CASES)
def test_forward_and_gradients_match_dense_f64(case):
    heads, kv_heads, mask, segmented, fused = CASES[case]
    q, k, v, dout = inputs(heads, kv_heads)
    segment_ids = None
    if segmented:
        # Three packed sequences per row.
        ids = np.repeat(np.array([0, 1, 2], np.int32), [100, 60, 96])[None].repeat(B, 0)
        segment_ids = (ids, ids)
    blocks = tj.BlockSizes(block_q=128, block_kv=128, use_fused_bwd_kernel=fused)

    def splash(q, k, v):
        return tj.splash_attention(
            q, k, v, mask=mask, block_sizes=blocks, segment_ids=segment_ids
        )

    def dense(q, k, v):
        return reference.attention(q, k, v, mask=mask, segment_ids=segment_ids)[0]

    out, grads = forward_and_grads(splash, q, k, v, dout)
    want_out, want_grads = forward_and_grads(dense, q, k, v, dout.astype(np.float64))
    errors = max_errors([out, *grads], [want_out, *want_grads])
    assert max(errors) <= 1e-5, f"out, dq, dk, dv differ from f64 by {errors}"


def tessera_kernel_outputs(jaxpr):
    """The number of outputs of every `tessera_kernel` call in `jaxpr`, nested jaxprs (a
    custom_vjp's, jit's) included, in order."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "tessera_kernel":
            found.append(len(eqn.outvars))
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found.extend(tessera_kernel_outputs(inner))
    return found


def test_a_call_no_gradient_follows_runs_the_forward_without_its_logsumexp():
    q, k, v, dout = inputs(4, 2)
    blocks = tj.BlockSizes(block_q=128, block_kv=128)

    def splash(q, k, v):
        return tj.splash_attention(q, k, v, mask="causal", block_sizes=blocks)

    out = np.asarray(jax.jit(splash)(q, k, v), np.float64)
    want = reference.attention(q, k, v, mask="causal")[0]
    assert max_errors([out], [want])[0] <= 1e-5
    # Not differentiated: one kernel, the forward with `out` alone (the inference plan).
    assert tessera_kernel_outputs(jax.make_jaxpr(splash)(q, k, v).jaxpr) == [1]
    # Differentiated: the forward keeps its logsumexp (out, lse) for the backward kernels.
    vjp = jax.make_jaxpr(lambda q, k, v: jax.vjp(splash, q, k, v)[0])(q, k, v)
    assert tessera_kernel_outputs(vjp.jaxpr) == [2]


def test_the_fused_backward_makes_its_dq_partials_in_the_program():
    """The fused backward's dQ partials start from zeros the program makes (a broadcast of
    one scalar), not from a constant the size of the partials embedded in it."""
    q, k, v, dout = inputs(4, 2)
    blocks = tj.BlockSizes(block_q=128, block_kv=128, use_fused_bwd_kernel=True)

    def grads(q, k, v, dout):
        splash = lambda q, k, v: tj.splash_attention(q, k, v, mask="causal", block_sizes=blocks)
        out, vjp = jax.vjp(splash, q, k, v)
        return vjp(dout)

    lines = jax.jit(grads).lower(q, k, v, dout).as_text().splitlines()
    # One partial per key block up to 3: [2, B, H, S, D] at 2 key blocks of 128.
    partials = re.compile(rf"tensor<2x{B}x4x{S}x{D}xf32>")
    made = [l for l in lines if "stablehlo.broadcast_in_dim" in l and partials.search(l)]
    assert len(made) == 1, "the dQ partials are not made in the program"
    constants = [l for l in lines if "stablehlo.constant" in l and partials.search(l)]
    assert constants == [], constants


def test_diagonal_sub_tiles_match_dense_f64():
    # One 256-query block on the causal diagonal, computed by 128-row sub-tiles (the one
    # above the diagonal skipped), with packed sequences.
    q, k, v, dout = inputs(4, 2, seed=2)
    ids = np.repeat(np.array([0, 1], np.int32), [150, 106])[None].repeat(B, 0)
    blocks = tj.BlockSizes(block_q=256, block_kv=256, block_diagonal=128)

    def splash(q, k, v):
        return tj.splash_attention(
            q, k, v, mask="causal", block_sizes=blocks, segment_ids=(ids, ids)
        )

    def dense(q, k, v):
        return reference.attention(q, k, v, mask="causal", segment_ids=(ids, ids))[0]

    out, grads = forward_and_grads(splash, q, k, v, dout)
    want_out, want_grads = forward_and_grads(dense, q, k, v, dout.astype(np.float64))
    errors = max_errors([out, *grads], [want_out, *want_grads])
    assert max(errors) <= 1e-5, f"out, dq, dk, dv differ from f64 by {errors}"


def test_soft_cap_and_sinks_with_their_gradient():
    q, k, v, dout = inputs(4, 2, seed=1)
    q, k = q * 4, k * 4  # logits beyond the cap
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    blocks = tj.BlockSizes(block_q=128, block_kv=128)

    def splash(q, k, v, sinks):
        return tj.splash_attention(
            q, k, v, mask="causal", block_sizes=blocks, soft_cap=5.0, sinks=sinks
        )

    def dense(q, k, v, sinks):
        return reference.attention(q, k, v, mask="causal", soft_cap=5.0, sinks=sinks)[0]

    out, grads = forward_and_grads(splash, q, k, v, dout, sinks)
    want_out, want_grads = forward_and_grads(dense, q, k, v, dout.astype(np.float64), sinks)
    errors = max_errors([out, *grads], [want_out, *want_grads])
    assert max(errors) <= 1e-5, f"out, dq, dk, dv, dsinks differ from f64 by {errors}"


def test_bf16():
    q, k, v, dout = inputs(4, 2, dtype=jnp.bfloat16, seed=2)
    blocks = tj.BlockSizes(block_q=128, block_kv=128)

    def splash(q, k, v):
        return tj.splash_attention(q, k, v, mask="causal", block_sizes=blocks)

    def dense(q, k, v):
        return reference.attention(q, k, v, mask="causal")[0]

    out, grads = forward_and_grads(splash, q, k, v, dout)
    assert jnp.result_type(jax.eval_shape(splash, q, k, v)) == jnp.bfloat16
    f64 = [x.astype(np.float64) for x in (q, k, v, dout)]
    want_out, want_grads = forward_and_grads(dense, *f64)
    # bf16 outputs and gradients: 8 bits of mantissa.
    errors = max_errors([out, *grads], [want_out, *want_grads])
    assert max(errors) <= 2e-2, f"out, dq, dk, dv differ from f64 by {errors}"


def test_wrong_inputs_are_refused_with_a_sentence():
    q, k, v, _ = inputs(4, 2)
    blocks = tj.BlockSizes()
    with pytest.raises(ValueError, match=r"q must be \[B, heads, S, D\]"):
        tj.splash_attention(q[0], k, v, mask="causal", block_sizes=blocks)
    with pytest.raises(tj.TesseraError, match="bad mask `diagonal`"):
        tj.splash_attention(q, k, v, mask="diagonal", block_sizes=blocks)
    with pytest.raises(tj.TesseraError, match="4 query heads are not divisible by 3"):
        tj.splash_attention(q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1), mask="causal",
                            block_sizes=blocks)
    with pytest.raises(ValueError, match=r"segment_ids q_ids must be \[1, 256\]"):
        tj.splash_attention(q, k, v, mask="causal", block_sizes=blocks,
                            segment_ids=(np.zeros((1, 8), np.int32),) * 2)
