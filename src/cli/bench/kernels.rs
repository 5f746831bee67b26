//! `tessera bench kernels`: every registered kernel at a realistic size on the XLA CPU
//! plugin, beside XLA's own dot (the matmul peak, f32 and bf16) and dense attention, all in
//! one process and timed side by side; each kernel's GFLOP/s as a fraction of the peak of
//! its dtype.

use std::collections::HashMap;

use anyhow::{bail, Result};
use half::bf16;
use tessera::dsl::{ArgSpec, DType, KernelDef, TargetRules};
use tessera::kernels::matmul;
use tessera::registry;
use tessera::runtime::Client;
use tessera::splash::{
    dense_program, BlockSizes, Dims, Features, Mask, Pass, SplashAttention, SplashOptions,
};

use super::stages::{input_env, stage_programs};
use super::timing::{peak_program, random_buffers, time_all, Timed};

/// Arguments of `tessera bench kernels`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelsArgs {
    /// Square size of the matmuls (the tiled kernel and XLA's dot, the peak).
    #[arg(long, default_value_t = 2048, value_parser = super::super::positive)]
    pub matmul_size: usize,
    /// Block size of the tiled matmul kernel (all three dims): 128, 256 or 512.
    #[arg(long, default_value_t = 512, value_parser = super::super::positive)]
    pub matmul_block: usize,
    /// Sequence length of the attention kernels.
    #[arg(long, default_value_t = 4096, value_parser = super::super::positive)]
    pub seq: usize,
    #[arg(long, default_value_t = 8, value_parser = super::super::positive)]
    pub heads: usize,
    #[arg(long, default_value_t = 64, value_parser = super::super::positive)]
    pub head_dim: usize,
    /// Query and key block of the splash kernels.
    #[arg(long, default_value_t = 512, value_parser = super::super::positive)]
    pub block: usize,
    /// Query and key block of the example flash attention kernel.
    #[arg(long, default_value_t = 256, value_parser = super::super::positive)]
    pub flash_block: usize,
    /// Rows per block of the row softmax (over a seq x seq array).
    #[arg(long, default_value_t = 64, value_parser = super::super::positive)]
    pub softmax_block: usize,
    /// Leave out dense attention (it materialises [B, H, S, S] scores).
    #[arg(long)]
    pub no_dense: bool,
    /// Timed runs per program (after one warm-up run, interleaved); the minimum is reported.
    #[arg(long, default_value_t = 3, value_parser = super::super::positive)]
    pub reps: usize,
    /// Instead of timing on the CPU: compile every registered kernel for this TPU topology
    /// (tpu:v5p:2x2x1, ...; bf16) with libtpu and print its cost read from the compiler's
    /// bundles (cycles per core, MXU use, scoped VMEM), as `tessera compile` does.
    #[arg(long, value_name = "tpu:TOPOLOGY")]
    pub target: Option<String>,
}

/// One row of the table: a program and the dtype whose peak it is compared with.
struct Row {
    /// The registered kernel measured, or what XLA computes.
    kernel: String,
    config: String,
    dtype: DType,
}

/// Runs `tessera bench kernels`.
pub fn bench_kernels(a: &KernelsArgs) -> Result<()> {
    if let Some(target) = &a.target {
        return super::tpu_costs::kernel_costs(a, target);
    }
    let client = Client::cpu_shared(1)?;
    let mut rows = Vec::new();
    let mut programs = Vec::new();
    let n = a.matmul_size;
    for dtype in [DType::F32, DType::BF16] {
        programs.push(peak_program(&client, n, dtype)?);
        rows.push(Row {
            kernel: "xla_dot".into(),
            config: format!("{dtype} {n}^3 (the peak)"),
            dtype,
        });
    }
    let square = (n * n) as f64;
    for dtype in [DType::F32, DType::BF16] {
        // The registered kernel, with a block size the CLI's registry does not instantiate.
        let def = matmul_def(dtype, a.matmul_block)?;
        let specs = vec![ArgSpec::new(dtype, [n, n]); 2];
        let flops = 2.0 * square * n as f64;
        programs.push(kernel_program(&client, def, &specs, flops)?);
        rows.push(Row {
            kernel: "matmul".into(),
            config: format!("{dtype} {n}^3 blocks {}", a.matmul_block),
            dtype,
        });
    }
    let mut example = |kernel: &str, params: &[(&str, String)], config: String, dtype, flops| {
        programs.push(registry_program(&client, kernel, params, flops)?);
        rows.push(Row {
            kernel: kernel.into(),
            config,
            dtype,
        });
        anyhow::Ok(())
    };
    let s = a.seq;
    let params = [
        ("BR", a.softmax_block.to_string()),
        ("R", s.to_string()),
        ("C", s.to_string()),
    ];
    let config = format!("f32 {s}x{s} rows {}", a.softmax_block);
    // max, subtract, exp, sum, divide per element.
    let softmax_flops = 5.0 * (s * s) as f64;
    example("row_softmax", &params, config, DType::F32, softmax_flops)?;
    let fb = a.flash_block.to_string();
    let params = [
        ("BQ", fb.clone()),
        ("BKV", fb.clone()),
        ("causal", "true".into()),
        ("S", s.to_string()),
        ("D", a.head_dim.to_string()),
    ];
    let config = format!("f32 S={s} D={} causal blocks {fb}", a.head_dim);
    let causal_pairs = (s * (s + 1) / 2) as f64;
    let flash_flops = 4.0 * a.head_dim as f64 * causal_pairs;
    example("flash_attention", &params, config, DType::F32, flash_flops)?;

    // Splash: every stage of the forward, fused and separate backward plans.
    let dims = Dims {
        batch: 1,
        heads: a.heads,
        kv_heads: a.heads,
        q_len: s,
        kv_len: s,
        head_dim: a.head_dim,
        head_dim_v: a.head_dim,
    };
    let causal = Mask::Causal { offset: 0 };
    let splash = |fused: bool| {
        SplashAttention::new(
            causal.clone(),
            dims,
            DType::F32,
            BlockSizes::uniform(a.block, a.block).with_fused_bwd(fused),
            SplashOptions::default(),
            TargetRules::tpu(),
        )
    };
    let pairs = causal_pairs * a.heads as f64;
    let inputs = super::bench_inputs(dims);
    let config = format!(
        "f32 B=1 H={} S={s} D={} causal blocks {}",
        a.heads, a.head_dim, a.block
    );
    let mut seen = Vec::new();
    for fused in [true, false] {
        let attn = splash(fused)?;
        let mut env = input_env(&client, &inputs)?;
        let feats = Features::default();
        let mut plan = attn.forward_plan(feats);
        plan.extend(attn.backward_plan(feats));
        for p in stage_programs(&client, &attn, &plan, &mut env, pairs, "")? {
            if seen.contains(&p.name) {
                continue;
            }
            seen.push(p.name.clone());
            rows.push(Row {
                kernel: p.name.clone(),
                config: config.clone(),
                dtype: DType::F32,
            });
            programs.push(p);
        }
    }
    if !a.no_dense {
        let attn = splash(true)?;
        for (pass, name, flops) in [
            (Pass::Forward, "dense_attention_fwd", 4.0),
            (Pass::ForwardBackward, "dense_attention_fwdbwd", 14.0),
        ] {
            let m = dense_program(dims, DType::F32, &causal, attn.scale(), None, pass)?;
            let count = if pass == Pass::Forward { 3 } else { 4 };
            let bufs = super::input_buffers(&client, &inputs[..count])?;
            let flops = flops * a.head_dim as f64 * pairs;
            programs.push(Timed::new(&client, name, &m, bufs, flops, false)?);
            rows.push(Row {
                kernel: name.into(),
                config: format!(
                    "f32 B=1 H={} S={s} D={} causal, XLA alone",
                    a.heads, a.head_dim
                ),
                dtype: DType::F32,
            });
        }
    }
    for info in registry::KERNELS {
        if !rows.iter().any(|r| r.kernel == info.name) {
            bail!(
                "kernel `{}` is registered but has no benchmark case; add one to `tessera bench \
                 kernels` (src/cli/bench/kernels.rs)",
                info.name
            );
        }
    }
    time_all(&mut programs, a.reps)?;
    let peak: HashMap<DType, f64> = [DType::F32, DType::BF16]
        .into_iter()
        .zip(&programs)
        .map(|(d, p)| (d, p.gflops()))
        .collect();
    outln!(
        "every registered kernel on the XLA CPU plugin beside XLA's own dot (best of {}, \
         interleaved, one process)",
        a.reps
    );
    outln!(
        "{:<24} {:<40} {:>9} {:>9} {:>6} {:>9} {:>8}",
        "kernel",
        "config",
        "compile s",
        "best s",
        "cores",
        "GFLOP/s",
        "of peak"
    );
    let mut json = Vec::new();
    for (r, p) in rows.iter().zip(&programs) {
        let fraction = p.gflops() / peak[&r.dtype];
        outln!(
            "{:<24} {:<40} {:>9.2} {:>9.4} {:>6.2} {:>9.1} {:>7.1}%",
            r.kernel,
            r.config,
            p.compile_s,
            p.best_s,
            p.best_cpu_s / p.best_s,
            p.gflops(),
            100.0 * fraction
        );
        json.push(format!(
            "\"{}{}\":{{\"best_s\":{:.5},\"gflops\":{:.2},\"fraction_of_peak\":{fraction:.4}}}",
            r.kernel,
            if r.dtype == DType::BF16 { "_bf16" } else { "" },
            p.best_s,
            p.gflops()
        ));
    }
    outln!(
        "{{\"matmul_peak_gflops\":{:.2},\"matmul_peak_bf16_gflops\":{:.2},{}}}",
        peak[&DType::F32],
        peak[&DType::BF16],
        json.join(",")
    );
    Ok(())
}

/// A registered (non-splash) kernel built from `params`, lowered alone, with random inputs.
fn registry_program(
    client: &Client,
    kernel: &str,
    params: &[(&str, String)],
    flops: f64,
) -> Result<Timed> {
    let info = registry::find(kernel).map_err(anyhow::Error::msg)?;
    let given: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let (def, specs) = info.build(&given).map_err(anyhow::Error::msg)?;
    kernel_program(client, def, &specs, flops)
}

/// `def` instantiated for `specs` (TPU rules), lowered alone, with random inputs.
fn kernel_program(client: &Client, def: KernelDef, specs: &[ArgSpec], flops: f64) -> Result<Timed> {
    let k = def.instantiate(specs, &TargetRules::tpu())?;
    let module = tessera::dsl::stablehlo::lower_module(&k)?;
    let inputs = random_buffers(client, specs, 11)?;
    Timed::new(client, def.name(), &module, inputs, flops, true)
}

/// The tiled matmul kernel with square blocks of `block`.
pub(super) fn matmul_def(dtype: DType, block: usize) -> Result<KernelDef> {
    macro_rules! with_block {
        ($b:literal) => {
            match dtype {
                DType::BF16 => matmul::<bf16, $b, $b, $b>(),
                _ => matmul::<f32, $b, $b, $b>(),
            }
        };
    }
    Ok(match block {
        128 => with_block!(128),
        256 => with_block!(256),
        512 => with_block!(512),
        other => bail!("--matmul-block {other}: the bench instantiates 128, 256 or 512"),
    })
}
