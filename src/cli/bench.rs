//! `tessera bench attention`: splash against dense attention on the XLA CPU plugin, and the
//! `tessera bench` command family. Every bench times XLA's own large square dot in the same
//! process and run as the programs it measures, and reports their GFLOP/s as a fraction of it.

mod kernels;
mod stages;
mod timing;
mod tpu_costs;

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use tessera::dsl::{DType, HostArray, KernelRules};
use tessera::hlo::Module;
use tessera::runtime::{Buffer, Client, HostBuffer};
use tessera::splash::{dense_program, splash_program, Features, Pass};
use tessera::splash::{BlockSizes, Dims, Mask, SplashAttention, SplashOptions};

use timing::{peak_program, peak_spread_line, time_all, Timed};

/// What `tessera bench` measures.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Splash attention against dense attention (materialised scores) on the XLA CPU plugin:
    /// forward and forward+backward time, GFLOP/s and peak memory, one process per program.
    Attention(BenchArgs),
    /// Every listed context-parallel strategy side by side on the same XLA CPU devices:
    /// forward and forward+backward times and their ratios.
    ContextParallel(super::bench_cp::CpBenchArgs),
    /// Every registered kernel at a realistic size beside XLA's own dot (the matmul peak, f32
    /// and bf16) and dense attention: GFLOP/s and the fraction of the peak.
    Kernels(kernels::KernelsArgs),
}

/// Runs `tessera bench`.
pub fn bench(what: &BenchCommand) -> Result<()> {
    match what {
        BenchCommand::Attention(args) => bench_command(args),
        BenchCommand::ContextParallel(args) => super::bench_cp::bench_command(args),
        BenchCommand::Kernels(args) => kernels::bench_kernels(args),
    }
}

/// Arguments of `tessera bench attention`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    #[arg(long, default_value_t = 1, value_parser = super::positive)]
    pub batch: usize,
    #[arg(long, default_value_t = 8, value_parser = super::positive)]
    pub heads: usize,
    /// Key/value heads (default: as many as query heads).
    #[arg(long, value_parser = super::positive)]
    pub kv_heads: Option<usize>,
    #[arg(long, default_value_t = 4096, value_parser = super::positive)]
    pub seq: usize,
    #[arg(long, default_value_t = 64, value_parser = super::positive)]
    pub head_dim: usize,
    /// full, causal, causal:OFFSET, local:LEFT:RIGHT or chunked:SIZE.
    #[arg(long, default_value = "causal")]
    pub mask: String,
    #[arg(long, default_value_t = 512, value_parser = super::positive)]
    pub block_q: usize,
    #[arg(long, default_value_t = 512, value_parser = super::positive)]
    pub block_kv: usize,
    /// Keys per inner compute step of the forward, dK/dV and dQ kernels (default: block-kv;
    /// dQ's as splash's `default_dq_compute_block`).
    #[arg(long, value_parser = super::positive)]
    pub block_kv_compute: Option<usize>,
    /// Query block of the backward kernels (default: block-q).
    #[arg(long, value_parser = super::positive)]
    pub block_q_bwd: Option<usize>,
    /// Key block of the backward kernels (default: block-kv).
    #[arg(long, value_parser = super::positive)]
    pub block_kv_bwd: Option<usize>,
    /// Use separate dq and dkv backward kernels instead of the fused one.
    #[arg(long)]
    pub separate_bwd: bool,
    /// Timed runs per program (after one warm-up run, interleaved across programs); the
    /// minimum is reported.
    #[arg(long, default_value_t = 3, value_parser = super::positive)]
    pub reps: usize,
    /// Size of XLA's own square dot, the matmul peak the programs are compared with.
    #[arg(long, default_value_t = 2048, value_parser = super::positive)]
    pub peak_size: usize,
    /// Also time every kernel call of the splash programs as a program of its own: where the
    /// time goes.
    #[arg(long)]
    pub profile: bool,
    /// Run one program once in this process and print its peak memory as JSON (the bench
    /// measures each program's memory in a fresh process).
    #[arg(long, hide = true)]
    pub child: Option<String>,
}

impl BenchArgs {
    fn dims(&self) -> Dims {
        Dims {
            batch: self.batch,
            heads: self.heads,
            kv_heads: self.kv_heads.unwrap_or(self.heads),
            q_len: self.seq,
            kv_len: self.seq,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim,
        }
    }

    fn attention(&self) -> Result<SplashAttention> {
        let mut blocks =
            BlockSizes::uniform(self.block_q, self.block_kv).with_fused_bwd(!self.separate_bwd);
        if let Some(q) = self.block_q_bwd {
            blocks.block_q_dkv = q;
            blocks.block_q_dq = q;
        }
        if let Some(kv) = self.block_kv_bwd {
            blocks.block_kv_dkv = kv;
            blocks.block_kv_dkv_compute = kv;
            blocks.block_kv_dq = kv;
        }
        if let Some(c) = self.block_kv_compute {
            blocks.block_kv_compute = c;
            blocks.block_kv_dkv_compute = c;
            blocks.block_kv_dq_compute = Some(c);
        }
        Ok(SplashAttention::new(
            Mask::parse(&self.mask)?,
            self.dims(),
            DType::F32,
            blocks,
            SplashOptions::default(),
            KernelRules::tpu(),
        )?)
    }
}

/// A `/proc/self/status` field in bytes (0 where unavailable).
fn proc_status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Deterministic inputs `q, k, v, dout` for the bench.
fn bench_inputs(d: Dims) -> Vec<HostArray> {
    let shapes = [
        vec![d.batch, d.heads, d.q_len, d.head_dim],
        vec![d.batch, d.kv_heads, d.kv_len, d.head_dim],
        vec![d.batch, d.kv_heads, d.kv_len, d.head_dim_v],
        vec![d.batch, d.heads, d.q_len, d.head_dim_v],
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| tessera::reference::random(DType::F32, s, 100 + i as u64))
        .collect()
}

/// The programs compared, in the order they run.
const VARIANTS: [&str; 4] = ["splash-fwd", "dense-fwd", "splash-fwdbwd", "dense-fwdbwd"];

fn pass_of(variant: &str) -> Pass {
    if variant.ends_with("fwdbwd") {
        Pass::ForwardBackward
    } else {
        Pass::Forward
    }
}

/// The program of `variant` (splash or dense attention, forward or forward+backward).
fn variant_program(args: &BenchArgs, attn: &SplashAttention, variant: &str) -> Result<Module> {
    let pass = pass_of(variant);
    Ok(if variant.starts_with("splash") {
        splash_program(attn, pass, Features::default())?
    } else {
        let mask = Mask::parse(&args.mask)?;
        dense_program(attn.dims(), DType::F32, &mask, attn.scale(), None, pass)?
    })
}

/// Floating-point operations of one run of `variant`: four per visible (query, key) pair and
/// head-dim element forward (`q k^T`, `p v`); the backward does five matmuls of the forward's
/// size (dv, dp, dq, dk and the recomputed or saved scores), so forward + backward is 3.5x.
fn variant_flops(attn: &SplashAttention, variant: &str) -> f64 {
    let fwd = 4.0 * attn.dims().head_dim as f64 * attn.visible_pairs();
    match pass_of(variant) {
        Pass::Forward | Pass::Inference => fwd,
        Pass::ForwardBackward => 3.5 * fwd,
        Pass::Backward => 2.5 * fwd,
    }
}

/// `variant` compiled with its device inputs.
fn compile_variant(
    client: &Client,
    args: &BenchArgs,
    attn: &SplashAttention,
    variant: &str,
) -> Result<Timed> {
    let mut inputs = bench_inputs(attn.dims());
    if pass_of(variant) == Pass::Forward {
        inputs.truncate(3);
    }
    let module = variant_program(args, attn, variant)?;
    let flops = variant_flops(attn, variant);
    let splash = variant.starts_with("splash");
    Timed::new(
        client,
        variant,
        &module,
        input_buffers(client, &inputs)?,
        flops,
        splash,
    )
}

/// Host arrays copied to device 0.
fn input_buffers(client: &Client, arrays: &[HostArray]) -> Result<Vec<Buffer>> {
    arrays
        .iter()
        .map(|a| Ok(client.buffer_from_host(&HostBuffer::from_array(a)?, 0)?))
        .collect()
}

/// In a fresh process: compiles one variant, runs it once and prints
/// `{"peak_rss":..,"base_rss":..}` (bytes; base = before the run).
fn bench_child(args: &BenchArgs, variant: &str) -> Result<()> {
    let attn = args.attention()?;
    let c = compile_variant(&Client::cpu_shared(1)?, args, &attn, variant)?;
    let base = proc_status_bytes("VmRSS:");
    drop(c.run()?);
    outln!(
        "{{\"peak_rss\":{},\"base_rss\":{base}}}",
        proc_status_bytes("VmHWM:")
    );
    Ok(())
}

/// Peak memory of one variant's execution (bytes above the process's resident memory
/// before it), measured in a fresh process so nothing else's allocations count.
fn peak_memory(args: &BenchArgs, variant: &str) -> Result<u64> {
    let exe = std::env::current_exe().context("locating the tessera executable")?;
    let d = args.dims();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["bench", "attention"])
        .args(["--batch", &d.batch.to_string()])
        .args(["--heads", &d.heads.to_string()])
        .args(["--kv-heads", &d.kv_heads.to_string()])
        .args(["--seq", &d.q_len.to_string()])
        .args(["--head-dim", &d.head_dim.to_string()])
        .args(["--mask", &args.mask])
        .args(["--block-q", &args.block_q.to_string()])
        .args(["--block-kv", &args.block_kv.to_string()])
        .args(["--child", variant]);
    for (flag, v) in [
        ("--block-kv-compute", args.block_kv_compute),
        ("--block-q-bwd", args.block_q_bwd),
        ("--block-kv-bwd", args.block_kv_bwd),
    ] {
        if let Some(v) = v {
            cmd.args([flag, &v.to_string()]);
        }
    }
    if args.separate_bwd {
        cmd.arg("--separate-bwd");
    }
    let out = cmd
        .output()
        .with_context(|| format!("running the {variant} memory probe"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rfind(|l| l.starts_with('{'));
    let (Some(line), true) = (line, out.status.success()) else {
        bail!(
            "the {variant} memory probe failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .map(|l| l.strip_prefix("error: ").unwrap_or(l))
                .unwrap_or("(no message)")
        );
    };
    let field = |name: &str| -> Result<u64> {
        let key = format!("\"{name}\":");
        let rest = &line[line.find(&key).context("malformed probe output")? + key.len()..];
        let end = rest.find([',', '}']).context("malformed probe output")?;
        Ok(rest[..end].trim().parse()?)
    };
    Ok(field("peak_rss")?.saturating_sub(field("base_rss")?))
}

/// Runs `tessera bench attention`: splash against dense attention on the PJRT CPU plugin.
pub fn bench_command(args: &BenchArgs) -> Result<()> {
    if let Some(variant) = &args.child {
        if !VARIANTS.contains(&variant.as_str()) {
            bail!("unknown bench variant `{variant}`; expected one of {VARIANTS:?}");
        }
        return bench_child(args, variant);
    }
    let attn = args.attention()?;
    let d = attn.dims();
    let stats = attn.stats();
    outln!(
        "splash vs dense attention on the XLA CPU plugin: B={} H={} KVH={} S={} D={} mask={} \
         blocks {}x{} ({} backward)",
        d.batch,
        d.heads,
        d.kv_heads,
        d.q_len,
        d.head_dim,
        args.mask,
        args.block_q,
        args.block_kv,
        if args.separate_bwd {
            "separate"
        } else {
            "fused"
        }
    );
    outln!(
        "forward key blocks: {} computed ({} masked), {} skipped of {}",
        stats.computed(),
        stats.partial,
        stats.empty,
        stats.total
    );
    // Peak memory first, each program alone in a fresh process.
    let mut peak_mem = HashMap::new();
    for variant in VARIANTS {
        peak_mem.insert(variant, peak_memory(args, variant)?);
    }
    // Time the programs in one process, interleaved, so load changes hit all alike, beside
    // XLA's own dot (the machine's matmul peak).
    let client = Client::cpu_shared(1)?;
    let mut programs = Vec::new();
    for variant in VARIANTS {
        programs.push(compile_variant(&client, args, &attn, variant)?);
    }
    for dtype in [DType::F32, DType::BF16] {
        programs.push(peak_program(&client, args.peak_size, dtype)?);
    }
    let outputs = time_all(&mut programs, args.reps)?;
    let peak = programs[VARIANTS.len()].gflops();
    let peak_bf16 = programs[VARIANTS.len() + 1].gflops();
    outln!(
        "XLA's own {n}x{n}x{n} dot (the matmul peak): f32 {peak:.1} GFLOP/s, bf16 {peak_bf16:.1} \
         GFLOP/s",
        n = args.peak_size
    );
    for p in &programs[VARIANTS.len()..] {
        outln!("the peak, {}", peak_spread_line(p));
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    outln!(
        "{:<14} {:>10} {:>10} {:>10} {:>9} {:>15}",
        "program",
        "compile s",
        "best s",
        "GFLOP/s",
        "of peak",
        "exec peak MiB"
    );
    for (variant, p) in VARIANTS.iter().zip(&programs) {
        outln!(
            "{:<14} {:>10.2} {:>10.4} {:>10.2} {:>8.1}% {:>15.1}",
            variant,
            p.compile_s,
            p.best_s,
            p.gflops(),
            100.0 * p.gflops() / peak,
            mib(peak_mem[variant])
        );
    }
    let best: Vec<f64> = programs.iter().map(|p| p.best_s).collect();
    let mut summary = Vec::new();
    for (pass, s, dn) in [("fwd", 0, 1), ("fwd+bwd", 2, 3)] {
        let ratio = best[dn] / best[s];
        outln!(
            "{pass:<8} splash {:.3} s vs dense {:.3} s: {ratio:.2}x faster; {:.1}% of the matmul \
             peak; peak memory {:.1} MiB vs {:.1} MiB",
            best[s],
            best[dn],
            100.0 * programs[s].gflops() / peak,
            mib(peak_mem[VARIANTS[s]]),
            mib(peak_mem[VARIANTS[dn]])
        );
        summary.push(format!("\"{}_speedup\":{ratio:.3}", pass.replace('+', "")));
    }
    summary.push(format!(
        "\"matmul_peak_gflops\":{peak:.2},\"matmul_peak_bf16_gflops\":{peak_bf16:.2},\
         \"matmul_peak_spread\":{:.3},\"fwd_fraction_of_peak\":{:.4},\
         \"fwdbwd_fraction_of_peak\":{:.4}",
        programs[VARIANTS.len()].spread(),
        programs[0].gflops() / peak,
        programs[2].gflops() / peak
    ));
    if args.profile {
        summary.push(profile(&client, &attn, &mut programs, peak, args.reps)?);
    }
    // The two implementations must agree.
    let names = ["out", "lse", "dq", "dk", "dv"];
    let mut worst = 0.0f64;
    for (name, (a, b)) in names.iter().zip(outputs[2].iter().zip(&outputs[3])) {
        let (a, b) = (a.to_host()?.to_array()?, b.to_host()?.to_array()?);
        let (err, _) = tessera::reference::max_abs_diff(&a.to_f64_vec(), &b.to_f64_vec());
        worst = worst.max(err);
        outln!("max |splash - dense| {name}: {err:.2e}");
    }
    outln!(
        "{{{},\"max_abs_diff\":{worst:.3e},\"kv_blocks_computed\":{},\"kv_blocks_total\":{}}}",
        summary.join(","),
        stats.computed(),
        stats.total
    );
    if worst > 1e-3 {
        bail!("splash and dense attention disagree by {worst:.2e}");
    }
    Ok(())
}

/// `--profile`: every kernel call of splash forward + backward timed as a program of its own
/// (interleaved with the whole program, on the tensors the earlier calls produced); prints
/// each call's time, share and GFLOP/s and returns the JSON field `"profile":{..}`.
fn profile(
    client: &Client,
    attn: &SplashAttention,
    programs: &mut Vec<Timed>,
    peak: f64,
    reps: usize,
) -> Result<String> {
    let feats = Features::default();
    let mut plan = attn.forward_plan(feats);
    plan.extend(attn.backward_plan(feats));
    let mut env = stages::input_env(client, &bench_inputs(attn.dims()))?;
    let pairs = attn.visible_pairs();
    let mut calls = stages::stage_programs(client, attn, &plan, &mut env, pairs, "")?;
    // The whole forward + backward program (timed again, beside its parts).
    let whole = programs.swap_remove(2);
    calls.push(whole);
    time_all(&mut calls, reps)?;
    let whole = calls.pop().expect("pushed above");
    let sum: f64 = calls.iter().map(|c| c.best_s).sum();
    outln!("profile: splash forward + backward, one program per kernel call (best of {reps})");
    outln!(
        "{:<20} {:>10} {:>8} {:>10} {:>9}",
        "kernel call",
        "best s",
        "share",
        "GFLOP/s",
        "of peak"
    );
    let mut json = Vec::new();
    for c in &calls {
        outln!(
            "{:<20} {:>10.4} {:>7.1}% {:>10.2} {:>8.1}%",
            c.name,
            c.best_s,
            100.0 * c.best_s / sum,
            c.gflops(),
            100.0 * c.gflops() / peak
        );
        json.push(format!("\"{}\":{:.5}", c.name, c.best_s));
    }
    outln!(
        "sum of the calls {sum:.4} s; the whole program {:.4} s ({:+.1}% for running them as one)",
        whole.best_s,
        100.0 * (whole.best_s / sum - 1.0)
    );
    Ok(format!("\"profile\":{{{}}}", json.join(",")))
}
