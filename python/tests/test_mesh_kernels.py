"""Kernels on a device mesh (remote copies, semaphores across devices) called from JAX inside
jax.shard_map on 4 virtual CPU devices, against numpy and tessera's interpreter; their TPU
lowering (a Mosaic call per device, collective ids numbered per program) compiled by libtpu
for v5p:2x2x1."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import tessera_jax as tj

DEVICES = 4


def mesh():
    assert jax.device_count() == DEVICES, "conftest sets --xla_force_host_platform_device_count=4"
    return Mesh(np.array(jax.devices()), ("context",))


def shards():
    """Device d's [8, 128] f32 block is filled with d + a small ramp."""
    ramp = np.arange(8 * 128, dtype=np.float32).reshape(8, 128) / 1024
    return [ramp + d for d in range(DEVICES)]


def on_mesh(kernel, out_rows):
    """`kernel` called on each device's [8, 128] block of a [32, 128] array inside shard_map;
    each device's output is its `out_rows` rows of the result."""
    def body(x):
        return tj.call(kernel, x)[0]

    f = jax.shard_map(body, mesh=mesh(), in_specs=P("context"), out_specs=P("context"))
    out = jax.jit(f)(jnp.asarray(np.concatenate(shards())))
    return np.asarray(out).reshape(DEVICES, out_rows, 128)


def test_ring_shift_under_shard_map_sends_each_block_to_the_next_device():
    k = tj.kernel("ring_shift", {"devices": DEVICES})
    assert k.devices == DEVICES and k.mesh == [("context", DEVICES)]
    got = on_mesh(k, 8)
    x = shards()
    for d in range(DEVICES):
        np.testing.assert_array_equal(got[d], x[(d - 1) % DEVICES])
    # tessera's interpreter agrees.
    ref = tj.run_reference_on_devices(k, [[s] for s in x])
    for d in range(DEVICES):
        np.testing.assert_array_equal(ref[d][0], got[d])


def test_ring_all_gather_under_shard_map_gives_every_device_every_block():
    k = tj.kernel("ring_all_gather", {"devices": DEVICES})
    got = on_mesh(k, 8 * DEVICES)
    whole = np.concatenate(shards())
    for d in range(DEVICES):
        np.testing.assert_array_equal(got[d], whole)


def test_all_to_all_under_shard_map_is_jax_all_to_all():
    # Each device's [32, 128] block is 4 chunks of 8 rows; device d gets chunk d of every
    # device's block, in device order: jax.lax.all_to_all on dim 0 inside the same shard_map.
    k = tj.kernel("all_to_all", {"devices": DEVICES, "R": 32})
    x = np.concatenate([
        np.arange(32 * 128, dtype=np.float32).reshape(32, 128) / 4096 + d for d in range(DEVICES)
    ])

    def run(body):
        f = jax.shard_map(body, mesh=mesh(), in_specs=P("context"), out_specs=P("context"))
        return np.asarray(jax.jit(f)(jnp.asarray(x))).reshape(DEVICES, 32, 128)

    got = run(lambda b: tj.call(k, b)[0])
    want = run(lambda b: jax.lax.all_to_all(b, "context", 0, 0, tiled=True))
    np.testing.assert_array_equal(got, want)
    blocks = x.reshape(DEVICES, DEVICES, 8, 128)
    for d in range(DEVICES):
        np.testing.assert_array_equal(got[d], blocks[:, d].reshape(32, 128))


def test_fused_ulysses_attention_under_shard_map_is_causal_attention_of_the_whole_sequence():
    # q, k, v [H, S, D] split over the sequence (each device 32 rows of all 8 heads); the
    # kernel exchanges heads inside itself and returns each device's rows of the output.
    k = tj.kernel("ulysses_attention", {"devices": DEVICES, "H": 8, "SL": 32, "D": 128})
    rng = np.random.default_rng(0)
    q, kk, v = (rng.uniform(-1, 1, (8, 32 * DEVICES, 128)).astype(np.float32) for _ in range(3))
    spec = P(None, "context")
    f = jax.shard_map(
        lambda q, k_, v: tj.call(k, q, k_, v)[0],
        mesh=mesh(),
        in_specs=(spec, spec, spec),
        out_specs=spec,
    )
    got = np.asarray(jax.jit(f)(q, kk, v), np.float64)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, kk, v))
    scores = np.einsum("hqd,hkd->hqk", q64, k64) / np.sqrt(128)
    s = scores.shape[-1]
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("hqk,hkd->hqd", p / p.sum(-1, keepdims=True), v64)
    assert np.abs(got - want).max() <= 1e-5


def test_a_mesh_kernel_outside_shard_map_or_on_another_mesh_is_refused():
    k = tj.kernel("ring_shift", {"devices": DEVICES})
    x = jnp.asarray(shards()[0])
    with pytest.raises(NotImplementedError, match="inside jax.shard_map over every axis"):
        jax.jit(lambda x: tj.call(k, x)[0])(x)
    two = tj.kernel("ring_shift", {"devices": 2})
    f = jax.shard_map(
        lambda x: tj.call(two, x)[0], mesh=mesh(), in_specs=P("context"), out_specs=P("context")
    )
    with pytest.raises(NotImplementedError, match="instantiate it with devices=4"):
        jax.jit(f)(jnp.asarray(np.concatenate(shards())))
    with pytest.raises(tj.TesseraError, match="run_on_devices"):
        tj.run_reference(k, shards()[0])


def test_the_tpu_lowering_numbers_the_collective_ids_and_libtpu_compiles_it():
    tj.use_tessera_libtpu()
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(topology_name="v5p:2x2x1", platform="tpu").devices
    tpu_mesh = Mesh(np.array(devices), ("context",))
    shift = tj.kernel("ring_shift", {"devices": DEVICES})
    gather = tj.kernel("ring_all_gather", {"devices": DEVICES})

    def body(x):
        shifted = tj.call(shift, x)[0]
        return tj.call(gather, shifted)[0], tj.call(shift, shifted)[0]

    f = jax.shard_map(
        body, mesh=tpu_mesh, in_specs=P("context"), out_specs=(P("context"), P("context"))
    )
    spec = jax.ShapeDtypeStruct(
        (8 * DEVICES, 128), jnp.float32, sharding=jax.sharding.NamedSharding(tpu_mesh, P("context"))
    )
    lowered = jax.jit(f).trace(spec).lower(lowering_platforms=("tpu",))
    configs = re.findall(r'backend_config = "((?:[^"\\]|\\.)*)"', lowered.as_text())
    calls = [
        json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), c))
        for c in configs
    ]
    ids = [c["custom_call_config"]["collective_id"] for c in calls]
    assert sorted(ids) == [0, 0, 1], ids
    assert all(c["custom_call_config"]["has_communication"] for c in calls)
    lowered.compile()
