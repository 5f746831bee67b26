//! `tessera bench kernels --target tpu:TOPOLOGY`: every registered kernel compiled for a TPU
//! topology by libtpu (compile-only, bf16; a kernel on a mesh over as many chips), with its cost read from the compiler's own
//! bundles (`tessera::tpu::cost`): cycles on the busiest TensorCore, the work summed over
//! cores, the MXU bound and scoped VMEM. The splash kernels are compiled in their programs
//! (forward + backward, fused and separate), so their block tables are known.

use anyhow::{bail, Result};
use tessera::dsl::{DType, Lowering};
use tessera::hlo::Module;
use tessera::registry::{self, bench_size};
use tessera::splash::{splash_program, BlockSizes, Dims, Mask, Pass, SplashAttention};
use tessera::tpu::cost::KernelCost;
use tessera::tpu::TpuTopology;

use super::kernels::{KernelsArgs, UNCHECKED};

/// Whether a program's kernels make their run-time checks (`--unchecked-too` adds the
/// checked kernels without them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    On,
    Off,
}

/// Compiles every registered kernel for `target` and prints its cost.
pub fn kernel_costs(a: &KernelsArgs, target: &str) -> Result<()> {
    let tpu = TpuTopology::parse(target)?;
    let kernels = Lowering::tpu();
    let size = |s: &registry::BenchSize| a.sizes.of(s);
    let s = size(&bench_size::SEQ);
    let (heads, head_dim, block) = (
        size(&bench_size::HEADS),
        size(&bench_size::HEAD_DIM),
        size(&bench_size::BLOCK),
    );
    let dtype = DType::BF16;
    let mut programs: Vec<(String, Module, Checks)> = Vec::new();
    // The registered kernels at their bf16 bench parameter sets (every set of a kernel that
    // has no bf16 one), a kernel on a mesh in a program of one partition per device; splash's
    // below, in their programs (forward + backward), so that their block tables are known.
    for info in registry::KERNELS {
        if info.name.starts_with("splash_") {
            continue;
        }
        let instances = info
            .bench
            .iter()
            .map(|set| info.bench_instance(set, |k| a.sizes.named(k)))
            .collect::<Result<Vec<_>, _>>()?;
        let has_bf16 = instances.iter().any(|i| i.dtype().ok() == Some(dtype));
        for instance in instances {
            if has_bf16 && instance.dtype()? != dtype {
                continue;
            }
            let devices = match instance.devices() {
                1 => String::new(),
                n => format!(" on {n} chips"),
            };
            let label = format!("{}{devices}", instance.label());
            let module = |lowering: &Lowering| {
                super::super::compile::kernel_module(
                    instance.def(),
                    instance.args(),
                    instance.mesh(),
                    lowering,
                )
            };
            programs.push((label.clone(), module(&kernels)?, Checks::On));
            let checked =
                instance
                    .def()
                    .instantiate_on(instance.args(), instance.mesh(), &kernels.rules)?;
            if a.unchecked_too && checked.checks.flags.is_some() {
                let unchecked = Lowering {
                    rules: kernels.rules.clone().without_run_time_checks(),
                    ..kernels.clone()
                };
                programs.push((
                    format!("{label}, {UNCHECKED}"),
                    module(&unchecked)?,
                    Checks::Off,
                ));
            }
        }
    }
    let dims = Dims {
        batch: 1,
        heads,
        kv_heads: heads,
        q_len: s,
        kv_len: s,
        head_dim,
        head_dim_v: head_dim,
    };
    for fused in [true, false] {
        let attn = SplashAttention::new(
            Mask::causal(),
            dims,
            dtype,
            BlockSizes::uniform(block, block).with_fused_bwd(fused),
            Default::default(),
            kernels.clone(),
        )?;
        programs.push((
            format!(
                "bf16 B=1 H={} S={s} D={} causal blocks {}",
                heads, head_dim, block
            ),
            splash_program(&attn, Pass::ForwardBackward, Default::default())?,
            Checks::On,
        ));
    }
    let mut rows: Vec<(String, KernelCost, Checks)> = Vec::new();
    for (config, program, checks) in &programs {
        let report = tpu.compile(program)?;
        let Some(costs) = report.kernel_costs else {
            bail!(
                "libtpu was loaded without its dumps, so the kernels' costs cannot be read; \
                 `tessera bench kernels --target` asks for them at start (is LIBTPU_INIT_ARGS \
                 naming an unwritable --xla_jf_dump_to?)"
            );
        };
        for c in costs {
            if !rows
                .iter()
                .any(|(_, r, with)| r.kernel == c.kernel && with == checks)
            {
                rows.push((config.clone(), c, *checks));
            }
        }
    }
    for info in registry::KERNELS {
        if !rows.iter().any(|(_, c, _)| c.kernel == info.name) {
            bail!(
                "kernel `{}` is registered but has no TPU cost case; add one to `tessera bench \
                 kernels --target` (src/cli/bench/tpu_costs.rs)",
                info.name
            );
        }
    }
    outln!(
        "every registered kernel compiled for {} by libtpu, read from its bundles (cycles \
         without DMA waits or MXU stalls)",
        tpu.topology()
    );
    for (_, c, _) in &rows {
        outln!("{}", c.table());
    }
    outln!(
        "{:<18} {:<36} {:>12} {:>12} {:>9} {:>6} {:>9}",
        "kernel",
        "config",
        "cycles/core",
        "all cores",
        "/MXU bnd",
        "MXU %",
        "VMEM MiB"
    );
    for (config, c, _) in &rows {
        let over_bound = match c.mxu_bound_per_core {
            0 => "-".to_string(),
            b => format!("{:.2}", c.cycles_per_core as f64 / b as f64),
        };
        outln!(
            "{:<18} {:<36} {:>12} {:>12} {:>9} {:>6.1} {:>9}",
            c.kernel,
            config,
            c.cycles_per_core,
            c.cycles_all_cores,
            over_bound,
            100.0 * c.mxu_utilisation,
            c.scoped_vmem_bytes.map_or("?".into(), |b| format!(
                "{:.2}",
                b as f64 / (1u64 << 20) as f64
            ))
        );
    }
    let json = rows
        .iter()
        .map(|(_, c, checks)| {
            let mut row = serde_json::to_value(c)?;
            row["run_time_checks"] = (*checks == Checks::On).into();
            Ok(row.to_string())
        })
        .collect::<Result<Vec<String>>>()?;
    outln!(
        "{{\"topology\":\"{}\",\"kernel_costs\":[{}]}}",
        tpu.topology(),
        json.join(",")
    );
    Ok(())
}
