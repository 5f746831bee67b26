"""Paged attention and the in-kernel all-gather by libtpu's own measure, JAX's beside tessera's
(compile-only, no TPU), at `tessera bench kernels --target`'s sizes.

JAX's Pallas kernels (jax[tpu]==0.12.0.1, its libtpu 0.0.50.1, tessera's default too;
jax.experimental.pallas.ops.tpu `paged_attention` and `all_gather`) are compiled for v5p:2x2x1
with libtpu's dumps on, one process per kernel (libtpu reads its dump flags once, when it
loads), and the dumps are read with `tessera tpu-dump-report`: the reader `tessera compile`
applies to tessera's kernels (tessera::tpu::cost). tessera's kernels are compiled by `tessera bench kernels --target
tpu:v5p:2x2x1` at the same sizes. Prints one line per kernel, JAX's and tessera's figures
side by side, and writes them as JSON to scripts/memory_cost.json.

Sizes: paged attention bf16, 8 sequences of 128 pages of 16 tokens (pool of 1024 pages), 32
query heads, 8 KV heads, head dim 128, 8 pages per compute block; the all-gather of f32
[1024, 1024] shards over the 4 chips (JAX's kernel with its shards in HBM,
`memory_space=pltpu.MemorySpace.HBM`, as tessera's: JAX's default, VMEM, does not fit 16 MiB outputs).
Neither JAX kernel carries a schedule of its conditions, so cycles count every bundle of a
grid step once (tessera's kernels: the same, with their own schedules).

usage: scripts/memory_cost.sh                (makes the venv, builds tessera, runs this)
       python scripts/memory_cost.py --worker DIR paged|paged_megacore|all_gather
                                             (one JAX compile)
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPOLOGY = "v5p:2x2x1"
B, H, KVH, D, PAGE, PER_SEQ, PER_BLOCK = 8, 32, 8, 128, 16, 128, 8
ROWS = 1024


# The tessera binary and libtpu's compile-only environment, as splash's script has them.
from splash_cost import compile_only_env, tessera_bin  # noqa: E402


def worker(out_dir, which):
    """Compiles JAX's kernel `which` with libtpu's dumps in out_dir."""
    os.environ["LIBTPU_INIT_ARGS"] = (
        f"--xla_jf_dump_to={out_dir} --xla_jf_dump_llo_pass_label_regex=final")
    os.environ["XLA_FLAGS"] = f"--xla_dump_to={out_dir}/xla --xla_dump_hlo_as_text"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    topo = topologies.get_topology_desc(topology_name=TOPOLOGY, platform="tpu")
    one = jax.sharding.SingleDeviceSharding(topo.devices[0])
    if which in ("paged", "paged_megacore"):
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
        pool = B * PER_SEQ
        # JAX's default runs every step on one TensorCore; `megacore_mode="batch"` splits the
        # sequences between v5p's two, as tessera's grid does.
        megacore = "batch" if which == "paged_megacore" else None

        def f(q, k, v, lengths, pages):
            return paged_attention(q, k, v, lengths, pages, pages_per_compute_block=PER_BLOCK,
                                   megacore_mode=megacore)

        args = [jax.ShapeDtypeStruct((B, H, D), jnp.bfloat16, sharding=one),
                jax.ShapeDtypeStruct((KVH, pool, PAGE, D), jnp.bfloat16, sharding=one),
                jax.ShapeDtypeStruct((KVH, pool, PAGE, D), jnp.bfloat16, sharding=one),
                jax.ShapeDtypeStruct((B,), jnp.int32, sharding=one),
                jax.ShapeDtypeStruct((B, PER_SEQ), jnp.int32, sharding=one)]
    elif which == "all_gather":
        from jax.experimental.pallas.ops.tpu import all_gather as ag
        mesh = Mesh(np.array(topo.devices[:4]), ("x",))

        def f(x):
            return ag.all_gather(x, mesh=mesh, axis_name="x", memory_space=pltpu.MemorySpace.HBM)

        args = [jax.ShapeDtypeStruct((4 * ROWS, ROWS), jnp.float32,
                                     sharding=NamedSharding(mesh, PartitionSpec("x")))]
    else:
        sys.exit(__doc__)
    jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",)).compile()


def jax_costs(which):
    with tempfile.TemporaryDirectory(prefix="memory-cost-jax-") as d:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", d, which],
                           capture_output=True, text=True, env=compile_only_env())
        if p.returncode != 0:
            sys.exit(f"JAX's {which} did not compile: {p.stderr.strip()[-2000:]}")
        report = subprocess.run(
            [tessera_bin(), "tpu-dump-report", d, "--target", f"tpu:{TOPOLOGY}"],
            capture_output=True, text=True)
        if report.returncode != 0:
            sys.exit(f"tessera tpu-dump-report failed: {report.stderr.strip()}")
        return json.loads(report.stdout.strip().splitlines()[-1])["kernel_costs"]


def tessera_costs():
    p = subprocess.run(
        [tessera_bin(), "bench", "kernels", "--target", f"tpu:{TOPOLOGY}",
         "--kv-pages", str(PER_SEQ), "--collective-size", str(ROWS)],
        capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tessera bench kernels --target failed: {p.stderr.strip()}")
    return json.loads(p.stdout.strip().splitlines()[-1])["kernel_costs"]


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3])
    ours = {c["kernel"]: c for c in tessera_costs()}
    rows = {}
    for name, jax_kernels in [("paged_attention", [("jax", "paged"),
                                                   ("jax_megacore_batch", "paged_megacore")]),
                              ("all_gather", [("jax", "all_gather")])]:
        rows[name] = {impl: jax_costs(which) for impl, which in jax_kernels}
        rows[name]["tessera"] = ours.get(name)
        for impl, costs in [(impl, rows[name][impl]) for impl, _ in jax_kernels] + [
                ("tessera", [ours.get(name)])]:
            for c in costs:
                if c is None:
                    sys.exit(f"tessera compiled no kernel named {name}")
                vmem = c.get("scoped_vmem_bytes")
                print(f"{name:<16} {impl:<18} {c['kernel']:<24} cycles/core "
                      f"{c['cycles_per_core']:>10} all cores {c['cycles_all_cores']:>10} "
                      f"scoped VMEM {'?' if vmem is None else f'{vmem / 2**20:.2f} MiB'}")
    with open(os.path.join(ROOT, "scripts", "memory_cost.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
