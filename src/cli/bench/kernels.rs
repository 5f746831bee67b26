//! `tessera bench kernels`: every registered kernel at a realistic size on the XLA CPU
//! plugin, beside XLA's own dot (the matmul peak, f32 and bf16) and dense attention, all in
//! one process and timed side by side; each kernel's GFLOP/s as a fraction of the peak of
//! its dtype.

use std::collections::HashMap;

use anyhow::Result;
use tessera::dsl::{DType, KernelRules};
use tessera::hlo::{Module, TensorType};
use tessera::registry::{self, Instance};
use tessera::runtime::{Client, HostBuffer};
use tessera::splash::{
    dense_program, BlockSizes, Dims, Mask, Pass, SplashAttention, SplashOptions,
};

use super::timing::{peak_program, peak_spread_line, time_all, Timed};

/// Arguments of `tessera bench kernels`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelsArgs {
    /// Square size of the matmuls (the tiled kernel and XLA's dot, the peak).
    #[arg(long, default_value_t = 2048, value_parser = super::super::positive)]
    pub matmul_size: usize,
    /// Block size of the tiled matmul kernel (all three dims), one of the registry's block
    /// sizes.
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

impl KernelsArgs {
    /// The value of the size named `knob` in the registry's bench parameters
    /// ([`registry::BENCH_KNOBS`]): the flag of that name.
    pub(super) fn knob(&self, knob: &str) -> Option<String> {
        let value = match knob {
            "matmul_size" => self.matmul_size,
            "matmul_block" => self.matmul_block,
            "seq" => self.seq,
            "heads" => self.heads,
            "head_dim" => self.head_dim,
            "block" => self.block,
            "flash_block" => self.flash_block,
            "softmax_block" => self.softmax_block,
            _ => return None,
        };
        Some(value.to_string())
    }
}

/// Runs `tessera bench kernels`: every registered kernel at each of its bench parameter
/// sets, beside XLA's dot and dense attention.
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
    for info in registry::KERNELS {
        for set in info.bench {
            let instance = info.bench_instance(set, |k| a.knob(k))?;
            rows.push(Row {
                kernel: info.name.into(),
                config: instance.label(),
                dtype: instance.dtype()?,
            });
            programs.push(instance_program(&client, &instance)?);
        }
    }
    if !a.no_dense {
        let s = a.seq;
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
        let attn = SplashAttention::new(
            causal.clone(),
            dims,
            DType::F32,
            BlockSizes::uniform(a.block, a.block),
            SplashOptions::default(),
            KernelRules::tpu(),
        )?;
        let pairs = attn.visible_pairs();
        let inputs = super::bench_inputs(dims);
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
    for p in &programs[..2] {
        outln!("the peak, {}", peak_spread_line(p));
    }
    let width = rows.iter().map(|r| r.config.len()).max().unwrap_or(0);
    outln!(
        "{:<24} {:<width$} {:>9} {:>9} {:>6} {:>9} {:>8}",
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
            "{:<24} {:<width$} {:>9.2} {:>9.4} {:>6.2} {:>9.1} {:>7.1}%",
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
        "{{\"matmul_peak_gflops\":{:.2},\"matmul_peak_bf16_gflops\":{:.2},\
         \"matmul_peak_spread\":{:.3},\"matmul_peak_bf16_spread\":{:.3},{}}}",
        peak[&DType::F32],
        peak[&DType::BF16],
        programs[0].spread(),
        programs[1].spread(),
        json.join(",")
    );
    Ok(())
}

/// A registered kernel instantiated under the TPU rules and lowered alone, as a whole program
/// holds it (the arguments its parameters fix, splash's tables, inlined as constants), with
/// random data on the device.
fn instance_program(client: &Client, instance: &Instance) -> Result<Timed> {
    let def = instance.def();
    let k = def.instantiate(instance.args(), &KernelRules::tpu())?;
    let mut module = Module::new(format!("bench_{}", def.name()));
    let mut f = module.func("main");
    let arrays = instance.random_inputs(11);
    let mut values = Vec::with_capacity(arrays.len());
    let mut buffers = Vec::new();
    for (i, a) in arrays.iter().enumerate() {
        if instance.is_fixed(i) {
            values.push(f.constant(a)?);
        } else {
            let dims: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
            values.push(f.arg(TensorType::new(dims, a.dtype()))?);
            buffers.push(client.buffer_from_host(&HostBuffer::from_array(a)?, 0)?);
        }
    }
    let outs = tessera::dsl::stablehlo::lower_into(&k, &mut f, &values)?;
    f.finish(&outs)?;
    Timed::new(
        client,
        def.name(),
        &module,
        buffers,
        instance.flops()?,
        true,
    )
}
