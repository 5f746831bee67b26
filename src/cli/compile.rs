//! `tessera compile`: a program compiled for a TPU topology by the real TPU compiler (libtpu,
//! compile-only, no TPU needed), every kernel a Mosaic `tpu_custom_call`. Splash attention
//! (one device, or context parallel on N devices) or any registered kernel.
//!
//! What tessera's own rules know (block sizes that do not divide, TPU tiling, VMEM, dtypes)
//! is refused before the compiler runs, naming the culprit; what the compiler refuses is
//! shown verbatim with the name of the kernel it refuses. On success the last line printed
//! is one JSON object per compiled program (see `tessera::tpu::CompileReport::to_json`).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use tessera::dsl::{ArgSpec, DType, KernelCostEstimates, Lowering};
use tessera::hlo::Module;
use tessera::parallel::ContextParallel;
use tessera::registry;
use tessera::splash::{
    splash_program, BlockSizes, Dims, Features, Mask, Pass, SplashAttention, SplashOptions,
};
use tessera::tpu::{CompileReport, TpuCompileError, TpuTopology};

use super::attention::{AttentionFlags, Partitioning};
use super::compile_train::{compile_train, CompileTrainArgs};
use super::outputs::{Kind, Outputs};
use super::{parse_arg, parse_param};

/// Arguments of `tessera compile`.
#[derive(Args, Debug)]
pub struct CompileArgs {
    /// The TPU topology to compile for: tpu:v5p:2x2x1, tpu:v5e:2x2, tpu:v6e:2x2, ...
    #[arg(long, global = true, default_value = "tpu:v5p:2x2x1")]
    pub target: String,
    /// Write each Mosaic kernel's module to DIR/KERNEL.mlir (DIR is created; its parent must
    /// exist). Written when the compile succeeds, and also when the compiler rejects the
    /// program, so what it rejected can be read.
    #[arg(long, global = true, value_name = "DIR")]
    pub emit_mosaic: Option<PathBuf>,
    /// Write the StableHLO program to FILE (written as --emit-mosaic is).
    #[arg(long, global = true, value_name = "FILE")]
    pub emit_stablehlo: Option<PathBuf>,
    /// The scoped VMEM budget every kernel is checked against and compiled with, in MiB
    /// (default 16, v5e's default scoped limit).
    #[arg(long, global = true, value_name = "MIB")]
    pub vmem_limit_mib: Option<usize>,
    /// Compile the Mosaic calls without their cost estimates, as JAX's Pallas calls made
    /// without one (JAX's splash, so MaxText's steps): libtpu's cost analysis then prices each
    /// call at next to nothing, so the whole-step estimate compares like for like with such a
    /// program's. The kernels' own cycle tables (read from libtpu's bundles) do not change.
    #[arg(long, global = true)]
    pub omit_kernel_cost_estimates: bool,
    #[command(subcommand)]
    pub what: CompileWhat,
}

#[derive(Subcommand, Debug)]
pub enum CompileWhat {
    /// Splash attention: forward, backward (dq and dkv kernels, or the fused kernel) or both.
    Attention(Box<CompileAttentionArgs>),
    /// The whole train step (forward, backward, gradient reduction, AdamW) of a model on a
    /// (data or fsdp) x context mesh whose product is the topology's device count, with
    /// MaxText's flags; printed beside the step-time model's prediction.
    Train(Box<CompileTrainArgs>),
    /// A registered kernel (see `tessera kernels`), alone in a program (one partition per
    /// device of its mesh for the collective ones).
    Kernel {
        /// Kernel name.
        name: String,
        /// A compile-time parameter or default array size, NAME=VALUE (repeatable).
        #[arg(long = "param", short = 'p', value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Override an argument's type, e.g. `--arg bf16[256,512]` (repeat in argument order).
        #[arg(long = "arg", value_parser = parse_arg)]
        args: Vec<ArgSpec>,
    },
}

/// Which passes of the attention to compile.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassArg {
    /// The forward kernel: q, k, v -> out, lse.
    Forward,
    /// The forward kernel without its lse residual: q, k, v -> out (a forward no backward
    /// follows, as JAX's splash without `save_residuals`; not with --strategy).
    Inference,
    /// The backward kernels: q, k, v, out, lse, dout -> dq, dk, dv (with --strategy: the
    /// forward + backward program, q, k, v, dout -> out, lse, dq, dk, dv).
    Backward,
    /// Forward and backward in one program.
    Both,
}

/// Arguments of `tessera compile attention`.
#[derive(Args, Debug)]
pub struct CompileAttentionArgs {
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Query heads H.
    #[arg(long)]
    pub heads: usize,
    /// Key/value heads (divides H; default H).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Sequence length of queries and keys.
    #[arg(long)]
    pub seq_len: usize,
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    /// Element type of q, k and v: bf16 or f32.
    #[arg(long, default_value = "bf16", value_parser = super::compute_dtype)]
    pub dtype: DType,
    /// full, causal, causal:OFFSET, local:LEFT:RIGHT or chunked:SIZE.
    #[arg(long, default_value = "causal")]
    pub mask: String,
    /// Query block of the forward and dq kernels (default: the largest divisor of the
    /// sequence up to 512 that is a multiple of 16).
    #[arg(long)]
    pub block_q: Option<usize>,
    /// Key block of the forward and dq kernels (default: the largest divisor of the
    /// sequence up to 512 that is a multiple of 128).
    #[arg(long)]
    pub block_kv: Option<usize>,
    /// Query block of the dkv (or fused) kernel (default --block-q).
    #[arg(long)]
    pub block_q_dkv: Option<usize>,
    /// Key block of the dkv (or fused) kernel (default --block-kv).
    #[arg(long)]
    pub block_kv_dkv: Option<usize>,
    /// Keys the dq kernel computes at a time within its key block (default: 256 of a
    /// 512 block, 512 of a block of 2048 or more, else the whole block; splash's
    /// `default_dq_compute_block` says what was measured).
    #[arg(long)]
    pub block_kv_dq_compute: Option<usize>,
    /// The diagonal sub-tile of every kernel with square blocks: blocks the mask leaves full
    /// below the diagonal and empty above it are computed by sub-tiles of this size, those
    /// above the diagonal skipped (default: 256 for blocks of 1024 or more, and for dK/dV
    /// 128 of a 512 block, dQ 512; a sub-tile the size of the block turns the skip off;
    /// splash's `default_*diagonal_block` say what was measured).
    #[arg(long)]
    pub block_diagonal: Option<usize>,
    /// The fused dq+dkv backward kernel instead of separate dq and dkv kernels.
    #[arg(long)]
    pub fused_bwd: bool,
    #[arg(long, value_enum, default_value = "both")]
    pub pass: PassArg,
    /// Take segment ids [B, S] int32 (packed sequences).
    #[arg(long)]
    pub segment_ids: bool,
    #[arg(long, help = super::strategies_help("Context parallelism on --devices devices", ""))]
    pub strategy: Option<String>,
    /// Devices of the context axis, with --strategy (default 4, or U x R for usp:UxR).
    #[arg(long, requires = "strategy")]
    pub devices: Option<usize>,
    #[arg(long, requires = "strategy", help = super::load_balance_help("Causal load balancing for", ""))]
    pub load_balance: bool,
    /// Logit scale (default 1/sqrt(D)). `--scale 1` is a caller that scales q itself, as
    /// JAX's splash kernels (which take no scale) require and MaxText does: the kernels then
    /// multiply by nothing.
    #[arg(long)]
    pub scale: Option<f32>,
}

/// The VMEM budget `count` units of `unit` bytes (`flag` named it), checked against what
/// `target`'s chip has, without overflow.
pub(super) fn vmem_limit(
    flag: &str,
    count: usize,
    unit: usize,
    target: &TpuTopology,
) -> Result<usize> {
    if count == 0 {
        bail!("{flag} must be at least 1");
    }
    let chip = target.chip();
    match count.checked_mul(unit) {
        Some(bytes) if bytes <= chip.vmem_bytes => Ok(bytes),
        _ => bail!(
            "{flag} {count} is more than the {} MiB of VMEM a {} TensorCore has; give at \
             most {}",
            chip.vmem_bytes >> 20,
            chip.name,
            chip.vmem_bytes / unit
        ),
    }
}

/// The emit outputs of `a`, checked (see `super::outputs`) before anything is built.
fn emit_outputs(a: &CompileArgs) -> Result<Outputs> {
    let mut outputs: Vec<(&str, &Path, Kind)> = Vec::new();
    if let Some(dir) = &a.emit_mosaic {
        outputs.push(("--emit-mosaic", dir, Kind::Dir));
    }
    if let Some(file) = &a.emit_stablehlo {
        outputs.push(("--emit-stablehlo", file, Kind::File));
    }
    Outputs::prepare_kinds(&outputs, &[])
}

/// Stages `program`'s emitted forms in `outputs` (those `a` asks for).
pub(super) fn stage_emits(a: &CompileArgs, outputs: &mut Outputs, program: &Module) -> Result<()> {
    if a.emit_mosaic.is_some() {
        outputs.write_with("--emit-mosaic", |dir| emit_mosaic(dir, program))?;
    }
    outputs.write_text_if("--emit-stablehlo", &program.to_mlir())
}

/// Compiles `program` for `target`; the emitted files are put in place when it compiles,
/// and also when the compiler rejects it (so what it rejected can be read).
pub(super) fn compile_and_commit(
    target: &TpuTopology,
    program: &Module,
    outputs: Outputs,
) -> Result<CompileReport> {
    match target.compile(program) {
        Ok(report) => {
            outputs.commit()?;
            Ok(report)
        }
        Err(e @ TpuCompileError::Compiler { .. }) => {
            outputs.commit()?;
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs `tessera compile`.
pub fn compile_command(a: &CompileArgs) -> Result<()> {
    let target = TpuTopology::parse(&a.target)?;
    let mut kernels = Lowering::tpu();
    if a.omit_kernel_cost_estimates {
        kernels.cost_estimates = KernelCostEstimates::Omitted;
    }
    if let Some(mib) = a.vmem_limit_mib {
        let bytes = vmem_limit("--vmem-limit-mib", mib, 1 << 20, &target)?;
        kernels.rules = kernels.rules.with_vmem_limit(bytes);
    }
    if let CompileWhat::Train(t) = &a.what {
        match (t.vmem_limit_kib, a.vmem_limit_mib) {
            (Some(_), Some(_)) => {
                bail!("--vmem-limit-kib and --vmem-limit-mib both set the VMEM budget; give one")
            }
            (Some(kib), None) => {
                let bytes = vmem_limit("--vmem-limit-kib", kib, 1 << 10, &target)?;
                kernels.rules = kernels.rules.with_vmem_limit(bytes);
            }
            (None, _) => {}
        }
    }
    let mut outputs = emit_outputs(a)?;
    let program = match &a.what {
        CompileWhat::Train(t) => return compile_train(t, &target, &kernels, a, outputs),
        CompileWhat::Attention(x) => attention_program(x, &kernels)?,
        CompileWhat::Kernel { name, params, args } => kernel_program(name, params, args, &kernels)?,
    };
    stage_emits(a, &mut outputs, &program)?;
    let report = compile_and_commit(&target, &program, outputs)?;
    print_summary(&program, &report);
    for c in report.kernel_costs.iter().flatten() {
        outln!("{}", c.table());
    }
    outln!("{}", report.to_json());
    Ok(())
}

fn print_summary(program: &Module, r: &CompileReport) {
    let mib = |b: i64| b as f64 / (1u64 << 20) as f64;
    out!(
        "compiled `{}` for {} ({} device{}) in {:.2} s: kernels {}; executable {} bytes",
        program.name(),
        r.topology,
        r.devices,
        if r.devices == 1 { "" } else { "s" },
        r.compile_seconds,
        r.kernels.join(", "),
        r.executable_bytes
    );
    if let Some(m) = &r.memory {
        out!(
            "; per device: arguments {:.2} MiB, outputs {:.2} MiB, temporaries {:.2} MiB",
            mib(m.argument_bytes),
            mib(m.output_bytes),
            mib(m.temp_bytes)
        );
    }
    if !r.kernel_vmem.is_empty() {
        let vmem: Vec<String> = r
            .kernel_vmem
            .iter()
            .map(|(k, b)| format!("{k} {:.2} MiB", mib(*b)))
            .collect();
        out!("; scoped VMEM: {}", vmem.join(", "));
    }
    for note in r.vmem_raise_notes() {
        out!("; {note}");
    }
    outln!();
}

fn attention_program(a: &CompileAttentionArgs, lowering: &Lowering) -> Result<Module> {
    let dims = Dims {
        batch: a.batch,
        heads: a.heads,
        kv_heads: a.kv_heads.unwrap_or(a.heads),
        q_len: a.seq_len,
        kv_len: a.seq_len,
        head_dim: a.head_dim,
        head_dim_v: a.head_dim,
    };
    let dtype = a.dtype;
    let mask = Mask::parse(&a.mask)?;
    let Partitioning {
        strategy,
        devices,
        block_q: bq,
        block_kv: bkv,
    } = Partitioning::resolve(
        a.strategy.as_deref(),
        a.devices,
        a.load_balance,
        &dims,
        (a.block_q, a.block_kv),
        &AttentionFlags { compile: true },
    )?;
    let blocks = BlockSizes {
        block_q_dkv: a.block_q_dkv.unwrap_or(bq),
        block_kv_dkv: a.block_kv_dkv.unwrap_or(bkv),
        block_kv_dkv_compute: a.block_kv_dkv.unwrap_or(bkv),
        block_kv_dq_compute: a.block_kv_dq_compute,
        block_diagonal: a.block_diagonal,
        ..BlockSizes::uniform(bq, bkv)
    }
    .with_fused_bwd(a.fused_bwd);
    let features = Features {
        segmented: a.segment_ids,
        sinks: false,
    };
    let options = SplashOptions {
        scale: a.scale,
        ..SplashOptions::default()
    };
    let Some(strategy) = strategy else {
        let attn = SplashAttention::new(mask, dims, dtype, blocks, options, lowering.clone())?;
        let pass = match a.pass {
            PassArg::Forward => Pass::Forward,
            PassArg::Inference => Pass::Inference,
            PassArg::Backward => Pass::Backward,
            PassArg::Both => Pass::ForwardBackward,
        };
        return Ok(splash_program(&attn, pass, features)?);
    };
    if a.pass == PassArg::Inference {
        bail!(
            "--pass inference compiles the one-device forward without its lse; with \
             --strategy {} use --pass forward (the context-parallel forward keeps its lse \
             for the combination of shards and the backward)",
            a.strategy.as_deref().unwrap_or("?")
        );
    }
    let cp = ContextParallel {
        dims,
        dtype,
        mask,
        block_sizes: blocks,
        options,
        strategy,
        devices,
        load_balance: a.load_balance,
        lowering: lowering.clone(),
    };
    cp.validate()
        .map_err(|e| anyhow!(e.describe(&AttentionFlags { compile: true })))?;
    // The backward of a context-parallel program is built with its forward (one program).
    // (`--pass inference` is refused above.)
    let program = if a.pass == PassArg::Forward {
        cp.forward_program(a.segment_ids)?
    } else {
        cp.forward_backward_program(a.segment_ids)?
    };
    Ok(program.module().clone())
}

/// A registered kernel instantiated under the TPU rules, as the only op of a program
/// ([`kernel_module`]).
fn kernel_program(
    name: &str,
    params: &[(String, String)],
    args: &[ArgSpec],
    lowering: &Lowering,
) -> Result<Module> {
    let instance = registry::find(name)?.instance(params)?;
    let args = if args.is_empty() {
        instance.args()
    } else {
        args
    };
    kernel_module(instance.def(), args, instance.mesh(), lowering)
}

/// `def` instantiated for `args` on the device mesh `mesh` (empty: one device) under
/// `lowering`'s rules, alone in a program: the program `--backend tpu` runs the kernel as
/// (`tessera::backend::kernel_program`), or for a kernel on a mesh one partition per device,
/// each applying the kernel to its own arguments (`tessera::backend::kernel_spmd_program`).
pub(super) fn kernel_module(
    def: &tessera::dsl::KernelDef,
    args: &[ArgSpec],
    mesh: &[tessera::dsl::DeviceAxis],
    lowering: &Lowering,
) -> Result<Module> {
    let kernel = def.instantiate_on(args, mesh, &lowering.rules)?;
    Ok(if kernel.num_devices() > 1 {
        lowering.lower_module_spmd(&kernel)?
    } else {
        lowering.lower_module(&kernel)?
    })
}

/// Writes every Mosaic kernel of `program` to `dir/KERNEL.mlir` (`KERNEL.N.mlir` for further
/// kernels of one name).
fn emit_mosaic(dir: &Path, program: &Module) -> Result<()> {
    let mut written: Vec<String> = Vec::new();
    for (name, text) in program.tpu_kernel_bodies()? {
        let stem: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let mut file = format!("{stem}.mlir");
        let mut n = 1;
        while written.contains(&file) {
            file = format!("{stem}.{n}.mlir");
            n += 1;
        }
        let path = dir.join(&file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(file);
    }
    if written.is_empty() {
        bail!(
            "the program has no Mosaic kernels to write to {}",
            dir.display()
        );
    }
    Ok(())
}
