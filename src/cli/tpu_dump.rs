//! `tessera tpu-dump-report DIR`: the cost of every Mosaic kernel libtpu dumped into DIR (a
//! peer's compile, e.g. JAX's with `LIBTPU_INIT_ARGS=--xla_jf_dump_to=DIR
//! --xla_jf_dump_llo_pass_label_regex=final`), read as `tessera compile` reads its own.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tessera::dsl::mosaic::KernelSchedule;
use tessera::tpu::cost::{read_dump_dir, tensorcores_per_chip};
use tessera::tpu::TpuTopology;

/// Arguments of `tessera tpu-dump-report`.
#[derive(Args, Debug)]
pub struct TpuDumpReportArgs {
    /// The directory libtpu dumped into (`--xla_jf_dump_to`); XLA's `*after_codegen.txt`
    /// dumps anywhere under it give the kernels' scoped VMEM.
    pub dir: PathBuf,
    /// A JSON file with the schedule of a kernel's `when`s, or a list of them (`[{"kernel":
    /// "k", "grid": [..], "dimension_semantics": [..], "paths": [{"path": "init", "runs":
    /// [..]}, ..]}, ..]`); tessera's own kernels carry theirs. Repeatable.
    #[arg(long = "schedules", value_name = "FILE")]
    pub schedules: Vec<PathBuf>,
    /// The topology the dumps were compiled for (its chip's TensorCores split the grid).
    #[arg(long, default_value = "tpu:v5p:2x2x1")]
    pub target: String,
}

/// Runs `tessera tpu-dump-report`.
pub fn tpu_dump_report(a: &TpuDumpReportArgs) -> Result<()> {
    let target = TpuTopology::parse(&a.target)?;
    let mut schedules = Vec::new();
    for path in &a.schedules {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        schedules.extend(
            KernelSchedule::list_from_json(&text)
                .with_context(|| format!("reading the schedules in {}", path.display()))?,
        );
    }
    let costs = read_dump_dir(&a.dir, &schedules, tensorcores_per_chip(target.topology()))?;
    if costs.is_empty() {
        anyhow::bail!(
            "{} holds no Mosaic kernel dumps; compile with LIBTPU_INIT_ARGS=\"--xla_jf_dump_to={} \
             --xla_jf_dump_llo_pass_label_regex=final\" (set before libtpu loads)",
            a.dir.display(),
            a.dir.display()
        );
    }
    for c in &costs {
        outln!("{}", c.table());
    }
    let json: Vec<String> = costs.iter().map(|c| c.to_json()).collect();
    outln!("{{\"kernel_costs\":[{}]}}", json.join(","));
    Ok(())
}

impl super::Command {
    /// Whether the command reports the cost of compiled Mosaic kernels, read from libtpu's
    /// dumps (which must be asked for before libtpu loads).
    pub fn reads_kernel_costs(&self) -> bool {
        match self {
            // The train step's report does not list its kernels' costs (yet): its compiles
            // skip the dumps of its many fusions, unless `auto` blocks ask `tessera tune`'s
            // search (which reads them).
            super::Command::Compile(c) => match &c.what {
                super::compile::CompileWhat::Train(t) => t.step.has_auto_blocks(),
                _ => true,
            },
            super::Command::Tune(_) => true,
            super::Command::Bench {
                what: super::bench::BenchCommand::Kernels(a),
            } => a.target.is_some(),
            _ => false,
        }
    }
}
