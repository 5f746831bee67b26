"""The MaxText-shaped Ulysses layer (examples/ulysses.py) under jax.shard_map on 4 virtual CPU
devices against tessera splash on one device: outputs and gradients, GQA, segment ids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessera_jax as tj

pytestmark = pytest.mark.usefixtures("x64")
from ulysses import ulysses_attention


def test_ulysses_on_4_devices_equals_one_device():
    assert jax.device_count() == 4, "conftest sets --xla_force_host_platform_device_count=4"
    b, h, kvh, s, d = 1, 8, 4, 256, 64
    rng = np.random.default_rng(0)
    q, k, v, dout = (
        rng.uniform(-1, 1, shape).astype(np.float32)
        for shape in [(b, h, s, d), (b, kvh, s, d), (b, kvh, s, d), (b, h, s, d)]
    )
    ids = np.repeat(np.array([0, 1], np.int32), [160, 96])[None]
    blocks = tj.BlockSizes(block_q=128, block_kv=128)
    mesh = jax.make_mesh((4,), ("context",))

    def sharded(q, k, v):
        return ulysses_attention(
            q, k, v, mesh=mesh, mask="causal", block_sizes=blocks, segment_ids=(ids, ids)
        )

    def single(q, k, v):
        return tj.splash_attention(
            q, k, v, mask="causal", block_sizes=blocks, segment_ids=(ids, ids)
        )

    def forward_and_grads(attention):
        def f(q, k, v):
            out, vjp = jax.vjp(attention, q, k, v)
            return out, vjp(dout)

        return f

    lowered = jax.jit(forward_and_grads(sharded)).lower(q, k, v)
    # q, k, v and out's inverse forward; their transposes backward.
    assert lowered.as_text().count("stablehlo.all_to_all") == 8
    out, grads = lowered.compile()(q, k, v)
    assert len(out.sharding.device_set) == 4
    want_out, want_grads = jax.jit(forward_and_grads(single))(q, k, v)
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (want_out, *want_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, err_msg=name)


def test_a_context_axis_that_does_not_divide_the_heads_is_refused():
    mesh = jax.make_mesh((4,), ("context",))
    q = jnp.zeros((1, 6, 256, 64), jnp.float32)
    with pytest.raises(ValueError, match="6 query and 6 key/value heads"):
        ulysses_attention(q, q, q, mesh=mesh, mask="causal", block_sizes=tj.BlockSizes())
