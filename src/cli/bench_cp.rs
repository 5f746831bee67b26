//! `tessera bench context-parallel`: the strategies side by side on the same CPU devices.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use tessera::backend::Platform;
use tessera::dsl::{DType, HostArray, Lowering};
use tessera::parallel::{ContextParallel, CpExecutable, Names, Strategy};
use tessera::splash::{BlockSizes, Dims, Mask};

/// Arguments of `tessera bench context-parallel`.
#[derive(clap::Args, Debug, Clone)]
pub struct CpBenchArgs {
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
    /// Devices of the context axis.
    #[arg(long, default_value_t = 4, value_parser = super::positive)]
    pub devices: usize,
    /// Query and key block of every kernel (it must divide each device's share).
    #[arg(long, default_value_t = 512, value_parser = super::positive)]
    pub block: usize,
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = Strategy::names().into_iter().map(String::from).collect::<Vec<_>>(),
        help = super::strategies_help("Strategies to compare (comma-separated; default: all)", "")
    )]
    pub strategies: Vec<String>,
    #[arg(long, help = super::load_balance_help(
        "Also time",
        " with causal load balancing (zigzag)",
    ))]
    pub load_balance: bool,
    /// Use separate dq and dkv backward kernels instead of the fused one.
    #[arg(long)]
    pub separate_bwd: bool,
    /// Timed runs per program (after one warm-up run, interleaved across strategies); the
    /// minimum is reported.
    #[arg(long, default_value_t = 3, value_parser = super::positive)]
    pub reps: usize,
}

/// The library's quantities as `tessera bench context-parallel` names them.
struct Flags;

impl Names for Flags {
    fn flag(&self, key: &str) -> Option<&str> {
        Some(match key {
            "strategy" => "--strategies",
            "context" => "--devices",
            "load_balance" => "--load-balance",
            "heads" => "--heads",
            "kv_heads" => "--kv-heads",
            "seq_len" => "--seq",
            "head_dim" => "--head-dim",
            "batch" => "--batch",
            k if k.starts_with("block_") => "--block",
            _ => return None,
        })
    }
}

/// One strategy compiled, with its results of the last run.
struct Compiled {
    /// The strategy, `+lb` with load balancing.
    name: String,
    forward: CpExecutable,
    forward_backward: CpExecutable,
    compile_s: f64,
    best_fwd: f64,
    best_fwdbwd: f64,
    outputs: Vec<HostArray>,
}

/// Runs the benchmark: forward and forward+backward time of every strategy on the same
/// devices and inputs, the ratios to the fastest, and the largest difference between their
/// results.
pub fn bench_command(a: &CpBenchArgs) -> Result<()> {
    let dims = Dims {
        batch: a.batch,
        heads: a.heads,
        kv_heads: a.kv_heads.unwrap_or(a.heads),
        q_len: a.seq,
        kv_len: a.seq,
        head_dim: a.head_dim,
        head_dim_v: a.head_dim,
    };
    let mask = Mask::parse(&a.mask)?;
    let shapes = [
        [dims.batch, dims.heads, dims.q_len, dims.head_dim],
        [dims.batch, dims.kv_heads, dims.kv_len, dims.head_dim],
        [dims.batch, dims.kv_heads, dims.kv_len, dims.head_dim_v],
        [dims.batch, dims.heads, dims.q_len, dims.head_dim_v],
    ];
    let [q, k, v, dout] = shapes.map(|s| tessera::reference::random(DType::F32, &s, 7));
    outln!(
        "context-parallel splash attention on {} XLA CPU devices: B={} H={} KVH={} S={} D={} \
         mask={} blocks {}x{}",
        a.devices,
        dims.batch,
        dims.heads,
        dims.kv_heads,
        dims.q_len,
        dims.head_dim,
        a.mask,
        a.block,
        a.block
    );
    outln!(
        "(times include sharding the global host arrays over the devices and assembling the \
         results, the same work for every strategy)"
    );
    let mut variants = Vec::new();
    for name in &a.strategies {
        let strategy = Strategy::parse(name, a.devices).map_err(|e| anyhow!(e.describe(&Flags)))?;
        let balanced = a.load_balance && strategy.load_balances();
        variants.push((strategy.clone(), false));
        if balanced {
            variants.push((strategy, true));
        }
    }
    let mut runs = Vec::new();
    for (strategy, load_balance) in variants {
        let cp = ContextParallel {
            dims,
            dtype: DType::F32,
            mask: mask.clone(),
            block_sizes: BlockSizes::uniform(a.block, a.block).with_fused_bwd(!a.separate_bwd),
            options: Default::default(),
            strategy,
            devices: a.devices,
            load_balance,
            lowering: Lowering::portable(),
        };
        cp.validate().map_err(|e| anyhow!(e.describe(&Flags)))?;
        let start = Instant::now();
        let forward = cp.forward_program(false)?.compile(Platform::Cpu)?;
        let forward_backward = cp.forward_backward_program(false)?.compile(Platform::Cpu)?;
        runs.push(Compiled {
            name: format!("{}{}", cp.strategy, if load_balance { "+lb" } else { "" }),
            forward,
            forward_backward,
            compile_s: start.elapsed().as_secs_f64(),
            best_fwd: f64::INFINITY,
            best_fwdbwd: f64::INFINITY,
            outputs: Vec::new(),
        });
    }
    if runs.is_empty() {
        bail!(
            "no strategies to compare; give --strategies {}",
            Strategy::names().join(",")
        );
    }
    // Interleaved so load changes on the machine hit every strategy alike; run 0 warms up.
    for rep in 0..=a.reps {
        for r in &mut runs {
            let start = Instant::now();
            r.forward.run(&[&q, &k, &v])?;
            let t_fwd = start.elapsed().as_secs_f64();
            let start = Instant::now();
            let outputs = r.forward_backward.run(&[&q, &k, &v, &dout])?;
            let t_fwdbwd = start.elapsed().as_secs_f64();
            if rep > 0 {
                r.best_fwd = r.best_fwd.min(t_fwd);
                r.best_fwdbwd = r.best_fwdbwd.min(t_fwdbwd);
            }
            r.outputs = outputs;
        }
    }
    let fastest_fwd = runs
        .iter()
        .map(|r| r.best_fwd)
        .fold(f64::INFINITY, f64::min);
    let fastest_fwdbwd = runs
        .iter()
        .map(|r| r.best_fwdbwd)
        .fold(f64::INFINITY, f64::min);
    outln!(
        "{:<14} {:>10} {:>10} {:>12} {:>12} {:>14}",
        "strategy",
        "compile s",
        "fwd s",
        "fwd ratio",
        "fwd+bwd s",
        "fwd+bwd ratio"
    );
    for r in &runs {
        outln!(
            "{:<14} {:>10.2} {:>10.4} {:>11.2}x {:>12.4} {:>13.2}x",
            r.name,
            r.compile_s,
            r.best_fwd,
            r.best_fwd / fastest_fwd,
            r.best_fwdbwd,
            r.best_fwdbwd / fastest_fwdbwd
        );
    }
    // The strategies compute the same attention: each against the first.
    let names = ["out", "lse", "dq", "dk", "dv"];
    let mut worst = 0.0f64;
    for r in &runs[1..] {
        let diffs: Vec<String> = names
            .iter()
            .zip(r.outputs.iter().zip(&runs[0].outputs))
            .map(|(name, (a, b))| {
                let (err, _) = tessera::reference::max_abs_diff(&a.to_f64_vec(), &b.to_f64_vec());
                worst = worst.max(err);
                format!("{name} {err:.1e}")
            })
            .collect();
        outln!("max |{} - {}|: {}", r.name, runs[0].name, diffs.join(", "));
    }
    let json: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "\"{}\":{{\"fwd_s\":{:.4},\"fwdbwd_s\":{:.4}}}",
                r.name, r.best_fwd, r.best_fwdbwd
            )
        })
        .collect();
    outln!("{{{},\"max_abs_diff\":{worst:.3e}}}", json.join(","));
    if worst > 1e-3 {
        bail!("the strategies disagree by {worst:.2e}");
    }
    Ok(())
}
