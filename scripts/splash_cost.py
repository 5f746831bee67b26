"""Splash attention's kernels by libtpu's own measure, JAX's beside tessera's (compile-only, no TPU).

For every configuration (v5p, bf16, causal, MHA H=8 and GQA H=8/KVH=2, D=128, S 4096 and 8192,
square blocks 512, 1024 and 2048; forward, backward with dq + dkv kernels, fused backward) this
compiles JAX's own Pallas splash attention (jax[tpu]==0.12.0.1, its libtpu 0.0.50.1) with libtpu's
dumps on, one process per configuration (libtpu reads its dump flags once, when it loads), and
reads the dumps with `tessera tpu-dump-report`: the same reader `tessera compile` applies to
tessera's kernels (tessera::tpu::cost). JAX's kernels carry no schedule of their `when`s, so this
script gives one, computed from JAX's own block tables (MaskInfo) and its kernels' conditions
(splash_attention_kernel.py: init at the first step of a row, run where block_mask > 0, end at
its last step; the dkv kernel's first / last query head of a kv head under GQA). Then it compiles
tessera's splash at the same configurations with `tessera compile` (its kernels carry their
schedules) and writes three TSVs: JAX's figures, tessera's, and tessera / JAX per kernel role.

usage: scripts/splash_cost.sh            (makes the venv, builds tessera, runs this)
       python scripts/splash_cost.py [--only jax|tessera] [--quick] [--resume] [--out-prefix P]
       python scripts/splash_cost.py --markdown   (docs/tpu.md's tables from the TSVs, with
                                                   tokamax's from tokamax_cost.tsv)
       python scripts/splash_cost.py --worker DIR PASS H KVH S BLOCK   (one JAX compile)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPOLOGY = "v5p:2x2x1"
D = 128
HEADS = 8
CONFIGS = [
    (pass_, kvh, s, b)
    for pass_ in ("fwd", "bwd", "fused")
    for kvh in (8, 2)
    for s in (4096, 8192)
    for b in (512, 1024, 2048)
]
QUICK = [("fwd", 8, 4096, 512), ("bwd", 8, 4096, 512), ("fused", 2, 4096, 1024)]
# Which of tessera's kernels plays which JAX kernel's role.
ROLES = {
    "splash_mha_fwd_no_residuals": "fwd",
    "splash_mha_fwd_residuals": "fwd",
    "splash_mha_dq_no_residuals": "dq",
    "splash_mha_dkv_no_residuals": "dkv",
    "splash_fwd": "fwd",
    "splash_dq": "dq",
    "splash_dkv": "dkv",
    "splash_bwd_fused": "dkv",
    "splash_bwd_prep": "prep",
    "splash_dq_reduce": "dq_reduce",
}
COLUMNS = ["impl", "pass", "heads", "kv_heads", "seq", "block", "kernel", "role",
           "cycles_per_core", "cycles_all_cores", "mxu_bound_per_core", "cycles_over_mxu_bound",
           "mxu_utilisation", "scoped_vmem_bytes", "program_temp_bytes", "cores",
           "steps_per_core", "exact", "vmem_limit_kib"]


def tessera_bin():
    return os.environ.get("TESSERA", os.path.join(ROOT, "target", "release", "tessera"))


def compile_only_env():
    env = dict(os.environ)
    for k, v in [("TPU_SKIP_MDS_QUERY", "1"), ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
                 ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_ACCELERATOR_TYPE", "v5p-8")]:
        env.setdefault(k, v)
    return env


# ---------------------------------------------------------------- JAX: one compile per process

def worker(out_dir, pass_, heads, kv_heads, seq, block, vmem_kib):
    """Compiles JAX's splash for one configuration with libtpu's dumps in out_dir; writes
    out_dir/schedules.json (its kernels' schedules) and out_dir/program.json."""
    flags = [f"--xla_jf_dump_to={out_dir}", "--xla_jf_dump_llo_pass_label_regex=final"]
    if vmem_kib:
        flags.append(f"--xla_tpu_scoped_vmem_limit_kib={vmem_kib}")
    os.environ["LIBTPU_INIT_ARGS"] = " ".join(flags)
    os.environ["XLA_FLAGS"] = f"--xla_dump_to={out_dir}/xla --xla_dump_hlo_as_text"
    for k, v in compile_only_env().items():
        os.environ.setdefault(k, v)
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    topo = topologies.get_topology_desc(topology_name=TOPOLOGY, platform="tpu")
    one = jax.sharding.SingleDeviceSharding(topo.devices[0])
    mask = sm.MultiHeadMask([sm.CausalMask((seq, seq))] * heads)
    b = block
    sizes = dict(block_q=b, block_kv=b, block_kv_compute=b)
    if pass_ in ("bwd", "fused"):
        sizes.update(block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b)
    if pass_ == "bwd":
        sizes.update(block_q_dq=b, block_kv_dq=b)
    if pass_ == "fused":
        sizes.update(use_fused_bwd_kernel=True)
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                block_sizes=sk.BlockSizes(**sizes))
    q = jax.ShapeDtypeStruct((heads, seq, D), jnp.bfloat16, sharding=one)
    kv = jax.ShapeDtypeStruct((kv_heads, seq, D), jnp.bfloat16, sharding=one)
    if pass_ == "fwd":
        f, args = kernel, (q, kv, kv)
    else:
        def f(q, k, v, do):
            out, vjp = jax.vjp(kernel, q, k, v)
            return (out, *vjp(do))
        args = (q, kv, kv, q)
    compiled = jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",)).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes

    schedules = []
    g = heads // kv_heads

    def runs_per_row(block_mask, h, rows, width, at):
        table = block_mask[0 if block_mask.shape[0] == 1 else h]
        return sum(int(table[at(i, j)] > 0) for i in range(rows) for j in range(width))

    for name, info in [("splash_mha_fwd_no_residuals", kernel.fwd_mask_info),
                       ("splash_mha_fwd_residuals", kernel.fwd_mask_info)]:
        bm = np.asarray(info.block_mask)
        width = np.asarray(info.data_next).shape[-1]
        nq = seq // b
        # grid (heads, q blocks, width), dims (parallel, arbitrary, arbitrary): per head.
        schedules.append({
            "kernel": name, "grid": [heads, nq, width],
            "dimension_semantics": ["parallel", "arbitrary", "arbitrary"],
            "paths": [
                {"path": "init", "runs": [nq] * heads},
                {"path": "run", "runs": [runs_per_row(bm, h, nq, width, lambda i, j: (i, j))
                                         for h in range(heads)]},
                {"path": "end", "runs": [nq] * heads},
            ]})
    if kernel.dq_mask_info is not None:
        info = kernel.dq_mask_info
        bm = np.asarray(info.block_mask)
        width = np.asarray(info.data_next).shape[-1]
        nq = seq // b
        run = sum(runs_per_row(bm, h, nq, width, lambda i, j: (i, j)) for h in range(heads))
        # grid (heads, q blocks, width), every dim arbitrary: one core.
        schedules.append({
            "kernel": "splash_mha_dq_no_residuals", "grid": [heads, nq, width],
            "dimension_semantics": ["arbitrary"] * 3,
            "paths": [{"path": "init", "runs": [heads * nq]}, {"path": "run", "runs": [run]},
                      {"path": "end", "runs": [heads * nq]}]})
    if kernel.dkv_mask_info is not None:
        info = kernel.dkv_mask_info
        bm = np.asarray(info.block_mask)
        width = np.asarray(info.data_next).shape[-2]
        nkv = seq // b
        # grid (kv blocks, heads, width): kv_index, q_head_index, q_index; every dim arbitrary.
        first = sum(1 for h in range(heads) if h % g == 0) * nkv
        last = sum(1 for h in range(heads) if h % g == g - 1) * nkv
        run = sum(int(bm[0 if bm.shape[0] == 1 else h][qi, kv] > 0)
                  for kv in range(nkv) for h in range(heads) for qi in range(width))
        schedules.append({
            "kernel": "splash_mha_dkv_no_residuals", "grid": [nkv, heads, width],
            "dimension_semantics": ["arbitrary"] * 3,
            "paths": [{"path": "init", "runs": [first]}, {"path": "run", "runs": [run]},
                      {"path": "end", "runs": [last]}]})
    with open(os.path.join(out_dir, "schedules.json"), "w") as fh:
        json.dump(schedules, fh)
    with open(os.path.join(out_dir, "program.json"), "w") as fh:
        json.dump({"temp_bytes": int(temp)}, fh)


def jax_rows(pass_, kvh, seq, block):
    """JAX's kernels of one configuration, compiled in a fresh process and read by tessera."""
    for vmem_kib in (None, 65536):
        with tempfile.TemporaryDirectory(prefix="splash-cost-jax-") as d:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", d, pass_, str(HEADS),
                   str(kvh), str(seq), str(block)] + ([str(vmem_kib)] if vmem_kib else [])
            p = subprocess.run(cmd, capture_output=True, text=True, env=compile_only_env())
            if p.returncode != 0:
                err = [l for l in p.stderr.splitlines() if "vmem" in l.lower() or "Error" in l]
                print(f"  JAX {pass_} KVH={kvh} S={seq} B={block} vmem={vmem_kib}: failed: "
                      f"{(err or p.stderr.splitlines() or ['?'])[-1][:200]}", file=sys.stderr)
                continue
            costs, temp = read_worker_dumps(d)
            return [row("jax", pass_, kvh, seq, block, c, temp, vmem_kib) for c in costs]
    return []


def read_worker_dumps(d):
    """The kernel costs `tessera tpu-dump-report` reads from a worker's dumps in `d` (with its
    schedules.json), and the program's temporaries its program.json holds."""
    report = subprocess.run(
        [tessera_bin(), "tpu-dump-report", d, "--schedules",
         os.path.join(d, "schedules.json"), "--target", f"tpu:{TOPOLOGY}"],
        capture_output=True, text=True)
    if report.returncode != 0:
        sys.exit(f"tessera tpu-dump-report failed: {report.stderr.strip()}")
    costs = json.loads(report.stdout.strip().splitlines()[-1])["kernel_costs"]
    with open(os.path.join(d, "program.json")) as fh:
        return costs, json.load(fh)["temp_bytes"]


# ---------------------------------------------------------------- tessera

def tessera_rows(pass_, kvh, seq, block):
    cmd = [tessera_bin(), "compile", "--target", f"tpu:{TOPOLOGY}", "attention",
           "--heads", str(HEADS), "--kv-heads", str(kvh), "--seq-len", str(seq),
           "--head-dim", str(D), "--block-q", str(block), "--block-kv", str(block),
           # The forward row without its lse residual, as JAX's (its kernel called
           # without save_residuals) and tokamax's no-residuals forward.
           "--pass", "inference" if pass_ == "fwd" else "both"]
    if pass_ == "fused":
        cmd.append("--fused-bwd")
    p = subprocess.run(cmd, capture_output=True, text=True, env=compile_only_env())
    if p.returncode != 0:
        print(f"  tessera {pass_} KVH={kvh} S={seq} B={block}: failed: "
              f"{(p.stderr.strip().splitlines() or ['?'])[-1][:300]}", file=sys.stderr)
        return []
    report = json.loads(p.stdout.strip().splitlines()[-1])
    return [row("tessera", pass_, kvh, seq, block, c, report.get("temp_bytes"), None)
            for c in report.get("kernel_costs", [])]


def row(impl, pass_, kvh, seq, block, c, temp, vmem_kib):
    bound = c["mxu_bound_per_core"]
    return {
        "impl": impl, "pass": pass_, "heads": HEADS, "kv_heads": kvh, "seq": seq,
        "block": block, "kernel": c["kernel"], "role": ROLES.get(c["kernel"], c["kernel"]),
        "cycles_per_core": c["cycles_per_core"], "cycles_all_cores": c["cycles_all_cores"],
        "mxu_bound_per_core": c["mxu_bound_per_core"],
        "cycles_over_mxu_bound": f"{c['cycles_per_core'] / bound:.3f}" if bound else "",
        "mxu_utilisation": f"{c['mxu_utilisation']:.3f}",
        "scoped_vmem_bytes": c.get("scoped_vmem_bytes") or "",
        "program_temp_bytes": temp if temp is not None else "",
        "cores": c["cores"], "steps_per_core": c["steps_per_core"],
        "exact": str(c["exact"]).lower(), "vmem_limit_kib": vmem_kib or "",
    }


def read_tsv(path):
    """The rows of a TSV this script wrote (values as text), or none."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        lines = fh.read().splitlines()
    return [dict(zip(lines[0].split("\t"), l.split("\t"))) for l in lines[1:] if l]


def append_tsv(path, rows):
    """Appends rows (the header first into a new file): each configuration is kept as soon
    as it is measured."""
    new = not os.path.exists(path)
    with open(path, "a") as fh:
        if new:
            fh.write("\t".join(COLUMNS) + "\n")
        for r in rows:
            fh.write("\t".join(str(r[c]) for c in COLUMNS) + "\n")


def config_of(r):
    return (r["pass"], int(r["kv_heads"]), int(r["seq"]), int(r["block"]))


def ratios(jax, tess):
    """tessera / JAX per configuration and kernel role (fwd, dq, dkv: the fused kernel's
    role is dkv), and for the whole program's temporaries."""
    out = []
    key = lambda r: config_of(r) + (r["role"],)
    jx = {key(r): r for r in jax}
    for t in tess:
        j = jx.get(key(t))
        if j is None:
            continue
        ratio = lambda f: (f"{float(t[f]) / float(j[f]):.3f}"
                           if t[f] not in ("", None) and j[f] not in ("", None, "0") else "")
        out.append({
            "pass": t["pass"], "kv_heads": t["kv_heads"], "seq": t["seq"], "block": t["block"],
            "role": t["role"], "tessera_kernel": t["kernel"], "jax_kernel": j["kernel"],
            "cycles_per_core": ratio("cycles_per_core"),
            "cycles_all_cores": ratio("cycles_all_cores"),
            "scoped_vmem": ratio("scoped_vmem_bytes"),
            "program_temp": ratio("program_temp_bytes"),
            "tessera_over_mxu_bound": t["cycles_over_mxu_bound"],
            "jax_over_mxu_bound": j["cycles_over_mxu_bound"],
        })
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["jax", "tessera"])
    ap.add_argument("--quick", action="store_true", help="three configurations only")
    ap.add_argument("--out-prefix", default=os.path.join(ROOT, "scripts", "splash_cost"))
    ap.add_argument("--markdown", action="store_true",
                    help="print docs/tpu.md's tables from the TSVs and stop")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows already in the TSVs and measure only what they lack")
    a = ap.parse_args()
    if a.markdown:
        print(markdown(a.out_prefix))
        print()
        print(backward_markdown(a.out_prefix))
        return
    configs = QUICK if a.quick else CONFIGS
    paths = {"jax": a.out_prefix + ".jax.tsv", "tessera": a.out_prefix + ".tessera.tsv"}
    if not a.resume:
        for p in paths.values():
            if os.path.exists(p) and a.only in (None, os.path.basename(p).split(".")[-2]):
                os.remove(p)
    done = {impl: {config_of(r) for r in read_tsv(p)} for impl, p in paths.items()}
    for i, config in enumerate(configs):
        pass_, kvh, seq, block = config
        print(f"[{i + 1}/{len(configs)}] {pass_} H={HEADS} KVH={kvh} S={seq} block={block}",
              file=sys.stderr, flush=True)
        if a.only != "tessera" and config not in done["jax"]:
            append_tsv(paths["jax"], jax_rows(pass_, kvh, seq, block))
        if a.only != "jax" and config not in done["tessera"]:
            append_tsv(paths["tessera"], tessera_rows(pass_, kvh, seq, block))
    if not a.only:
        r = ratios(read_tsv(paths["jax"]), read_tsv(paths["tessera"]))
        cols = list(r[0].keys()) if r else []
        with open(a.out_prefix + ".ratios.tsv", "w") as fh:
            fh.write("\t".join(cols) + "\n")
            for x in r:
                fh.write("\t".join(str(x[c]) for c in cols) + "\n")


def markdown(prefix):
    """The first table of docs/tpu.md: per configuration and kernel role, tessera's cycles per
    core against JAX's (and tokamax's best grid from tokamax_cost.tsv: its forward without
    residuals in the forward pass, with them in the backward ones; its fused dK/dV), then
    tessera / JAX over all cores, scoped VMEM and temporaries."""
    jax = {config_of(r) + (r["role"],): r for r in read_tsv(prefix + ".jax.tsv")}
    tokamax = {}
    for r in read_tsv(os.path.join(os.path.dirname(prefix), "tokamax_cost.tsv")):
        k = config_of(r) + (r["role"],)
        if not r["impl"].startswith("tokamax-grid"):
            continue
        if k not in tokamax or int(r["cycles_per_core"]) < int(tokamax[k]["cycles_per_core"]):
            tokamax[k] = r
    n = lambda x: f"{int(x):,}"
    ratio = lambda a, b: f"{float(a) / float(b):.3f}" if a and b else ""
    lines = [
        "| pass | heads | S | blocks | kernel | cycles per core, tessera / JAX | tokamax "
        "0.0.17 with its diagonal skip, cycles per core (tessera / it) | all cores, tessera / "
        "JAX | scoped VMEM, tessera / JAX | temporaries MiB, tessera / JAX |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"fwd": 0, "bwd": 1, "fused": 2}
    tess = sorted(read_tsv(prefix + ".tessera.tsv"),
                  key=lambda r: (order[r["pass"]], -int(r["kv_heads"]), int(r["seq"]),
                                 int(r["block"]), r["role"]))
    for t in tess:
        j = jax.get(config_of(t) + (t["role"],))
        if j is None:
            continue
        # tokamax's forward: without residuals for the forward pass, with them (its `bwd`
        # rows) for the forward of both backward passes; its fused dK/dV kernel for tessera's
        # fused kernel (the whole passes are in backward_markdown's table).
        tk_pass = "fwd" if t["pass"] == "fwd" else "bwd" if t["role"] == "fwd" else t["pass"]
        tk = tokamax.get((tk_pass,) + config_of(t)[1:] + (t["role"],))
        tk_cell = (f"{n(tk['cycles_per_core'])} ({ratio(t['cycles_per_core'], tk['cycles_per_core'])})"
                   if tk else "")
        heads = "MHA" if t["kv_heads"] == t["heads"] else f"GQA {t['heads']}/{t['kv_heads']}"
        mib = lambda r: f"{int(r['program_temp_bytes']) / 2**20:.1f}"
        lines.append(
            f"| {t['pass']} | {heads} | {t['seq']} | {t['block']} | {t['role']} | "
            f"{n(t['cycles_per_core'])} / {n(j['cycles_per_core'])} "
            f"({ratio(t['cycles_per_core'], j['cycles_per_core'])}) | {tk_cell} | "
            f"{ratio(t['cycles_all_cores'], j['cycles_all_cores'])} | "
            f"{ratio(t['scoped_vmem_bytes'], j['scoped_vmem_bytes'])} | "
            f"{mib(t)} / {mib(j)} |")
    return "\n".join(lines)


def backward_markdown(prefix):
    """The backward as a pass (docs/tpu.md's second table): tessera's backward kernels summed
    (dQ and dK/dV, or the fused kernel and the dQ reduction; the `di` prep in both), against
    JAX 0.12's (its dQ and dK/dV kernels, or its fused dK/dV kernel) and, for the fused
    backward, tokamax's fused dK/dV kernel (from tokamax_cost.tsv: as MaxText 0.2.5 calls it,
    and with its diagonal skip at its better grid; tokamax has no separate backward). The
    peers' own XLA ops of the pass (their `di`, the sum of their dQ partials) are not counted:
    they favour the peers."""
    def backward(rows, pass_):
        """Per configuration: cycles per core and over the cores summed over the backward's
        kernels, their largest scoped VMEM, and the program's temporaries."""
        out = {}
        for r in rows:
            if r["pass"] != pass_ or r["role"] == "fwd":
                continue
            c = out.setdefault(config_of(r)[1:], [0, 0, 0, int(r["program_temp_bytes"])])
            c[0] += int(r["cycles_per_core"])
            c[1] += int(r["cycles_all_cores"])
            c[2] = max(c[2], int(r["scoped_vmem_bytes"]))
        return out

    tessera_rows = read_tsv(prefix + ".tessera.tsv")
    jax_rows = read_tsv(prefix + ".jax.tsv")
    tk_rows = read_tsv(os.path.join(os.path.dirname(prefix), "tokamax_cost.tsv"))
    maxtext = backward([r for r in tk_rows if r["impl"] == "tokamax-maxtext"], "fused")
    skip = {}
    for impl in sorted({r["impl"] for r in tk_rows if r["impl"].startswith("tokamax-grid")}):
        for k, c in backward([r for r in tk_rows if r["impl"] == impl], "fused").items():
            if k not in skip or c[0] < skip[k][0]:
                skip[k] = c
    n = lambda x: f"{x:,}"
    mib = lambda b: f"{b / 2**20:.1f}"
    lines = [
        "| pass | heads | S | blocks | tessera's backward kernels, cycles per core / all "
        "cores | JAX 0.12's (dQ + dK/dV, or fused dK/dV; one core) | tokamax as MaxText 0.2.5 "
        "calls it (one core) | tokamax with its diagonal skip (one core) | tessera / best "
        "peer, per core | all cores | scoped VMEM, tessera / best peer | temporaries MiB, "
        "tessera / JAX / tokamax |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pass_, label in (("bwd", "dq + dkv"), ("fused", "fused")):
        tess, jax = backward(tessera_rows, pass_), backward(jax_rows, pass_)
        for k in sorted(tess, key=lambda k: (-k[0], k[1], k[2])):
            tokamax = [maxtext.get(k), skip.get(k)] if pass_ == "fused" else []
            if k not in jax or None in tokamax:
                continue
            t, peers = tess[k], [jax[k]] + tokamax
            best = lambda i: min(p[i] for p in peers)
            kvh, seq, block = k
            heads = "MHA" if kvh == HEADS else f"GQA {HEADS}/{kvh}"
            tk_cells = (f"{n(tokamax[0][0])} | {n(tokamax[1][0])}" if tokamax else "- | -")
            tk_temp = mib(min(p[3] for p in tokamax)) if tokamax else "-"
            lines.append(
                f"| {label} | {heads} | {seq} | {block} | {n(t[0])} / {n(t[1])} | "
                f"{n(jax[k][0])} | {tk_cells} | {t[0] / best(0):.3f} | {t[1] / best(1):.3f} | "
                f"{t[2] / best(2):.3f} | {mib(t[3])} / {mib(jax[k][3])} / {tk_temp} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        d, p, h, kvh, s, b = sys.argv[2:8]
        vmem = int(sys.argv[8]) if len(sys.argv) > 8 else None
        worker(d, p, int(h), int(kvh), int(s), int(b), vmem)
    else:
        main()
