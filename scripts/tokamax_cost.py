"""tokamax 0.0.17's splash forward with its causal-diagonal skip, by libtpu's own measure
(compile-only, no TPU), in the rows scripts/splash_cost.py writes for JAX's and tessera's:
without residuals (what a caller runs without a backward) and with them (`save_residuals`:
the lse a training step's backward takes, `splash_mha_fwd_residuals`).

tokamax (the kernel library MaxText's splash comes from) cuts the diagonal block of a causal
mask into a `qk_diag_grid` x `qk_diag_grid` grid and skips the QK (`qk_diag_skip`) and SV
(`sv_diag_skip`) matmuls of the sub-tiles above the diagonal (its softmax still runs over the
whole tile); it takes a base-2 exponent (`use_base2_exp`, its default) and walks a grid
compacted to the non-empty blocks. This script compiles its forward (v5p, bf16, causal, MHA
H=8 and GQA H=8/KVH=2, D=128, S 4096 and 8192, square blocks 512, 1024 and 2048, the skip on
at grids 2 and 4) with libtpu's dumps on, one process per configuration, and reads the dumps
with `tessera tpu-dump-report`, the reader `tessera compile` applies to tessera's kernels. Its
kernel's four `when`s (init at a row's first active block, the unmasked and the masked block,
the end at a row's last) get their runs from tokamax's own block tables (MaskInfo: block_mask,
active_rows; its `bounds_start`/`bounds_end` mark a row's first and last active block).

Writes scripts/tokamax_cost.tsv (splash_cost.py's columns; `impl` is `tokamax-grid2` or
`tokamax-grid4`; pass `fwd` without residuals, `bwd` with them, as the forward of
splash_cost.py's backward rows). tessera's forward at the same configurations is in
scripts/splash_cost.tessera.tsv (pass `fwd` without its lse, `bwd` and `fused` with it).

usage: scripts/tokamax_cost.sh [--residuals]   (makes the venv, builds tessera, runs this;
                                                --residuals: only the rows with residuals,
                                                added to the TSV's)
       python scripts/tokamax_cost.py --worker DIR KVH S BLOCK GRID RESIDUALS   (one compile)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import splash_cost as sc  # noqa: E402  (the shared columns, rows and environment)

GRIDS = (2, 4)
CONFIGS = [(kvh, s, b) for kvh in (8, 2) for s in (4096, 8192) for b in (512, 1024, 2048)]
OUT = os.path.join(sc.ROOT, "scripts", "tokamax_cost.tsv")


def worker(out_dir, kv_heads, seq, block, grid, residuals):
    """Compiles tokamax's forward for one configuration with libtpu's dumps in out_dir; writes
    out_dir/schedules.json and out_dir/program.json."""
    flags = [f"--xla_jf_dump_to={out_dir}", "--xla_jf_dump_llo_pass_label_regex=final",
             "--xla_tpu_scoped_vmem_limit_kib=65536"]
    os.environ["LIBTPU_INIT_ARGS"] = " ".join(flags)
    # XLA's own dumps give the kernel's scoped VMEM.
    os.environ["XLA_FLAGS"] = f"--xla_dump_to={out_dir}/xla --xla_dump_hlo_as_text"
    for k, v in sc.compile_only_env().items():
        os.environ.setdefault(k, v)
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from tokamax._src.ops.experimental.tpu.splash_attention import (
        splash_attention_kernel as splash,
        splash_attention_mask as mask_lib,
    )

    topo = topologies.get_topology_desc(topology_name=sc.TOPOLOGY, platform="tpu")
    one = jax.sharding.SingleDeviceSharding(topo.devices[0])
    config = splash.SplashConfig(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        qk_diag_skip=True, sv_diag_skip=True, qk_diag_grid=grid,
    )
    kernel = splash.make_splash_mha_single_device(
        mask_lib.CausalMask((seq, seq)), config=config, save_residuals=residuals)
    heads = sc.HEADS
    q = jax.ShapeDtypeStruct((heads, seq, sc.D), jnp.bfloat16, sharding=one)
    kv = jax.ShapeDtypeStruct((kv_heads, seq, sc.D), jnp.bfloat16, sharding=one)
    compiled = jax.jit(kernel).trace(q, kv, kv).lower(lowering_platforms=("tpu",)).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes

    info = kernel.fwd_mask_info
    block_mask = np.asarray(info.block_mask).reshape(-1)
    rows = np.asarray(info.active_rows).reshape(-1)
    active = int(np.asarray(info.num_active_blocks).reshape(-1)[0])
    block_mask, rows = block_mask[:active], rows[:active]
    # A row's first and last active block start and end it (tokamax's bounds).
    starts = int(np.sum(np.r_[True, rows[1:] != rows[:-1]]))
    per_head = [starts, int(np.sum(block_mask == 2)), int(np.sum(block_mask == 1)), starts]
    names = ["init", "run unmasked", "run masked", "end"]
    schedule = {
        "kernel": kernel_name(out_dir), "grid": [heads, active],
        "dimension_semantics": ["parallel", "arbitrary"],
        "paths": [{"path": n, "runs": [r] * heads} for n, r in zip(names, per_head)],
    }
    with open(os.path.join(out_dir, "schedules.json"), "w") as fh:
        json.dump([schedule], fh)
    with open(os.path.join(out_dir, "program.json"), "w") as fh:
        json.dump({"temp_bytes": int(temp)}, fh)


def kernel_name(out_dir):
    """The name libtpu dumped tokamax's forward kernel under (`tessera tpu-dump-report`
    without schedules lists it)."""
    p = subprocess.run([sc.tessera_bin(), "tpu-dump-report", out_dir, "--target",
                        f"tpu:{sc.TOPOLOGY}"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tessera tpu-dump-report failed: {p.stderr.strip()}")
    costs = json.loads(p.stdout.strip().splitlines()[-1])["kernel_costs"]
    if len(costs) != 1:
        sys.exit(f"expected one Mosaic kernel in {out_dir}, found {[c['kernel'] for c in costs]}")
    return costs[0]["kernel"]


def tokamax_rows(kv_heads, seq, block, grid, residuals):
    with tempfile.TemporaryDirectory(prefix="tokamax-cost-") as d:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", d, str(kv_heads), str(seq),
               str(block), str(grid), str(int(residuals))]
        p = subprocess.run(cmd, capture_output=True, text=True, env=sc.compile_only_env())
        if p.returncode != 0:
            print(f"  tokamax KVH={kv_heads} S={seq} B={block} grid={grid}: failed: "
                  f"{(p.stderr.strip().splitlines() or ['?'])[-1][:300]}", file=sys.stderr)
            return []
        costs, temp = sc.read_worker_dumps(d)
        pass_ = "bwd" if residuals else "fwd"
        rows = [sc.row(f"tokamax-grid{grid}", pass_, kv_heads, seq, block, c, temp, 65536)
                for c in costs]
        for r in rows:
            r["role"] = "fwd"
        return rows


def main():
    if sys.argv[1:] not in ([], ["--residuals"]):
        sys.exit(f"usage: {sys.argv[0]} [--residuals] (got {' '.join(sys.argv[1:])})")
    only_residuals = sys.argv[1:] == ["--residuals"]
    # --residuals keeps the rows without residuals and measures the others again.
    kept = [r for r in sc.read_tsv(OUT) if r["pass"] == "fwd"] if only_residuals else []
    if os.path.exists(OUT):
        os.remove(OUT)
    sc.append_tsv(OUT, kept)
    for residuals in ((True,) if only_residuals else (False, True)):
        for i, (kvh, seq, block) in enumerate(CONFIGS):
            for grid in GRIDS:
                print(f"[{i + 1}/{len(CONFIGS)}] tokamax fwd KVH={kvh} S={seq} block={block} "
                      f"grid={grid} residuals={residuals}", file=sys.stderr, flush=True)
                sc.append_tsv(OUT, tokamax_rows(kvh, seq, block, grid, residuals))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        d, kvh, s, b, g, res = sys.argv[2:8]
        worker(d, int(kvh), int(s), int(b), int(g), bool(int(res)))
    else:
        main()
