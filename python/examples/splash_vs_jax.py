"""tessera's splash attention beside JAX's own (Pallas) splash attention, each as the forward
and backward of one JAX function, compiled by the same libtpu for a TPU topology on a
machine without a TPU: per-device temporaries, the scoped VMEM the compiler gave each kernel,
and compile seconds.

    python examples/splash_vs_jax.py [--topology v5p:2x2x1] [--heads 8] [--seq-len 4096]
        [--head-dim 128] [--blocks 512 1024]

The table in python/README.md is this script's output (bf16, causal, one device of the topology).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp

import tessera_jax as tj


@dataclasses.dataclass
class Compiled:
    """What the compiler made of one function."""

    name: str
    block: int
    temp_bytes: int
    argument_bytes: int
    output_bytes: int
    kernel_vmem: list[tuple[str, int]]
    # Tracing and lowering to StableHLO (tessera's kernels lowered to Mosaic here).
    lower_seconds: float
    # libtpu's compile of the lowered program.
    compile_seconds: float


def tessera_attention(block: int):
    blocks = tj.BlockSizes(block_q=block, block_kv=block)
    return lambda q, k, v: tj.splash_attention(q, k, v, mask="causal", block_sizes=blocks)


def jax_attention(block: int, heads: int, seq_len: int):
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel,
        splash_attention_mask as mask,
    )

    heads_mask = mask.MultiHeadMask([mask.CausalMask((seq_len, seq_len))] * heads)
    blocks = kernel.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    splash = kernel.make_splash_mha(heads_mask, head_shards=1, q_seq_shards=1, block_sizes=blocks)
    # JAX's kernel takes one sequence [H, S, D]; the batch is a vmap.
    return jax.vmap(splash)


def forward_backward(attention):
    """`q, k, v, dout -> out, dq, dk, dv`: the attention and its VJP in one function."""

    def f(q, k, v, dout):
        out, vjp = jax.vjp(attention, q, k, v)
        return (out, *vjp(dout))

    return f


def compile_for(f, args, name: str, block: int) -> Compiled:
    start = time.perf_counter()
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",))
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    memory = compiled.memory_analysis()
    return Compiled(
        name=name,
        block=block,
        temp_bytes=memory.temp_size_in_bytes,
        argument_bytes=memory.argument_size_in_bytes,
        output_bytes=memory.output_size_in_bytes,
        kernel_vmem=tj.compiled_kernel_vmem(compiled),
        lower_seconds=lowered_at - start,
        compile_seconds=compiled_at - lowered_at,
    )


def compare(
    *,
    topology: str = "v5p:2x2x1",
    heads: int = 8,
    seq_len: int = 4096,
    head_dim: int = 128,
    blocks=(512, 1024),
    dtype=jnp.bfloat16,
) -> list[Compiled]:
    """Compiles tessera's and JAX's splash forward + backward (B=1, causal) for one device of
    `topology` at each block size (block_q = block_kv = every backward block)."""
    tj.use_tessera_libtpu()
    from jax.experimental import topologies

    device = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    shape = (1, heads, seq_len, head_dim)
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)] * 4
    rows = []
    for block in blocks:
        rows.append(compile_for(forward_backward(tessera_attention(block)), args, "tessera", block))
        rows.append(
            compile_for(
                forward_backward(jax_attention(block, heads, seq_len)), args, "jax", block
            )
        )
    return rows


def table(rows: list[Compiled]) -> str:
    """The rows as a Markdown table (MiB)."""
    mib = 1 << 20
    lines = [
        "| splash | blocks | temp MiB | kernel scoped VMEM MiB | lower s | compile s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        vmem = ", ".join(f"{name} {size / mib:.2f}" for name, size in r.kernel_vmem)
        lines.append(
            f"| {r.name} | {r.block}/{r.block} | {r.temp_bytes / mib:.2f} | {vmem} | "
            f"{r.lower_seconds:.1f} | {r.compile_seconds:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", default="v5p:2x2x1")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--blocks", type=int, nargs="+", default=[512, 1024])
    a = parser.parse_args()
    rows = compare(
        topology=a.topology,
        heads=a.heads,
        seq_len=a.seq_len,
        head_dim=a.head_dim,
        blocks=a.blocks,
    )
    print(
        f"{a.topology}, bf16, B=1 H={a.heads} S={a.seq_len} D={a.head_dim}, causal, "
        "forward + dq + dkv"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
