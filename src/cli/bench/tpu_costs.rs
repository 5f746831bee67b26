//! `tessera bench kernels --target tpu:TOPOLOGY`: every registered kernel compiled for a TPU
//! topology by libtpu (compile-only, bf16), with its cost read from the compiler's own
//! bundles (`tessera::tpu::cost`): cycles on the busiest TensorCore, the work summed over
//! cores, the MXU bound and scoped VMEM. The splash kernels are compiled in their programs
//! (forward + backward, fused and separate), so their block tables are known.

use anyhow::{bail, Result};
use tessera::dsl::{ArgSpec, DType, Target};
use tessera::hlo::Module;
use tessera::registry;
use tessera::splash::{splash_program, BlockSizes, Dims, Mask, Pass, SplashAttention};
use tessera::tpu::cost::KernelCost;
use tessera::tpu::TpuTarget;

use super::kernels::{matmul_def, KernelsArgs};

/// Compiles every registered kernel for `target` and prints its cost.
pub fn kernel_costs(a: &KernelsArgs, target: &str) -> Result<()> {
    let tpu = TpuTarget::parse(target)?;
    let kernels = Target::tpu();
    let (n, s) = (a.matmul_size, a.seq);
    let dtype = DType::BF16;
    let mut programs: Vec<(String, Module)> = Vec::new();
    let def = matmul_def(dtype, a.matmul_block)?;
    let specs = vec![ArgSpec::new(dtype, [n, n]); 2];
    programs.push((
        format!("bf16 {n}^3 blocks {}", a.matmul_block),
        super::super::compile::kernel_module(&def, &specs, &kernels)?,
    ));
    let registered = |name: &str, params: &[(&str, String)]| -> Result<Module> {
        let given: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .chain([("dtype".to_string(), "bf16".to_string())])
            .collect();
        let (def, specs) = registry::find(name)
            .map_err(anyhow::Error::msg)?
            .build(&given)
            .map_err(anyhow::Error::msg)?;
        super::super::compile::kernel_module(&def, &specs, &kernels)
    };
    programs.push((
        format!("bf16 {s}x{s} rows {}", a.softmax_block),
        registered(
            "row_softmax",
            &[
                ("BR", a.softmax_block.to_string()),
                ("R", s.to_string()),
                ("C", s.to_string()),
            ],
        )?,
    ));
    let fb = a.flash_block.to_string();
    programs.push((
        format!("bf16 S={s} D={} causal blocks {fb}", a.head_dim),
        registered(
            "flash_attention",
            &[
                ("BQ", fb.clone()),
                ("BKV", fb),
                ("causal", "true".into()),
                ("S", s.to_string()),
                ("D", a.head_dim.to_string()),
            ],
        )?,
    ));
    let dims = Dims {
        batch: 1,
        heads: a.heads,
        kv_heads: a.heads,
        q_len: s,
        kv_len: s,
        head_dim: a.head_dim,
        head_dim_v: a.head_dim,
    };
    for fused in [true, false] {
        let attn = SplashAttention::new(
            Mask::causal(),
            dims,
            dtype,
            BlockSizes::uniform(a.block, a.block).with_fused_bwd(fused),
            Default::default(),
            kernels.clone(),
        )?;
        programs.push((
            format!(
                "bf16 B=1 H={} S={s} D={} causal blocks {}",
                a.heads, a.head_dim, a.block
            ),
            splash_program(&attn, Pass::ForwardBackward, Default::default())?,
        ));
    }
    let mut rows: Vec<(String, KernelCost)> = Vec::new();
    for (config, program) in &programs {
        let report = tpu.compile(program)?;
        let Some(costs) = report.kernel_costs else {
            bail!(
                "libtpu was loaded without its dumps, so the kernels' costs cannot be read; \
                 `tessera bench kernels --target` asks for them at start (is LIBTPU_INIT_ARGS \
                 naming an unwritable --xla_jf_dump_to?)"
            );
        };
        for c in costs {
            if !rows.iter().any(|(_, r)| r.kernel == c.kernel) {
                rows.push((config.clone(), c));
            }
        }
    }
    for info in registry::KERNELS {
        if !rows.iter().any(|(_, c)| c.kernel == info.name) {
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
    for (_, c) in &rows {
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
    for (config, c) in &rows {
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
    let json: Vec<String> = rows.iter().map(|(_, c)| c.to_json()).collect();
    outln!(
        "{{\"topology\":\"{}\",\"kernel_costs\":[{}]}}",
        tpu.topology(),
        json.join(",")
    );
    Ok(())
}
