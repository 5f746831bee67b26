//! `tessera attention`: splash attention on `.npy` inputs, on one device or context parallel.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use tessera::backend::{self, Backend, Platform};
use tessera::dsl::{DType, HostArray, KernelRules, Lowering};
use tessera::npy::read_npy;
use tessera::parallel::strategy::Shards;
use tessera::parallel::{
    kernel_lowering, CollectiveStat, ContextParallel, CpInputs, Names, Strategy,
};
use tessera::splash::{
    default_block, splash_program, BlockSizes, BlockStats, Dims, Features, Forward, Grads, Inputs,
    Mask, Pass, SegmentIds, SplashAttention, SplashOptions,
};

use super::outputs::Outputs;
use super::positive;

/// Arguments of `tessera attention`.
#[derive(clap::Args, Debug)]
pub struct AttentionArgs {
    /// Queries, float32 [B, H, S, D] (see --dtype).
    #[arg(long)]
    pub q: PathBuf,
    /// Element type the attention computes in: f32, or bf16 (q, k, v and dout as float32
    /// files rounded to bf16, or uint16 files of raw bf16 bits; out and the gradients are
    /// written as float32 holding the bf16 values exactly).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Keys, float32 [B, KVH, S, D] (KVH divides H: MHA, GQA, MQA).
    #[arg(long)]
    pub k: PathBuf,
    /// Values, float32 [B, KVH, S, D].
    #[arg(long)]
    pub v: PathBuf,
    /// Segment ids, int32 [B, S], shared by queries and keys (packed sequences).
    #[arg(long)]
    pub segment_ids: Option<PathBuf>,
    /// full, causal, causal:OFFSET, local:LEFT:RIGHT or chunked:SIZE.
    #[arg(long, default_value = "full")]
    pub mask: String,
    /// Soft cap c: logits = c * tanh(logits / c).
    #[arg(long, allow_negative_numbers = true)]
    pub soft_cap: Option<f32>,
    /// Logit scale (default 1/sqrt(D)).
    #[arg(long, allow_negative_numbers = true)]
    pub scale: Option<f32>,
    /// Query block size of every kernel (default: the queries each kernel call holds up to
    /// 512, else their largest divisor up to 512 that tiles on TPU).
    #[arg(long, value_parser = positive)]
    pub block_q: Option<usize>,
    /// Key block size of every kernel (default: the keys each kernel call holds up to 512,
    /// else their largest divisor up to 512 that is a multiple of 128).
    #[arg(long, value_parser = positive)]
    pub block_kv: Option<usize>,
    /// Use the fused dq+dkv backward kernel.
    #[arg(long)]
    pub fused_bwd: bool,
    /// Where the attention runs: interpret (the default on one device; kernels only), cpu
    /// (the XLA CPU plugin; the default with --strategy), gpu (a CUDA PJRT plugin named by
    /// TESSERA_GPU_PJRT_PLUGIN) or tpu (the chips of a TPU VM: the program `tessera compile
    /// attention` compiles, its kernels Mosaic custom calls).
    #[arg(long)]
    pub backend: Option<Backend>,
    #[arg(long, help = super::strategies_help(
        "Context parallelism over --devices devices of --backend",
        "",
    ))]
    pub strategy: Option<String>,
    #[arg(long, requires = "strategy", help = super::load_balance_help(
        "Causal load balancing for",
        " (zigzag: device r holds chunks r and 2N-1-r of 2N); inputs and outputs stay in \
         natural order",
    ))]
    pub load_balance: bool,
    /// Devices of the context axis, with --strategy (default: 4, or U x R for usp:UxR).
    #[arg(long, requires = "strategy", value_parser = positive)]
    pub devices: Option<usize>,
    /// With --strategy: write the forward StableHLO program that ran to FILE, and the
    /// backward's (with --dout) beside it, as FILE with `.bwd` before its extension.
    #[arg(long, requires = "strategy", value_name = "FILE")]
    pub dump_hlo: Option<PathBuf>,
    /// Output, float32 [B, H, S, D].
    #[arg(long)]
    pub out: PathBuf,
    /// Logsumexp of every query row, float32 [B, H, S].
    #[arg(long)]
    pub lse: Option<PathBuf>,
    /// Output cotangent, float32 [B, H, S, D]: computes the gradients of sum(out * dout).
    #[arg(long, requires_all = ["dq", "dk", "dv"])]
    pub dout: Option<PathBuf>,
    /// Gradient of q (with --dout).
    #[arg(long, requires = "dout")]
    pub dq: Option<PathBuf>,
    /// Gradient of k (with --dout).
    #[arg(long, requires = "dout")]
    pub dk: Option<PathBuf>,
    /// Gradient of v (with --dout).
    #[arg(long, requires = "dout")]
    pub dv: Option<PathBuf>,
    /// Print one JSON line with the forward's key-block counters; with --strategy, also what
    /// each device holds (K/V bytes) and what every collective sends.
    #[arg(long)]
    pub stats: bool,
}

/// Reads q, k, v or dout as `dtype`: float32 files (converted to bf16, rounding to nearest
/// even, with `--dtype bf16`), or with `--dtype bf16` uint16 files of raw bf16 bits.
fn read_float(path: &Path, what: &str, dtype: DType) -> Result<HostArray> {
    let a = read_npy(path)?;
    match (a.dtype(), dtype) {
        (DType::F32, DType::F32) | (DType::BF16, DType::BF16) => Ok(a),
        (DType::F32, DType::BF16) => Ok(HostArray::from_f64(
            DType::BF16,
            a.shape().to_vec(),
            &a.to_f64_vec(),
        )?),
        (DType::BF16, _) => bail!(
            "{}: {what} holds uint16 (raw bf16 bits), which needs --dtype bf16",
            path.display()
        ),
        (other, _) => bail!(
            "{}: {what} must be float32 (or, with --dtype bf16, uint16 bf16 bits), got {other} \
             (save with x.astype(np.float32))",
            path.display()
        ),
    }
}

/// The library's quantities as `tessera attention` and `tessera compile attention` name
/// them: their flags where they have one (the dims of `tessera attention` come from the
/// files).
pub(super) struct AttentionFlags {
    /// `tessera compile attention`: the dims and the backward's blocks are flags too.
    pub compile: bool,
}

impl Names for AttentionFlags {
    fn flag(&self, key: &str) -> Option<&str> {
        Some(match (key, self.compile) {
            ("context", _) => "--devices",
            ("strategy", _) => "--strategy",
            ("load_balance", _) => "--load-balance",
            ("block_q_dkv", true) => "--block-q-dkv",
            ("block_kv_dkv", true) => "--block-kv-dkv",
            ("block_kv_dq_compute", true) => "--block-kv-dq-compute",
            ("block_diagonal", true) => "--block-diagonal",
            ("block_q" | "block_q_dkv" | "block_q_dq", _) => "--block-q",
            ("block_kv" | "block_kv_dkv" | "block_kv_dq", _) => "--block-kv",
            ("heads", true) => "--heads",
            ("kv_heads", true) => "--kv-heads",
            ("seq_len", true) => "--seq-len",
            ("head_dim", true) => "--head-dim",
            ("batch", true) => "--batch",
            _ => return None,
        })
    }
}

/// How `tessera attention` names the library's quantities.
const FLAGS: AttentionFlags = AttentionFlags { compile: false };

/// Context devices when `--strategy` is given without `--devices`.
pub(super) const DEFAULT_DEVICES: usize = 4;

/// How an attention command splits its work: the `--strategy` (if any), the context devices
/// (`--devices`, the strategy's own degree, or [`DEFAULT_DEVICES`]), and the forward blocks
/// (`--block-q`, `--block-kv`, else the largest that divide what each device's kernel holds).
pub(super) struct Partitioning {
    pub strategy: Option<Strategy>,
    pub devices: usize,
    pub block_q: usize,
    pub block_kv: usize,
}

impl Partitioning {
    pub(super) fn resolve(
        strategy: Option<&str>,
        devices: Option<usize>,
        load_balance: bool,
        dims: &Dims,
        (block_q, block_kv): (Option<usize>, Option<usize>),
        names: &dyn Names,
    ) -> Result<Partitioning> {
        let strategy = match strategy {
            Some(s) => Some(
                Strategy::parse(s, devices.unwrap_or(DEFAULT_DEVICES))
                    .map_err(|e| anyhow!(e.describe(names)))?,
            ),
            None => None,
        };
        let devices = match (devices, strategy.as_ref().and_then(|s| s.fixed_devices())) {
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => DEFAULT_DEVICES,
        };
        let (q_len, kv_len) = match &strategy {
            Some(s) => s.local_lengths(Shards::of(dims.q_len, devices, load_balance)),
            None => (dims.q_len, dims.kv_len),
        };
        Ok(Partitioning {
            strategy,
            devices,
            block_q: block_q.unwrap_or_else(|| default_block(q_len)),
            block_kv: block_kv.unwrap_or_else(|| default_block(kv_len)),
        })
    }
}

/// The files `tessera attention` writes, with their flags, in the order they are written.
fn output_files(a: &AttentionArgs) -> Vec<(&'static str, PathBuf)> {
    let mut files = vec![("--out", a.out.clone())];
    let optional = [
        ("--lse", &a.lse),
        ("--dq", &a.dq),
        ("--dk", &a.dk),
        ("--dv", &a.dv),
    ];
    files.extend(
        optional
            .into_iter()
            .filter_map(|(flag, p)| Some((flag, p.clone()?))),
    );
    if let Some(path) = &a.dump_hlo {
        files.push(("--dump-hlo", path.clone()));
        if a.dout.is_some() {
            files.push((BACKWARD_DUMP, backward_path(path)));
        }
    }
    files
}

/// The label of the backward program's dump (beside `--dump-hlo`; with a context-parallel
/// strategy, the forward + backward program).
const BACKWARD_DUMP: &str = "--dump-hlo (backward)";

/// The files `tessera attention` reads, with their flags.
fn input_files(a: &AttentionArgs) -> Vec<(&'static str, &Path)> {
    let mut files = vec![
        ("--q", a.q.as_path()),
        ("--k", a.k.as_path()),
        ("--v", a.v.as_path()),
    ];
    files.extend(a.segment_ids.as_deref().map(|p| ("--segment-ids", p)));
    files.extend(a.dout.as_deref().map(|p| ("--dout", p)));
    files
}

/// Runs `tessera attention`: reads and checks every input, checks every output path, then
/// computes; the outputs appear only when everything succeeded.
pub fn attention_command(a: &AttentionArgs) -> Result<()> {
    let Some(dtype) = DType::compute_from_name(&a.dtype) else {
        bail!("--dtype {} is not supported; use f32 or bf16", a.dtype);
    };
    let q = read_float(&a.q, "q", dtype)?;
    let k = read_float(&a.k, "k", dtype)?;
    let v = read_float(&a.v, "v", dtype)?;
    let dims = Dims::of(q.shape(), k.shape(), v.shape())?;
    let seg = match &a.segment_ids {
        Some(p) => {
            if dims.q_len != dims.kv_len {
                bail!(
                    "--segment-ids are shared by queries and keys, which needs equal sequence \
                     lengths (q {}, k {})",
                    dims.q_len,
                    dims.kv_len
                );
            }
            let s = read_npy(p)?;
            if s.dtype() != DType::I32 || s.shape() != [dims.batch, dims.q_len] {
                bail!(
                    "{}: segment ids must be int32 [B, S] = [{}, {}], got {} {:?}",
                    p.display(),
                    dims.batch,
                    dims.q_len,
                    s.dtype(),
                    s.shape()
                );
            }
            Some(s)
        }
        None => None,
    };
    let dout = match &a.dout {
        Some(p) => Some(read_float(p, "dout", dtype)?),
        None => None,
    };
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
        &FLAGS,
    )?;
    let blocks = BlockSizes::uniform(bq, bkv).with_fused_bwd(a.fused_bwd);
    let options = SplashOptions {
        scale: a.scale,
        soft_cap: a.soft_cap,
        ..SplashOptions::default()
    };
    if let Some(strategy) = strategy {
        let Some(platform) = a.backend.unwrap_or(Backend::CPU).platform() else {
            bail!(
                "--strategy runs one SPMD program on a platform's devices, and the interpreter \
                 runs kernels alone; use --backend cpu, gpu or tpu"
            );
        };
        // The devices before anything is built: a platform this machine lacks is refused now.
        platform.client(devices)?;
        let cp = ContextParallel {
            dims,
            dtype,
            mask,
            block_sizes: blocks,
            options,
            strategy,
            devices,
            load_balance: a.load_balance,
            lowering: kernel_lowering(platform, &Lowering::portable()),
        };
        cp.validate().map_err(|e| anyhow!(e.describe(&FLAGS)))?;
        let x = CpInputs {
            q: &q,
            k: &k,
            v: &v,
            segment_ids: seg.as_ref(),
        };
        // The same checks as one device's (splash's), through the parallel crate.
        cp.check_inputs(&x)?;
        if let Some(dout) = &dout {
            cp.check_dout(dout)?;
        }
        let mut outputs = prepare_outputs(a)?;
        let stats = context_parallel_command(a, &cp, platform, &x, dout.as_ref(), &mut outputs)?;
        outputs.commit()?;
        if let Some(stats) = stats {
            out!("{stats}");
        }
        return Ok(());
    }
    let backend = a.backend.unwrap_or(Backend::Interpret);
    let platform = backend.platform();
    let target = match platform {
        Some(p) => {
            p.client(1)?;
            kernel_lowering(p, &Lowering::from(KernelRules::tpu()))
        }
        None => Lowering::from(KernelRules::tpu()),
    };
    let attn = SplashAttention::new(mask, dims, dtype, blocks, options, target)?;
    let x = Inputs {
        segment_ids: seg.as_ref().map(|s| SegmentIds { q: s, kv: s }),
        ..Inputs::new(&q, &k, &v)
    };
    attn.check_inputs(&x)?;
    if let Some(dout) = &dout {
        attn.check_dout(dout)?;
    }
    let mut outputs = prepare_outputs(a)?;
    let (fwd, grads) = match platform {
        Some(p) if p.takes_mosaic_kernels() => one_program(&attn, p, &x, dout.as_ref())?,
        _ => {
            let fwd = attn.forward(&backend, &x)?;
            let grads = match &dout {
                Some(dout) => Some(attn.backward(&backend, &x, &fwd, dout)?),
                None => None,
            };
            (fwd, grads)
        }
    };
    outputs.write_npy_if("--out", &fwd.out)?;
    outputs.write_npy_if("--lse", &fwd.lse)?;
    if let Some(g) = &grads {
        for (flag, arr) in [("--dq", &g.dq), ("--dk", &g.dk), ("--dv", &g.dv)] {
            outputs.write_npy_if(flag, arr)?;
        }
    }
    outputs.commit()?;
    if a.stats {
        outln!("{}", stats_json(&attn.stats(), bq, bkv));
    }
    Ok(())
}

/// Splash attention on one device of `platform` as the one program `tessera compile
/// attention` compiles for a topology (`--pass forward`, or `both` with a cotangent): every
/// kernel a Mosaic custom call, compiled with the same options.
fn one_program(
    attn: &SplashAttention,
    platform: Platform,
    x: &Inputs<'_>,
    dout: Option<&HostArray>,
) -> Result<(Forward, Option<Grads>)> {
    let features = Features {
        segmented: x.segment_ids.is_some(),
        sinks: false,
    };
    let pass = match dout {
        Some(_) => Pass::ForwardBackward,
        None => Pass::Forward,
    };
    let mut args = vec![x.q.clone(), x.k.clone(), x.v.clone()];
    if let Some(s) = &x.segment_ids {
        args.extend([s.q.clone(), s.kv.clone()]);
    }
    args.extend(dout.cloned());
    let program = splash_program(attn, pass, features)?;
    let mut outs = backend::run_program(&program, platform, &args)?.into_iter();
    let mut next = || {
        outs.next()
            .ok_or_else(|| anyhow::anyhow!("the splash program returned too few results"))
    };
    let fwd = Forward {
        out: next()?,
        lse: next()?,
    };
    let grads = match dout {
        Some(_) => Some(Grads {
            dq: next()?,
            dk: next()?,
            dv: next()?,
            dsinks: None,
        }),
        None => None,
    };
    Ok((fwd, grads))
}

fn prepare_outputs(a: &AttentionArgs) -> Result<Outputs> {
    let files = output_files(a);
    let outputs: Vec<(&str, &Path)> = files.iter().map(|(f, p)| (*f, p.as_path())).collect();
    Outputs::prepare(&outputs, &input_files(a))
}

/// `tessera attention --strategy ..`: the context-parallel programs on `platform`'s devices,
/// their results written to `outputs` once all are computed; returns what `--stats` prints.
fn context_parallel_command(
    a: &AttentionArgs,
    cp: &ContextParallel,
    platform: Platform,
    x: &CpInputs<'_>,
    dout: Option<&HostArray>,
    outputs: &mut Outputs,
) -> Result<Option<String>> {
    let segmented = x.segment_ids.is_some();
    let forward = cp.forward_program(segmented)?;
    outputs.write_text_if("--dump-hlo", &forward.to_mlir())?;
    match dout {
        // With a cotangent, one program computes the forward and its gradient.
        Some(dout) => {
            let program = cp.forward_backward_program(segmented)?;
            let mut inputs = vec![x.q, x.k, x.v, dout];
            inputs.extend(x.segment_ids);
            let outs = program.run(platform, &inputs)?;
            outputs.write_text_if(BACKWARD_DUMP, &program.to_mlir())?;
            for (flag, arr) in ["--out", "--lse", "--dq", "--dk", "--dv"]
                .into_iter()
                .zip(&outs)
            {
                outputs.write_npy_if(flag, arr)?;
            }
        }
        None => {
            let mut inputs = vec![x.q, x.k, x.v];
            inputs.extend(x.segment_ids);
            let outs = forward.run(platform, &inputs)?;
            outputs.write_npy_if("--out", &outs[0])?;
            outputs.write_npy_if("--lse", &outs[1])?;
        }
    }
    if !a.stats {
        return Ok(None);
    }
    let s = cp.stats()?;
    let total = |l: &[CollectiveStat]| -> usize { l.iter().map(|c| c.bytes_per_device).sum() };
    Ok(Some(format!(
        "{s}{{\"strategy\":\"{}\",\"devices\":{},\"kv_heads_per_device\":{},\
         \"kv_bytes_per_device\":{},\"kv_replication\":{},\"blocks_per_device\":{:?},\
         \"forward_collectives\":{},\
         \"forward_bytes_per_device\":{},\"forward_backward_collectives\":{},\
         \"forward_backward_bytes_per_device\":{}}}\n",
        s.strategy,
        s.devices,
        s.kv_heads_per_device,
        s.kv_bytes_per_device,
        s.kv_replication,
        s.blocks_per_device,
        s.forward.len(),
        total(&s.forward),
        s.forward_backward.len(),
        total(&s.forward_backward)
    )))
}

/// `prog.mlir` -> `prog.bwd.mlir` (`prog` -> `prog.bwd`).
pub(super) fn backward_path(path: &Path) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.bwd.{}", ext.to_string_lossy()),
        None => format!("{stem}.bwd"),
    };
    path.with_file_name(name)
}

fn stats_json(s: &BlockStats, bq: usize, bkv: usize) -> String {
    format!(
        "{{\"block_q\":{bq},\"block_kv\":{bkv},\"kv_blocks_total\":{},\"kv_blocks_computed\":{},\
         \"kv_blocks_skipped\":{},\"kv_blocks_masked\":{}}}",
        s.total,
        s.computed(),
        s.empty,
        s.partial
    )
}
