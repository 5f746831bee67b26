"""tokamax 0.0.17's splash by libtpu's own measure (compile-only, no TPU), in the rows
scripts/splash_cost.py writes for JAX's and tessera's: its forward without residuals (what a
caller runs without a backward) and with them (`save_residuals`: the lse a training step's
backward takes, `splash_mha_fwd_residuals`), and its fused backward (the VJP of its forward,
as a training step runs it: the forward with residuals and its fused dK/dV kernel, which also
writes the dQ partials).

tokamax (the kernel library MaxText's splash comes from: MaxText 0.2.5 calls it when
`use_tokamax_splash` is set, with a fused backward, its dQ partials reduced over 3 steps,
base-2 exponent and the reciprocal in the kernel) cuts the diagonal block of a causal mask
into a `qk_diag_grid` x `qk_diag_grid` grid and skips the QK (`qk_diag_skip`) and SV
(`sv_diag_skip`) matmuls of the sub-tiles above the diagonal (its softmax still runs over the
whole tile); it takes a base-2 exponent (`use_base2_exp`, its default) and walks a grid
compacted to the non-empty blocks. This script compiles it (v5p, bf16, causal, MHA H=8 and
GQA H=8/KVH=2, D=128, S 4096 and 8192, square blocks 512, 1024 and 2048, the skip on at grids
2 and 4; the fused backward also without it, as MaxText 0.2.5 calls it) with libtpu's dumps
on, one process per configuration, and reads the dumps with `tessera tpu-dump-report`, the
reader `tessera compile` applies to tessera's kernels. The `when`s get their runs from
tokamax's own block tables (MaskInfo: block_mask, active_rows; its `bounds_start` /
`bounds_end` mark a row's first and last active block): the forward's four (init at a row's
first active block, the unmasked and the masked block, the end at a row's last), and the
dK/dV kernel's, whose rows are key blocks: the same four, the end split in two under GQA
where the group's later heads add to the first's dK/dV. The dK/dV kernel runs on one
TensorCore (its grid is all `arbitrary`). Its XLA ops (`di`, the dQ partials' sum) are not
measured.

Writes scripts/tokamax_cost.tsv (splash_cost.py's columns; `impl` is `tokamax-grid2` or
`tokamax-grid4`, or `tokamax-maxtext` without the skip; pass `fwd` without residuals, `bwd`
with them, as the forward of splash_cost.py's backward rows, and `fused` for the fused
backward's program, roles `fwd` and `dkv`). tessera's kernels at the same configurations are
in scripts/splash_cost.tessera.tsv.

usage: scripts/tokamax_cost.sh [--residuals | --fused]   (makes the venv, builds tessera,
                                 runs this; --residuals or --fused: only those rows, the
                                 TSV's others kept)
       python scripts/tokamax_cost.py --worker DIR KVH S BLOCK GRID MODE   (one compile; MODE
                                 fwd, residuals or fused; GRID 0: no diagonal skip)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import splash_cost as sc  # noqa: E402  (the shared columns, rows and environment)

GRIDS = (2, 4)
# The fused backward also without the skip (grid 0), as MaxText 0.2.5 calls it.
FUSED_GRIDS = (0, 2, 4)
CONFIGS = [(kvh, s, b) for kvh in (8, 2) for s in (4096, 8192) for b in (512, 1024, 2048)]
OUT = os.path.join(sc.ROOT, "scripts", "tokamax_cost.tsv")


def worker(out_dir, kv_heads, seq, block, grid, mode):
    """Compiles tokamax's splash for one configuration with libtpu's dumps in out_dir: its
    forward (`mode` fwd: without residuals; residuals: with them), or its forward with
    residuals and fused backward (`mode` fused: the VJP, as a training step runs it). Writes
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
    # The backward as MaxText 0.2.5 configures it at the seed's settings (fused, its dq
    # partials reduced over 3 steps, base-2 exponent, the reciprocal in the kernel), with the
    # diagonal skip at grid 2 or 4, or without it (`grid` 0: MaxText's own configuration).
    config = splash.SplashConfig(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        use_fused_bwd_kernel=True, dq_reduction_steps=3,
        qk_diag_skip=grid > 0, sv_diag_skip=grid > 0, qk_diag_grid=max(grid, 2),
    )
    kernel = splash.make_splash_mha_single_device(
        mask_lib.CausalMask((seq, seq)), config=config, save_residuals=mode == "residuals")
    heads = sc.HEADS
    q = jax.ShapeDtypeStruct((heads, seq, sc.D), jnp.bfloat16, sharding=one)
    kv = jax.ShapeDtypeStruct((kv_heads, seq, sc.D), jnp.bfloat16, sharding=one)
    if mode == "fused":
        def f(q, k, v, do):
            out, vjp = jax.vjp(kernel, q, k, v)
            return (out, *vjp(do))
        args = (q, kv, kv, q)
    else:
        f, args = kernel, (q, kv, kv)
    compiled = jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",)).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes

    def table(info):
        """The compacted grid's steps: each step's block kind (2 unmasked, 1 masked) and row,
        and which steps start and end a row (tokamax's bounds)."""
        block_mask = np.asarray(info.block_mask).reshape(-1)
        rows = np.asarray(info.active_rows).reshape(-1)
        active = int(np.asarray(info.num_active_blocks).reshape(-1)[0])
        block_mask, rows = block_mask[:active], rows[:active]
        starts = int(np.sum(np.r_[True, rows[1:] != rows[:-1]]))
        return active, starts, int(np.sum(block_mask == 2)), int(np.sum(block_mask == 1))

    names = kernel_names(out_dir)
    schedules = []
    active, starts, unmasked, masked = table(kernel.fwd_mask_info)
    schedules.append({
        "kernel": next(n for n in names if "fwd" in n), "grid": [heads, active],
        "dimension_semantics": ["parallel", "arbitrary"],
        "paths": [{"path": p, "runs": [r] * heads} for p, r in
                  zip(["init", "run unmasked", "run masked", "end"],
                      [starts, unmasked, masked, starts])]})
    if mode == "fused":
        # The dK/dV kernel's rows are key blocks; every grid dimension is arbitrary (one
        # TensorCore). Its `when`s: init at a row's first block, the unmasked and the masked
        # block, and the end, which under GQA adds to the dK/dV of the group's earlier query
        # heads (two `when`s: the group's first head stores, the others add) unless a group
        # takes at most 2 key blocks (then the heads' dK/dV are summed after the kernel).
        active, starts, unmasked, masked = table(kernel.dkv_mask_info)
        group = heads // kv_heads
        per_head = [starts, unmasked, masked]
        paths = ["init", "run unmasked", "run masked"]
        if group > 1 and seq // block > 2:
            firsts = sum(1 for h in range(heads) if h % group == 0)
            paths += ["end first head", "end other heads"]
            runs = [r * heads for r in per_head] + [starts * firsts,
                                                   starts * (heads - firsts)]
        else:
            paths.append("end")
            runs = [r * heads for r in per_head + [starts]]
        schedules.append({
            "kernel": next(n for n in names if "dkv" in n), "grid": [heads, active],
            "dimension_semantics": ["arbitrary", "arbitrary"],
            "paths": [{"path": p, "runs": [r]} for p, r in zip(paths, runs)]})
    with open(os.path.join(out_dir, "schedules.json"), "w") as fh:
        json.dump(schedules, fh)
    with open(os.path.join(out_dir, "program.json"), "w") as fh:
        json.dump({"temp_bytes": int(temp)}, fh)


def kernel_names(out_dir):
    """The names libtpu dumped tokamax's kernels under (`tessera tpu-dump-report` without
    schedules lists them)."""
    p = subprocess.run([sc.tessera_bin(), "tpu-dump-report", out_dir, "--target",
                        f"tpu:{sc.TOPOLOGY}"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tessera tpu-dump-report failed: {p.stderr.strip()}")
    return [c["kernel"] for c in json.loads(p.stdout.strip().splitlines()[-1])["kernel_costs"]]


# Each mode's pass in the TSV: the forward with residuals is the forward of splash_cost.py's
# backward rows (`bwd`); the fused backward's program (`fused`) holds it and the dK/dV kernel.
PASSES = {"fwd": "fwd", "residuals": "bwd", "fused": "fused"}


def tokamax_rows(kv_heads, seq, block, grid, mode):
    with tempfile.TemporaryDirectory(prefix="tokamax-cost-") as d:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", d, str(kv_heads), str(seq),
               str(block), str(grid), mode]
        p = subprocess.run(cmd, capture_output=True, text=True, env=sc.compile_only_env())
        if p.returncode != 0:
            print(f"  tokamax {mode} KVH={kv_heads} S={seq} B={block} grid={grid}: failed: "
                  f"{(p.stderr.strip().splitlines() or ['?'])[-1][:300]}", file=sys.stderr)
            return []
        costs, temp = sc.read_worker_dumps(d)
        impl = f"tokamax-grid{grid}" if grid else "tokamax-maxtext"
        rows = [sc.row(impl, PASSES[mode], kv_heads, seq, block, c, temp, 65536)
                for c in costs]
        for r in rows:
            r["role"] = "dkv" if "dkv" in r["kernel"] else "fwd"
        return rows


def main():
    only = {"--residuals": "residuals", "--fused": "fused"}
    if len(sys.argv) > 2 or (sys.argv[1:] and sys.argv[1] not in only):
        sys.exit(f"usage: {sys.argv[0]} [--residuals | --fused] (got {' '.join(sys.argv[1:])})")
    modes = [only[sys.argv[1]]] if sys.argv[1:] else list(PASSES)
    # --residuals and --fused keep the other passes' rows and measure theirs again.
    kept = [r for r in sc.read_tsv(OUT) if r["pass"] not in {PASSES[m] for m in modes}]
    if os.path.exists(OUT):
        os.remove(OUT)
    sc.append_tsv(OUT, kept)
    for mode in modes:
        for i, (kvh, seq, block) in enumerate(CONFIGS):
            for grid in FUSED_GRIDS if mode == "fused" else GRIDS:
                print(f"[{i + 1}/{len(CONFIGS)}] tokamax {mode} KVH={kvh} S={seq} "
                      f"block={block} grid={grid}", file=sys.stderr, flush=True)
                sc.append_tsv(OUT, tokamax_rows(kvh, seq, block, grid, mode))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        d, kvh, s, b, g, mode = sys.argv[2:8]
        worker(d, int(kvh), int(s), int(b), int(g), mode)
    else:
        main()
