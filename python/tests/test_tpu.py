"""Compile-only for TPU through JAX alone: functions using tessera's splash (forward and
backward) lowered with `lowering_platforms=("tpu",)` and compiled by libtpu (the one tessera
pins) for a v5p:2x2x1 topology, on a machine without a TPU; the compiled memory and each
kernel's scoped VMEM read back; JAX's own splash compiled in the same run, printed beside
tessera's. Small shapes: python/README.md's table is examples/splash_vs_jax.py at full size."""

import base64
import json
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import splash_vs_jax
import tessera_jax as tj
from ulysses import ulysses_attention

TOPOLOGY = "v5p:2x2x1"
# tessera's splash forward and backward kernels (the compiler orders them as it likes).
KERNELS = sorted(["splash_fwd", "splash_bwd_prep", "splash_dkv", "splash_dq"])


@pytest.fixture(scope="module")
def devices():
    tj.use_tessera_libtpu()
    from jax.experimental import topologies

    return topologies.get_topology_desc(topology_name=TOPOLOGY, platform="tpu").devices


def mosaic_calls(lowered_text):
    """The backend configs of the program's `tpu_custom_call`s."""
    configs = re.findall(r'backend_config = "((?:[^"\\]|\\.)*)"', lowered_text)
    return [json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), c))
            for c in configs]


def test_tessera_splash_beside_jax_splash_on_v5p(devices):
    rows = splash_vs_jax.compare(topology=TOPOLOGY, heads=2, seq_len=1024, blocks=(512,))
    print(f"\n{TOPOLOGY}, bf16, B=1 H=2 S=1024 D=128, causal, forward + dq + dkv")
    print(splash_vs_jax.table(rows))
    tessera, ours_jax = rows
    assert sorted(name for name, _ in tessera.kernel_vmem) == KERNELS
    assert len(ours_jax.kernel_vmem) == 3  # JAX's forward, dq and dkv kernels
    for r in rows:
        assert all(size > 0 for _, size in r.kernel_vmem), r
        assert r.argument_bytes == 4 * 2 * 1024 * 128 * 2  # q, k, v, dout in bf16
        assert r.output_bytes >= r.argument_bytes
    # JAX's backward keeps a lane-padded logsumexp; tessera's lse/di rows need none here.
    assert ours_jax.temp_bytes > 0
    assert tessera.temp_bytes <= ours_jax.temp_bytes


def test_the_tpu_lowering_is_tesseras_mosaic_call(devices):
    device = jax.sharding.SingleDeviceSharding(devices[0])
    spec = jax.ShapeDtypeStruct((1, 2, 1024, 128), jnp.bfloat16, sharding=device)
    blocks = tj.BlockSizes(block_q=512, block_kv=512)
    f = splash_vs_jax.forward_backward(
        lambda q, k, v: tj.splash_attention(q, k, v, mask="causal", block_sizes=blocks)
    )
    lowered = jax.jit(f).trace(spec, spec, spec, spec).lower(lowering_platforms=("tpu",))
    calls = mosaic_calls(lowered.as_text())
    bodies = [base64.b64decode(c["custom_call_config"]["body"]).decode() for c in calls]
    names = [re.search(r"func\.func @(\w+)\(", b).group(1) for b in bodies]
    assert names == ["splash_fwd", "splash_bwd_prep", "splash_dkv", "splash_dq"]
    plan = tj.splash._plan(
        (1, 2, 1024, 128), (1, 2, 1024, 128), (1, 2, 1024, 128), "bf16", "causal", blocks,
        False, False, None, None,
    )
    want = [k.mosaic()["backend_config"] for k in tj.splash.plan_kernels(plan)]
    assert [json.loads(w) for w in want] == calls
    # A kernel the TPU rules refuse stops the lowering with tessera's sentence.
    bad = tj.BlockSizes(block_q=512, block_kv=64)
    with pytest.raises(tj.TesseraError, match="128"):
        jax.jit(
            lambda q, k, v: tj.splash_attention(q, k, v, mask="causal", block_sizes=bad)
        ).trace(spec, spec, spec).lower(lowering_platforms=("tpu",))


def test_an_aliased_kernel_output_is_its_inputs_buffer_on_tpu(devices):
    k = tj.kernel("cache_update", {"dtype": "bf16", "N": 3, "R": 64, "C": 128})
    device = jax.sharding.SingleDeviceSharding(devices[0])
    slots = jax.ShapeDtypeStruct((3,), jnp.int32, sharding=device)
    cache = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16, sharding=device)
    new = jax.ShapeDtypeStruct((48, 128), jnp.bfloat16, sharding=device)  # 3 blocks of 16
    # `out` is `cache`'s buffer; the check flags (output 1: the index map reads the slots, so
    # the block index is checked at run time) alias their zeros, the call's last operand.
    assert k.mosaic()["output_operand_aliases"] == [(0, 1), (1, 3)]
    lowered = jax.jit(lambda s, c, n: tj.call(k, s, c, n)[0]).trace(slots, cache, new).lower(
        lowering_platforms=("tpu",)
    )
    assert "output_operand_aliases" in lowered.as_text()
    lowered.compile()


def test_ulysses_layer_compiles_for_4_chips(devices):
    mesh = jax.sharding.Mesh(devices[:4], ("context",))
    seq = NamedSharding(mesh, P(None, None, "context", None))
    spec = jax.ShapeDtypeStruct((1, 8, 2048, 128), jnp.bfloat16, sharding=seq)
    blocks = tj.BlockSizes(block_q=512, block_kv=512)
    f = splash_vs_jax.forward_backward(
        lambda q, k, v: ulysses_attention(q, k, v, mesh=mesh, mask="causal", block_sizes=blocks)
    )
    compiled = jax.jit(f).trace(spec, spec, spec, spec).lower(lowering_platforms=("tpu",)).compile()
    memory = compiled.memory_analysis()
    vmem = tj.compiled_kernel_vmem(compiled)
    print(f"\nUlysses on {TOPOLOGY} (4 chips), bf16 B=1 H=8 S=2048 D=128 causal, per device: "
          f"arguments {memory.argument_size_in_bytes}, temporaries {memory.temp_size_in_bytes} "
          f"bytes; scoped VMEM {vmem}")
    # Per device: a quarter of the sequence of q, k, v and dout.
    assert memory.argument_size_in_bytes == 4 * 8 * 512 * 128 * 2
    assert sorted(n for n, _ in vmem) == KERNELS
    assert all(size > 0 for _, size in vmem)
    assert compiled.as_text().count("all-to-all-start") + compiled.as_text().count(
        "all-to-all(") >= 8


def test_a_kernel_outside_shard_map_in_a_partitioned_program_is_refused(devices):
    mesh = jax.sharding.Mesh(devices[:4], ("context",))
    seq = NamedSharding(mesh, P(None, None, "context", None))
    spec = jax.ShapeDtypeStruct((1, 8, 2048, 128), jnp.bfloat16, sharding=seq)
    blocks = tj.BlockSizes(block_q=512, block_kv=512)
    with pytest.raises(NotImplementedError, match="call it inside jax.shard_map"):
        jax.jit(
            lambda q, k, v: tj.splash_attention(q, k, v, mask="causal", block_sizes=blocks)
        ).trace(spec, spec, spec).lower(lowering_platforms=("tpu",))
