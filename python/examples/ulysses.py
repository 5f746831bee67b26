"""Ulysses context parallelism with tessera's splash attention, shaped as MaxText's
(`context_parallel_strategy="ulysses"`): q, k, v `[B, H, S, D]` with the sequence sharded over
the mesh's `context` axis; inside `jax.shard_map`, an `all_to_all` trades the sequence shard
for a head shard (`[B, H, S/U, D]` -> `[B, H/U, S, D]`), each device runs tessera's splash
attention on its heads over the whole sequence, and the inverse `all_to_all` brings the
output back to sequence shards. Differentiable: `jax.grad` runs tessera's backward kernels
and the transposed all-to-alls.

    python examples/ulysses.py    # 4 virtual CPU devices against one device
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import tessera_jax as tj


def ulysses_all_to_all(x, axis: str):
    """`[B, H, S/U, D]` -> `[B, H/U, S, D]` over mesh axis `axis` (U devices)."""
    return jax.lax.all_to_all(x, axis, split_axis=1, concat_axis=2, tiled=True)


def inverse_ulysses_all_to_all(x, axis: str):
    """`[B, H/U, S, D]` -> `[B, H, S/U, D]`."""
    return jax.lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)


def with_layout(x, mesh: jax.sharding.Mesh, spec: P):
    """`x` laid out as `spec` on `mesh`: resharded on a mesh of explicit axes (where the
    layout is part of the type, `jax.make_mesh`'s default), constrained on one of automatic
    axes (MaxText's)."""
    sharding = NamedSharding(mesh, spec)
    if all(t == AxisType.Explicit for t in mesh.axis_types):
        return jax.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


def ulysses_attention(
    q,
    k,
    v,
    *,
    mesh: jax.sharding.Mesh,
    mask: str,
    block_sizes: tj.BlockSizes,
    segment_ids=None,
    axis: str = "context",
):
    """Splash attention of `q [B, H, S, D]`, `k`, `v [B, KVH, S, D]` sequence-sharded over
    `mesh`'s `axis` (U devices; U must divide H and KVH), returning `out [B, H, S, D]` sharded
    the same way. `segment_ids`: `(q_ids, kv_ids)`, each `[B, S]` int32 sequence-sharded (each
    device all-gathers them: it attends over the whole sequence)."""
    devices = mesh.shape[axis]
    heads, kv_heads = jnp.shape(q)[1], jnp.shape(k)[1]
    if heads % devices or kv_heads % devices:
        raise ValueError(
            f"Ulysses splits the heads over the {devices} devices of `{axis}`, but there are "
            f"{heads} query and {kv_heads} key/value heads; use a context axis that divides both"
        )
    seq = P(None, None, axis, None)
    ids_spec = P(None, axis)
    # The layer's layout (a no-op where the inputs already have it, as in MaxText).
    q, k, v = (with_layout(x, mesh, seq) for x in (q, k, v))

    def attend(q, k, v, ids):
        q, k, v = (ulysses_all_to_all(x, axis) for x in (q, k, v))
        if ids is not None:
            ids = tuple(jax.lax.all_gather(i, axis, axis=1, tiled=True) for i in ids)
        out = tj.splash_attention(
            q, k, v, mask=mask, block_sizes=block_sizes, segment_ids=ids
        )
        return inverse_ulysses_all_to_all(out, axis)

    if segment_ids is None:
        local = jax.shard_map(
            lambda q, k, v: attend(q, k, v, None),
            mesh=mesh,
            in_specs=(seq, seq, seq),
            out_specs=seq,
        )
        return local(q, k, v)
    ids = tuple(with_layout(i, mesh, ids_spec) for i in segment_ids)
    local = jax.shard_map(
        attend, mesh=mesh, in_specs=(seq, seq, seq, (ids_spec, ids_spec)), out_specs=seq
    )
    return local(q, k, v, ids)


def main() -> None:
    import numpy as np

    b, h, kvh, s, d = 1, 8, 4, 512, 64
    rng = np.random.default_rng(0)
    q = rng.uniform(-1, 1, (b, h, s, d)).astype(np.float32)
    k = rng.uniform(-1, 1, (b, kvh, s, d)).astype(np.float32)
    v = rng.uniform(-1, 1, (b, kvh, s, d)).astype(np.float32)
    dout = rng.uniform(-1, 1, (b, h, s, d)).astype(np.float32)
    blocks = tj.BlockSizes(block_q=128, block_kv=128)
    mesh = jax.make_mesh((4,), ("context",), devices=jax.devices()[:4])

    def loss(attention):
        return lambda q, k, v: jnp.sum(attention(q, k, v) * dout)

    def sharded(q, k, v):
        return ulysses_attention(q, k, v, mesh=mesh, mask="causal", block_sizes=blocks)

    def single(q, k, v):
        return tj.splash_attention(q, k, v, mask="causal", block_sizes=blocks)

    results = []
    for attention in (sharded, single):
        out = jax.jit(attention)(q, k, v)
        grads = jax.jit(jax.grad(loss(attention), argnums=(0, 1, 2)))(q, k, v)
        results.append([np.asarray(x) for x in (out, *grads)])
    for name, a, c in zip(("out", "dq", "dk", "dv"), *results):
        print(f"{name}: 4 devices vs 1 device, max |difference| {np.abs(a - c).max():.3g}")


if __name__ == "__main__":
    # Before JAX creates its CPU backend (on first use, not at import).
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    )
    main()
