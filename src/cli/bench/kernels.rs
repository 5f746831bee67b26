//! `tessera bench kernels`: every registered kernel at a realistic size on the XLA CPU
//! plugin, beside XLA's own dot (the matmul peak, f32 and bf16) and dense attention, all in
//! one process and timed side by side; each kernel's GFLOP/s as a fraction of the peak of
//! its dtype. A kernel on a device mesh runs on as many CPU devices (one SPMD program). Where
//! the registry has XLA's own program for what a kernel computes (paged attention: a dense
//! gather of the pages, then attention; the all-gather and the all-gather matmul: XLA's
//! `all_gather`, and its dot, on the same devices), it is timed beside the kernel on the
//! same arguments and the kernel's time over XLA's is printed.

use std::collections::HashMap;

use anyhow::Result;
use tessera::backend::Platform;
use tessera::dsl::{DType, KernelRules};
use tessera::hlo::{Module, TensorType};
use tessera::registry::{self, bench_size, Instance};
use tessera::runtime::{Client, HostBuffer};
use tessera::splash::{
    dense_program, BlockSizes, Dims, Mask, Pass, SplashAttention, SplashOptions,
};

use super::timing::{peak_program, peak_spread_line, time_all, Timed};

/// Arguments of `tessera bench kernels`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelsArgs {
    /// The sizes (`--matmul-size`, `--seq`, ...): the registry's [`registry::BENCH_SIZES`].
    #[command(flatten)]
    pub sizes: BenchSizes,
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
    /// Beside every kernel that makes run-time index checks, the same kernel instantiated
    /// without them (`KernelRules::without_run_time_checks`), timed (or compiled) in the same
    /// run: what the checks cost.
    #[arg(long)]
    pub unchecked_too: bool,
}

/// How a row names a kernel instantiated without its run-time checks.
pub(super) const UNCHECKED: &str = "run-time checks off";

/// One row of the table: a program and the dtype whose peak it is compared with.
struct Row {
    /// The registered kernel measured, or what XLA computes.
    kernel: String,
    config: String,
    dtype: DType,
    /// For a kernel's row, the index of the row of XLA's own program for it.
    xla: Option<usize>,
    /// For a kernel's row measured without its run-time checks, the index of the checked
    /// kernel's row.
    checked: Option<usize>,
}

/// The values of the registry's bench sizes ([`registry::BENCH_SIZES`]), one flag each
/// (`matmul_size`: `--matmul-size`), with the table's defaults and help: the sizes are
/// written once, in the registry, so the flags are made from it rather than derived.
#[derive(Debug, Clone, Default)]
pub struct BenchSizes(HashMap<&'static str, usize>);

impl BenchSizes {
    /// The value of `size`.
    pub fn of(&self, size: &registry::BenchSize) -> usize {
        self.0.get(size.name).copied().unwrap_or(size.default)
    }

    /// The value of the size named `name`, as a bench parameter takes it.
    pub fn named(&self, name: &str) -> Option<String> {
        let size = registry::BENCH_SIZES.iter().find(|s| s.name == name)?;
        Some(self.of(size).to_string())
    }
}

impl clap::FromArgMatches for BenchSizes {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut sizes = BenchSizes::default();
        sizes.update_from_arg_matches(matches)?;
        Ok(sizes)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for size in registry::BENCH_SIZES {
            if let Some(&value) = matches.get_one::<usize>(size.name) {
                self.0.insert(size.name, value);
            }
        }
        Ok(())
    }
}

impl clap::Args for BenchSizes {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        registry::BENCH_SIZES.iter().fold(cmd, |cmd, size| {
            cmd.arg(
                clap::Arg::new(size.name)
                    .long(size.name.replace('_', "-"))
                    .value_name(size.name.to_uppercase())
                    .value_parser(super::super::positive)
                    .default_value(size.default.to_string())
                    .help(size.help),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
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
    let n = a.sizes.of(&bench_size::MATMUL_SIZE);
    for dtype in [DType::F32, DType::BF16] {
        programs.push(peak_program(&client, n, dtype)?);
        rows.push(Row {
            kernel: "xla_dot".into(),
            config: format!("{dtype} {n}^3 (the peak)"),
            dtype,
            xla: None,
            checked: None,
        });
    }
    for info in registry::KERNELS {
        for set in info.bench {
            let instance = info.bench_instance(set, |k| a.sizes.named(k))?;
            let devices = match instance.devices() {
                1 => String::new(),
                d => format!(" on {d} devices"),
            };
            let config = format!("{}{devices}", instance.label());
            let dtype = instance.dtype()?;
            let rules = KernelRules::tpu();
            let (kernel, xla) = instance_programs(&instance, &rules, true)?;
            let at = rows.len();
            rows.push(Row {
                kernel: info.name.into(),
                config: config.clone(),
                dtype,
                xla: None,
                checked: None,
            });
            programs.push(kernel);
            if let Some(xla) = xla {
                rows[at].xla = Some(rows.len());
                rows.push(Row {
                    kernel: format!("xla_{}", info.name),
                    config: format!("{config}, XLA alone"),
                    dtype,
                    xla: None,
                    checked: None,
                });
                programs.push(xla);
            }
            if a.unchecked_too && instance.instantiate(&rules)?.checks.flags.is_some() {
                let unchecked = rules.without_run_time_checks();
                let (kernel, _) = instance_programs(&instance, &unchecked, false)?;
                rows.push(Row {
                    kernel: info.name.into(),
                    config: format!("{config}, {UNCHECKED}"),
                    dtype,
                    xla: None,
                    checked: Some(at),
                });
                programs.push(kernel);
            }
        }
    }
    if !a.no_dense {
        let s = a.sizes.of(&bench_size::SEQ);
        let (heads, head_dim) = (
            a.sizes.of(&bench_size::HEADS),
            a.sizes.of(&bench_size::HEAD_DIM),
        );
        let block = a.sizes.of(&bench_size::BLOCK);
        let dims = Dims {
            batch: 1,
            heads,
            kv_heads: heads,
            q_len: s,
            kv_len: s,
            head_dim,
            head_dim_v: head_dim,
        };
        let causal = Mask::Causal { offset: 0 };
        let attn = SplashAttention::new(
            causal.clone(),
            dims,
            DType::F32,
            BlockSizes::uniform(block, block),
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
            let flops = flops * head_dim as f64 * pairs;
            programs.push(Timed::new(&client, name, &m, bufs, flops, false)?);
            rows.push(Row {
                kernel: name.into(),
                config: format!("f32 B=1 H={} S={s} D={} causal, XLA alone", heads, head_dim),
                dtype: DType::F32,
                xla: None,
                checked: None,
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
        // A kernel that only moves data has no GFLOP/s.
        let (gflops, of_peak) = if p.flops > 0.0 {
            (
                format!("{:.1}", p.gflops()),
                format!("{:.1}%", 100.0 * fraction),
            )
        } else {
            ("-".into(), "-".into())
        };
        outln!(
            "{:<24} {:<width$} {:>9.2} {:>9.4} {:>6.2} {:>9} {:>8}",
            r.kernel,
            r.config,
            p.compile_s,
            p.best_s,
            p.best_cpu_s / p.best_s,
            gflops,
            of_peak
        );
        let mut fields = vec![format!("\"best_s\":{:.5}", p.best_s)];
        if p.flops > 0.0 {
            fields.push(format!("\"gflops\":{:.2}", p.gflops()));
            fields.push(format!("\"fraction_of_peak\":{fraction:.4}"));
        }
        if let Some(x) = r.xla {
            fields.push(format!("\"over_xla\":{:.4}", p.best_s / programs[x].best_s));
        }
        if let Some(c) = r.checked {
            fields.push(format!(
                "\"over_checked\":{:.4}",
                p.best_s / programs[c].best_s
            ));
        }
        json.push(format!(
            "\"{}{}{}\":{{{}}}",
            r.kernel,
            if r.dtype == DType::BF16 { "_bf16" } else { "" },
            if r.checked.is_some() {
                "_unchecked"
            } else {
                ""
            },
            fields.join(",")
        ));
    }
    for (r, p) in rows.iter().zip(&programs) {
        if let Some(x) = r.xla {
            outln!(
                "{} {}: {:.4} s, XLA's own program {:.4} s: {:.2}x XLA's time",
                r.kernel,
                r.config,
                p.best_s,
                programs[x].best_s,
                p.best_s / programs[x].best_s
            );
        }
        if let Some(c) = r.checked {
            outln!(
                "{} {}: {:.4} s, with its run-time checks {:.4} s: the checks cost {:+.1}%",
                r.kernel,
                r.config,
                p.best_s,
                programs[c].best_s,
                100.0 * (programs[c].best_s / p.best_s - 1.0)
            );
        }
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

/// A registered kernel instantiated under `rules` and lowered alone, as a whole program
/// holds it (the arguments its parameters fix, splash's tables, inlined as constants), with
/// random data on the device; a kernel on a mesh as one SPMD program on as many CPU devices
/// (`tessera::backend::kernel_spmd_program`). Beside it, XLA's own program for the same
/// computation on the same data, where the registry has one and `with_xla` asks for it; where
/// it has one, the kernel takes every argument (paged attention's lengths and page table too)
/// from the device, as XLA's program does and a decode step would.
fn instance_programs(
    instance: &Instance,
    rules: &KernelRules,
    with_xla: bool,
) -> Result<(Timed, Option<Timed>)> {
    let def = instance.def();
    let k = instance.instantiate(rules)?;
    let devices = instance.devices();
    let client = Client::cpu_shared(devices)?;
    let arrays = instance.random_inputs(11);
    let flops = instance.flops()?;
    // Every argument on its device (XLA's program takes them all).
    let on_devices = |fixed_too: bool| -> Result<Vec<Vec<_>>> {
        let mut per_device = Vec::new();
        for (d, device) in arrays.iter().enumerate() {
            let mut buffers = Vec::new();
            for (i, a) in device.iter().enumerate() {
                if fixed_too || !instance.is_fixed(i) {
                    buffers.push(client.buffer_from_host(&HostBuffer::from_array(a)?, d)?);
                }
            }
            per_device.push(buffers);
        }
        Ok(per_device)
    };
    let xla = instance.xla_program();
    // Where XLA has a program, the kernel takes its fixed arguments from the device as XLA's
    // does (with or without XLA's timed beside it).
    let inline = xla.is_none();
    let xla = xla.filter(|_| with_xla);
    let kernel = if devices > 1 {
        let module = tessera::backend::kernel_spmd_program(&k, Platform::Cpu)?;
        Timed::on_devices(&client, def.name(), &module, on_devices(true)?, flops, true)?
    } else {
        let mut module = Module::new(format!("bench_{}", def.name()));
        let mut f = module.func("main");
        let mut values = Vec::with_capacity(arrays[0].len());
        for (i, a) in arrays[0].iter().enumerate() {
            if inline && instance.is_fixed(i) {
                values.push(f.constant(a)?);
            } else {
                let dims: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
                values.push(f.arg(TensorType::new(dims, a.dtype()))?);
            }
        }
        let outs = tessera::dsl::stablehlo::lower_into(&k, &mut f, &values)?;
        f.finish(&outs)?;
        let buffers = on_devices(!inline)?.remove(0);
        Timed::new(&client, def.name(), &module, buffers, flops, true)?
    };
    let xla = match xla {
        None => None,
        Some(module) => {
            let name = format!("xla {}", def.name());
            Some(if devices > 1 {
                Timed::on_devices(&client, name, &module?, on_devices(true)?, flops, false)?
            } else {
                let buffers = on_devices(true)?.remove(0);
                Timed::new(&client, name, &module?, buffers, flops, false)?
            })
        }
    };
    Ok((kernel, xla))
}
