//! Splash attention from the facade: running its kernel plans on a [`Backend`], lowering
//! them into one StableHLO program, the dense-attention baseline program, and the
//! `tessera attention` / `tessera bench attention` commands.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use tessera_dsl::array::ArrayData;
use tessera_dsl::{DType, HostArray, KernelDef, TargetRules};
use tessera_hlo::{self as hlo, ComparisonDirection, DotDims, FuncBuilder, Module, Reducer};
use tessera_runtime::{Client, CompileOptions};
use tessera_splash::{
    BlockSizes, BlockStats, Dims, Executor, Features, Inputs, Mask, SegmentIds, SplashAttention,
    SplashError, SplashOptions, Stage, StageArg, Tensor,
};

use crate::backend::{self, from_host_buffer, to_host_buffer, Backend, RunError};
use crate::context_parallel::{ContextParallel, Strategy};
use crate::npy::{read_npy, write_npy};

impl Executor for Backend {
    fn run(
        &self,
        def: &KernelDef,
        args: &[HostArray],
        rules: &TargetRules,
    ) -> Result<Vec<HostArray>, SplashError> {
        backend::run(def, args, *self, rules).map_err(|e| match e {
            RunError::Kernel(k) => SplashError::Kernel(k),
            other => SplashError::Backend(other.to_string()),
        })
    }
}

/// Lowers `stages` into the function `f` is building. `env` holds the program values of the
/// tensors the stages read (inputs) and receives those they produce. Constant arguments
/// (tables, placeholders) become program constants.
pub fn lower_stages(
    f: &mut FuncBuilder<'_>,
    stages: &[Stage],
    rules: &TargetRules,
    env: &mut HashMap<Tensor, hlo::Value>,
) -> Result<()> {
    lower_stages_on_shard(f, stages, rules, env, None)
}

/// [`lower_stages`] inside an SPMD program: a [`StageArg::PerShard`] argument becomes one
/// constant holding every shard's array, sliced at run time by `shard` (this device's shard
/// index, an `i32` scalar).
pub fn lower_stages_on_shard(
    f: &mut FuncBuilder<'_>,
    stages: &[Stage],
    rules: &TargetRules,
    env: &mut HashMap<Tensor, hlo::Value>,
    shard: Option<hlo::Value>,
) -> Result<()> {
    for stage in stages {
        let mut args = Vec::with_capacity(stage.args.len());
        for a in &stage.args {
            args.push(match a {
                StageArg::Const(c) => constant(f, c)?,
                StageArg::Tensor(t) => *env.get(t).ok_or_else(|| {
                    anyhow!("stage `{}` reads {t:?} before it exists", stage.def.name())
                })?,
                StageArg::PerShard(arrays) => {
                    let shard = shard.ok_or_else(|| {
                        anyhow!(
                            "stage `{}` has per-shard tables but no shard index",
                            stage.def.name()
                        )
                    })?;
                    shard_constant(f, arrays, shard)?
                }
            });
        }
        let mut specs = Vec::with_capacity(args.len());
        for &v in &args {
            let ty = f.value_type(v)?;
            let shape: Vec<usize> = ty.dims.iter().map(|&d| d as usize).collect();
            specs.push(tessera_dsl::ArgSpec::new(ty.dtype, shape));
        }
        let kernel = stage.def.instantiate(&specs, rules)?;
        let outs = tessera_dsl::stablehlo::lower_into(&kernel, f, &args)?;
        env.extend(stage.outputs.iter().copied().zip(outs));
    }
    Ok(())
}

/// Every shard's array stacked into one constant `[shards, ...]`, and this shard's sliced out.
fn shard_constant(
    f: &mut FuncBuilder<'_>,
    arrays: &[HostArray],
    shard: hlo::Value,
) -> Result<hlo::Value> {
    let shape = arrays[0].shape().to_vec();
    let mut stacked_shape = vec![arrays.len()];
    stacked_shape.extend(&shape);
    let values: Vec<f64> = arrays.iter().flat_map(|a| a.to_f64_vec()).collect();
    let stacked = HostArray::from_f64(arrays[0].dtype(), stacked_shape, &values)?;
    let all = constant(f, &stacked)?;
    let zero = f.scalar(0.0, DType::I32)?;
    let mut starts = vec![shard];
    starts.extend(std::iter::repeat_n(zero, shape.len()));
    let mut sizes = vec![1i64];
    sizes.extend(shape.iter().map(|&d| d as i64));
    let one = f.dynamic_slice(all, &starts, &sizes)?;
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Ok(f.reshape(one, &dims)?)
}

/// A host array as a program constant (a splat when all elements are equal).
fn constant(f: &mut FuncBuilder<'_>, a: &HostArray) -> Result<hlo::Value> {
    let dims: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
    let values = a.to_f64_vec();
    if values.iter().all(|&v| v == values[0]) {
        return Ok(f.splat(values[0], hlo::TensorType::new(dims, a.dtype()))?);
    }
    let lit = match a.data() {
        ArrayData::F32(v) => hlo::Literal::f32(dims, v.clone())?,
        ArrayData::I32(v) => hlo::Literal::i32(dims, v.clone())?,
        ArrayData::I8(v) => hlo::Literal::i8(dims, v.clone())?,
        ArrayData::Bool(v) => hlo::Literal::bool(dims, v.clone())?,
        ArrayData::BF16(v) => {
            let f: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            hlo::Literal::bf16(dims, &f)?
        }
    };
    Ok(f.constant(lit)?)
}

/// What a program computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// `q, k, v -> out, lse`.
    Forward,
    /// `q, k, v, dout -> out, lse, dq, dk, dv`.
    ForwardBackward,
}

fn tensor_type(dtype: DType, shape: &[usize]) -> hlo::TensorType {
    hlo::TensorType::new(shape.iter().map(|&d| d as i64).collect::<Vec<_>>(), dtype)
}

/// Splash attention (no segment ids or sinks) as one StableHLO program over its kernels.
pub fn splash_program(attn: &SplashAttention, pass: Pass) -> Result<Module> {
    let d = attn.dims();
    let mut m = Module::new("splash_attention");
    let mut f = m.func("main");
    let dt = attn.dtype();
    let q = f.arg(tensor_type(dt, &[d.batch, d.heads, d.q_len, d.head_dim]))?;
    let k = f.arg(tensor_type(
        dt,
        &[d.batch, d.kv_heads, d.kv_len, d.head_dim],
    ))?;
    let v = f.arg(tensor_type(
        dt,
        &[d.batch, d.kv_heads, d.kv_len, d.head_dim_v],
    ))?;
    let mut env = HashMap::from([(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)]);
    let feats = Features::default();
    lower_stages(&mut f, &attn.forward_plan(feats), attn.rules(), &mut env)?;
    let lse = f.reshape(
        env[&Tensor::Lse],
        &[d.batch as i64, d.heads as i64, d.q_len as i64],
    )?;
    let mut results = vec![env[&Tensor::Out], lse];
    if pass == Pass::ForwardBackward {
        let dout = f.arg(tensor_type(dt, &[d.batch, d.heads, d.q_len, d.head_dim_v]))?;
        env.insert(Tensor::DOut, dout);
        lower_stages(&mut f, &attn.backward_plan(feats), attn.rules(), &mut env)?;
        results.extend([env[&Tensor::Dq], env[&Tensor::Dk], env[&Tensor::Dv]]);
    }
    f.finish(&results)?;
    Ok(m)
}

/// Dense attention as an XLA user writes it without a kernel: the `[B, H, Sq, Skv]` scores
/// materialised, masked with `select`, softmaxed, multiplied by v; the backward from the
/// saved probabilities. Takes the same arguments and returns the same results as
/// [`splash_program`]. Only computable masks (no dense or per-head masks).
pub fn dense_program(
    dims: Dims,
    dtype: DType,
    mask: &Mask,
    scale: f32,
    soft_cap: Option<f32>,
    pass: Pass,
) -> Result<Module> {
    let d = dims;
    let (b, h, sq, skv) = (
        d.batch as i64,
        d.heads as i64,
        d.q_len as i64,
        d.kv_len as i64,
    );
    let scores_dims = [b, h, sq, skv];
    let mut m = Module::new("dense_attention");
    let mut f = m.func("main");
    let q = f.arg(tensor_type(dtype, &[d.batch, d.heads, d.q_len, d.head_dim]))?;
    let k = f.arg(tensor_type(
        dtype,
        &[d.batch, d.kv_heads, d.kv_len, d.head_dim],
    ))?;
    let v = f.arg(tensor_type(
        dtype,
        &[d.batch, d.kv_heads, d.kv_len, d.head_dim_v],
    ))?;
    // GQA: repeat each kv head for its query heads.
    let group = (d.heads / d.kv_heads) as i64;
    let repeat = |f: &mut FuncBuilder<'_>, x: hlo::Value, dh: usize| -> Result<hlo::Value> {
        if group == 1 {
            return Ok(x);
        }
        let kvh = d.kv_heads as i64;
        let x = f.broadcast_in_dim(x, &[b, kvh, group, skv, dh as i64], &[0, 1, 3, 4])?;
        Ok(f.reshape(x, &[b, h, skv, dh as i64])?)
    };
    let kh = repeat(&mut f, k, d.head_dim)?;
    let vh = repeat(&mut f, v, d.head_dim_v)?;
    let batch = |lc: i64, rc: i64| DotDims::new([0, 1], [0, 1], [lc], [rc]);
    let raw = f.dot_general(q, kh, &batch(3, 3), DType::F32, None)?;
    let sc = f.splat(scale as f64, tensor_type(DType::F32, &[]))?;
    let sc = f.broadcast_in_dim(sc, &scores_dims, &[])?;
    let raw = f.mul(raw, sc)?;
    let (s, cap_t) = match soft_cap {
        Some(c) => {
            let cv = f.splat(
                c as f64,
                hlo::TensorType::new(scores_dims.to_vec(), DType::F32),
            )?;
            let t = f.div(raw, cv)?;
            let t = f.tanh(t)?;
            (f.mul(t, cv)?, Some(t))
        }
        None => (raw, None),
    };
    let vis = dense_mask(&mut f, mask, d)?;
    let s = match vis {
        Some(vis) => {
            let ninf = f.splat(
                f64::NEG_INFINITY,
                hlo::TensorType::new(scores_dims.to_vec(), DType::F32),
            )?;
            f.select(vis, s, ninf)?
        }
        None => s,
    };
    let row =
        |f: &mut FuncBuilder<'_>, x: hlo::Value| f.broadcast_in_dim(x, &scores_dims, &[0, 1, 2]);
    let mx = f.reduce(s, &[3], Reducer::Max)?;
    let mxb = row(&mut f, mx)?;
    let e = f.sub(s, mxb)?;
    let e = f.exp(e)?;
    let l = f.reduce(e, &[3], Reducer::Sum)?;
    let lb = row(&mut f, l)?;
    let p = f.div(e, lb)?;
    let p_in = if dtype == DType::F32 {
        p
    } else {
        f.convert(p, dtype)?
    };
    let out = f.dot_general(p_in, vh, &batch(3, 2), DType::F32, None)?;
    let logl = f.log(l)?;
    let lse = f.add(mx, logl)?;
    let out_t = if dtype == DType::F32 {
        out
    } else {
        f.convert(out, dtype)?
    };
    let mut results = vec![out_t, lse];
    if pass == Pass::ForwardBackward {
        let dout = f.arg(tensor_type(
            dtype,
            &[d.batch, d.heads, d.q_len, d.head_dim_v],
        ))?;
        // dv = p^T dout, dp = dout v^T, ds = p (dp - rowsum(out * dout)).
        let dvh = f.dot_general(p_in, dout, &batch(2, 2), DType::F32, None)?;
        let dp = f.dot_general(dout, vh, &batch(3, 3), DType::F32, None)?;
        let dout32 = if dtype == DType::F32 {
            dout
        } else {
            f.convert(dout, DType::F32)?
        };
        let od = f.mul(out, dout32)?;
        let di = f.reduce(od, &[3], Reducer::Sum)?;
        let dib = row(&mut f, di)?;
        let ds = f.sub(dp, dib)?;
        let mut ds = f.mul(p, ds)?;
        if let Some(t) = cap_t {
            let one = f.splat(1.0, hlo::TensorType::new(scores_dims.to_vec(), DType::F32))?;
            let t2 = f.mul(t, t)?;
            let g = f.sub(one, t2)?;
            ds = f.mul(ds, g)?;
        }
        let ds = f.mul(ds, sc)?;
        let ds_in = if dtype == DType::F32 {
            ds
        } else {
            f.convert(ds, dtype)?
        };
        let dq = f.dot_general(ds_in, kh, &batch(3, 2), DType::F32, None)?;
        let dkh = f.dot_general(ds_in, q, &batch(2, 2), DType::F32, None)?;
        let unrepeat = |f: &mut FuncBuilder<'_>, x: hlo::Value, dh: usize| -> Result<hlo::Value> {
            let x = if group == 1 {
                x
            } else {
                let x = f.reshape(x, &[b, d.kv_heads as i64, group, skv, dh as i64])?;
                f.reduce(x, &[2], Reducer::Sum)?
            };
            Ok(if dtype == DType::F32 {
                x
            } else {
                f.convert(x, dtype)?
            })
        };
        let dk = unrepeat(&mut f, dkh, d.head_dim)?;
        let dv = unrepeat(&mut f, dvh, d.head_dim_v)?;
        let dq = if dtype == DType::F32 {
            dq
        } else {
            f.convert(dq, dtype)?
        };
        results.extend([dq, dk, dv]);
    }
    f.finish(&results)?;
    Ok(m)
}

/// The visibility of every (query, key) pair as a `[B, H, Sq, Skv]` bool, or `None` for a
/// full mask.
fn dense_mask(f: &mut FuncBuilder<'_>, mask: &Mask, d: Dims) -> Result<Option<hlo::Value>> {
    if *mask == Mask::Full {
        return Ok(None);
    }
    let (sq, skv) = (d.q_len as i64, d.kv_len as i64);
    let ty = tensor_type(DType::I32, &[d.q_len, d.kv_len]);
    let qi = f.iota(ty.clone(), 0)?;
    let ki = f.iota(ty.clone(), 1)?;
    let vis = mask_expr(f, mask, qi, ki, &ty)?;
    let vis = f.broadcast_in_dim(vis, &[d.batch as i64, d.heads as i64, sq, skv], &[2, 3])?;
    Ok(Some(vis))
}

fn mask_expr(
    f: &mut FuncBuilder<'_>,
    mask: &Mask,
    q: hlo::Value,
    k: hlo::Value,
    ty: &hlo::TensorType,
) -> Result<hlo::Value> {
    use ComparisonDirection::{Eq, Le};
    let int = |f: &mut FuncBuilder<'_>, x: i64| f.splat(x as f64, ty.clone());
    Ok(match mask {
        Mask::Full => f.splat(1.0, ty.with_dtype(DType::Bool))?,
        Mask::Causal { offset } => {
            let o = int(f, *offset)?;
            let qo = f.add(q, o)?;
            f.compare(Le, k, qo)?
        }
        Mask::Local {
            left,
            right,
            offset,
        } => {
            let o = int(f, *offset)?;
            let c = f.add(q, o)?;
            let mut vis = f.splat(1.0, ty.with_dtype(DType::Bool))?;
            if let Some(l) = left {
                let l = int(f, *l as i64)?;
                let lo = f.sub(c, l)?;
                let ok = f.compare(Le, lo, k)?;
                vis = f.and(vis, ok)?;
            }
            if let Some(r) = right {
                let r = int(f, *r as i64)?;
                let hi = f.add(c, r)?;
                let ok = f.compare(Le, k, hi)?;
                vis = f.and(vis, ok)?;
            }
            vis
        }
        Mask::ChunkedCausal { chunk } => {
            let c = int(f, *chunk as i64)?;
            let causal = f.compare(Le, k, q)?;
            let qc = f.div(q, c)?;
            let kc = f.div(k, c)?;
            let same = f.compare(Eq, qc, kc)?;
            f.and(causal, same)?
        }
        Mask::And(a, b) => {
            let a = mask_expr(f, a, q, k, ty)?;
            let b = mask_expr(f, b, q, k, ty)?;
            f.and(a, b)?
        }
        Mask::Or(a, b) => {
            let a = mask_expr(f, a, q, k, ty)?;
            let b = mask_expr(f, b, q, k, ty)?;
            f.or(a, b)?
        }
        Mask::Dense(_) => bail!("the dense baseline takes computable masks only"),
    })
}

// ---------------------------------------------------------------------------------------
// `tessera attention`

/// Arguments of `tessera attention`.
#[derive(clap::Args, Debug)]
pub struct AttentionArgs {
    /// Queries, float32 [B, H, S, D].
    #[arg(long)]
    pub q: PathBuf,
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
    /// Query block size of every kernel (default: the largest divisor of S up to 512 that
    /// tiles on TPU).
    #[arg(long)]
    pub block_q: Option<usize>,
    /// Key block size of every kernel (default: the largest divisor of S up to 512 that is a
    /// multiple of 128, or S).
    #[arg(long)]
    pub block_kv: Option<usize>,
    /// Use the fused dq+dkv backward kernel.
    #[arg(long)]
    pub fused_bwd: bool,
    /// Where the kernels run: interpret (the default) or cpu (StableHLO on the XLA CPU
    /// plugin). With --strategy, always cpu.
    #[arg(long)]
    pub backend: Option<Backend>,
    /// Context parallelism over --devices CPU devices: ulysses, all-gather (or all_gather),
    /// ring, usp:UxR (Ulysses degree x ring degree) or usp (the most square split).
    #[arg(long)]
    pub strategy: Option<String>,
    /// Causal load balancing for all-gather and ring (zigzag: device r holds chunks r and
    /// 2N-1-r of 2N); inputs and outputs stay in natural order.
    #[arg(long, requires = "strategy")]
    pub load_balance: bool,
    /// Devices of the context axis, with --strategy (default: 4, or U x R for usp:UxR).
    #[arg(long, requires = "strategy")]
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

fn read_f32(path: &Path, what: &str) -> Result<HostArray> {
    let a = read_npy(path)?;
    if a.dtype() != DType::F32 {
        bail!(
            "{}: {what} must be float32, got {} (save with x.astype(np.float32))",
            path.display(),
            a.dtype()
        );
    }
    Ok(a)
}

/// The largest divisor of `n` up to `cap` that is a multiple of `mult`, else `n`.
fn default_block(n: usize, cap: usize, mult: usize) -> usize {
    if n <= cap {
        return n;
    }
    (1..=cap)
        .rev()
        .find(|b| n % b == 0 && b % mult == 0)
        .unwrap_or(n)
}

/// Context devices when `--strategy` is given without `--devices`.
const DEFAULT_DEVICES: usize = 4;

/// Runs `tessera attention`.
pub fn attention_command(a: &AttentionArgs) -> Result<()> {
    let q = read_f32(&a.q, "q")?;
    let k = read_f32(&a.k, "k")?;
    let v = read_f32(&a.v, "v")?;
    let dims = Dims::of(q.shape(), k.shape(), v.shape())?;
    let seg = match &a.segment_ids {
        Some(p) => {
            let s = read_npy(p)?;
            if dims.q_len != dims.kv_len {
                bail!("--segment-ids are shared by queries and keys, which needs equal sequence lengths (q {}, k {})", dims.q_len, dims.kv_len);
            }
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
        Some(p) => Some(read_f32(p, "dout")?),
        None => None,
    };
    let mask = Mask::parse(&a.mask)?;
    let strategy = match &a.strategy {
        Some(s) => Some(Strategy::parse(s, a.devices.unwrap_or(DEFAULT_DEVICES))?),
        None => None,
    };
    let devices = match (a.devices, strategy.and_then(|s| s.fixed_devices())) {
        (Some(n), _) => n,
        (None, Some(n)) => n,
        (None, None) => DEFAULT_DEVICES,
    };
    // The default blocks divide what each device's kernel holds.
    let (q_len, kv_len) = match strategy {
        Some(s) => s.local_lengths(dims.q_len, devices, a.load_balance),
        None => (dims.q_len, dims.kv_len),
    };
    let bq = a.block_q.unwrap_or_else(|| default_block(q_len, 512, 16));
    let bkv = a
        .block_kv
        .unwrap_or_else(|| default_block(kv_len, 512, 128));
    let blocks = BlockSizes::uniform(bq, bkv).with_fused_bwd(a.fused_bwd);
    let options = SplashOptions {
        scale: a.scale,
        soft_cap: a.soft_cap,
        ..SplashOptions::default()
    };
    if let Some(strategy) = strategy {
        if let Some(b) = a.backend.filter(|&b| b != Backend::Cpu) {
            bail!(
                "--strategy runs on the XLA CPU plugin's devices; drop --backend {b} or use \
                 --backend cpu"
            );
        }
        let cp = ContextParallel {
            dims,
            dtype: DType::F32,
            mask,
            block_sizes: blocks,
            options,
            strategy,
            devices,
            load_balance: a.load_balance,
        };
        cp.validate()?;
        return context_parallel_command(a, &cp, [&q, &k, &v], dout.as_ref(), seg.as_ref());
    }
    let backend = a.backend.unwrap_or(Backend::Interpret);
    let attn = SplashAttention::new(mask, dims, DType::F32, blocks, options, TargetRules::tpu())?;
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        segment_ids: seg.as_ref().map(|s| SegmentIds { q: s, kv: s }),
        sinks: None,
    };
    let fwd = attn.forward(&backend, &x)?;
    write_npy(&a.out, &fwd.out)?;
    if let Some(p) = &a.lse {
        write_npy(p, &fwd.lse)?;
    }
    if let Some(dout) = &dout {
        let g = attn.backward(&backend, &x, &fwd, dout)?;
        for (p, arr) in [(&a.dq, &g.dq), (&a.dk, &g.dk), (&a.dv, &g.dv)] {
            if let Some(p) = p {
                write_npy(p, arr)?;
            }
        }
    }
    if a.stats {
        println!("{}", stats_json(&attn.stats(), bq, bkv));
    }
    Ok(())
}

/// `tessera attention --strategy ..`: the context-parallel programs on CPU devices.
fn context_parallel_command(
    a: &AttentionArgs,
    cp: &ContextParallel,
    [q, k, v]: [&HostArray; 3],
    dout: Option<&HostArray>,
    segment_ids: Option<&HostArray>,
) -> Result<()> {
    let segmented = segment_ids.is_some();
    let forward = cp.forward_program(segmented)?;
    if let Some(path) = &a.dump_hlo {
        write_text(path, &forward.to_mlir())?;
    }
    let mut inputs = vec![q, k, v];
    inputs.extend(segment_ids);
    let outs = forward.run(&inputs)?;
    write_npy(&a.out, &outs[0])?;
    if let Some(p) = &a.lse {
        write_npy(p, &outs[1])?;
    }
    if let Some(dout) = dout {
        let backward = cp.backward_program(segmented)?;
        if let Some(path) = &a.dump_hlo {
            write_text(&backward_path(path), &backward.to_mlir())?;
        }
        let mut inputs = vec![q, k, v, &outs[0], &outs[1], dout];
        inputs.extend(segment_ids);
        let grads = backward.run(&inputs)?;
        for (p, arr) in [(&a.dq, &grads[0]), (&a.dk, &grads[1]), (&a.dv, &grads[2])] {
            if let Some(p) = p {
                write_npy(p, arr)?;
            }
        }
    }
    if a.stats {
        let s = cp.stats()?;
        print!("{s}");
        let total = |l: &[crate::context_parallel::CollectiveStat]| -> usize {
            l.iter().map(|c| c.bytes_per_device).sum()
        };
        println!(
            "{{\"strategy\":\"{}\",\"devices\":{},\"kv_heads_per_device\":{},\
             \"kv_bytes_per_device\":{},\"kv_replication\":{},\"blocks_per_device\":{:?},\
             \"forward_collectives\":{},\
             \"forward_bytes_per_device\":{},\"backward_collectives\":{},\
             \"backward_bytes_per_device\":{}}}",
            s.strategy,
            s.devices,
            s.kv_heads_per_device,
            s.kv_bytes_per_device,
            s.kv_replication,
            s.blocks_per_device,
            s.forward.len(),
            total(&s.forward),
            s.backward.len(),
            total(&s.backward)
        );
    }
    Ok(())
}

/// `prog.mlir` -> `prog.bwd.mlir` (`prog` -> `prog.bwd`).
fn backward_path(path: &Path) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.bwd.{}", ext.to_string_lossy()),
        None => format!("{stem}.bwd"),
    };
    path.with_file_name(name)
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
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

// ---------------------------------------------------------------------------------------
// `tessera bench attention`

/// What `tessera bench` measures.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Splash attention against dense attention (materialised scores) on the XLA CPU plugin:
    /// forward and forward+backward time, GFLOP/s and peak memory, one process per program.
    Attention(BenchArgs),
    /// Context-parallel strategies (Ulysses, all-gather, ring, USP) side by side on the same
    /// XLA CPU devices: forward and forward+backward times and their ratios.
    ContextParallel(crate::context_parallel::bench::CpBenchArgs),
}

/// Runs `tessera bench`.
pub fn bench(what: &BenchCommand) -> Result<()> {
    match what {
        BenchCommand::Attention(args) => bench_command(args),
        BenchCommand::ContextParallel(args) => crate::context_parallel::bench::bench_command(args),
    }
}

/// Arguments of `tessera bench attention`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Key/value heads (default: as many as query heads).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    #[arg(long, default_value_t = 4096)]
    pub seq: usize,
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    /// full, causal, causal:OFFSET, local:LEFT:RIGHT or chunked:SIZE.
    #[arg(long, default_value = "causal")]
    pub mask: String,
    #[arg(long, default_value_t = 512)]
    pub block_q: usize,
    #[arg(long, default_value_t = 512)]
    pub block_kv: usize,
    /// Keys per inner compute step of the forward and dK/dV kernels (default: block-kv).
    #[arg(long)]
    pub block_kv_compute: Option<usize>,
    /// Query block of the backward kernels (default: block-q).
    #[arg(long)]
    pub block_q_bwd: Option<usize>,
    /// Key block of the backward kernels (default: block-kv).
    #[arg(long)]
    pub block_kv_bwd: Option<usize>,
    /// Use separate dq and dkv backward kernels instead of the fused one.
    #[arg(long)]
    pub separate_bwd: bool,
    /// Timed runs per program (after one warm-up run, interleaved across programs); the
    /// minimum is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
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
        }
        Ok(SplashAttention::new(
            Mask::parse(&self.mask)?,
            self.dims(),
            DType::F32,
            blocks,
            SplashOptions::default(),
            TargetRules::tpu(),
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
        .map(|(i, s)| crate::reference::random(DType::F32, s, 100 + i as u64))
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

/// A variant compiled, with its device inputs.
struct Compiled {
    exe: tessera_runtime::LoadedExecutable,
    inputs: Vec<tessera_runtime::Buffer>,
    compile_s: f64,
}

impl Compiled {
    fn new(args: &BenchArgs, attn: &SplashAttention, variant: &str) -> Result<Self> {
        let pass = pass_of(variant);
        let module = if variant.starts_with("splash") {
            splash_program(attn, pass)?
        } else {
            let mask = Mask::parse(&args.mask)?;
            dense_program(attn.dims(), DType::F32, &mask, attn.scale(), None, pass)?
        };
        let client = Client::cpu_shared(1)?;
        let start = Instant::now();
        let exe = client.compile(&module.to_mlir(), &CompileOptions::single_device())?;
        let compile_s = start.elapsed().as_secs_f64();
        let mut inputs = bench_inputs(attn.dims());
        if pass == Pass::Forward {
            inputs.truncate(3);
        }
        let inputs = inputs
            .iter()
            .map(|a| client.buffer_from_host(&to_host_buffer(a)?, 0))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Compiled {
            exe,
            inputs,
            compile_s,
        })
    }

    /// Runs once; returns the seconds taken and the outputs.
    fn run(&self) -> Result<(f64, Vec<HostArray>)> {
        let refs: Vec<&tessera_runtime::Buffer> = self.inputs.iter().collect();
        let start = Instant::now();
        let outs = self.exe.execute(std::slice::from_ref(&refs))?;
        let secs = start.elapsed().as_secs_f64();
        let host = outs
            .into_iter()
            .flatten()
            .map(|b| from_host_buffer(&b.to_host()?).map_err(|e| anyhow!(e)))
            .collect::<Result<Vec<_>>>()?;
        Ok((secs, host))
    }
}

/// In a fresh process: compiles one variant, runs it once and prints
/// `{"peak_rss":..,"base_rss":..}` (bytes; base = before the run).
fn bench_child(args: &BenchArgs, variant: &str) -> Result<()> {
    let attn = args.attention()?;
    let c = Compiled::new(args, &attn, variant)?;
    let base = proc_status_bytes("VmRSS:");
    let refs: Vec<&tessera_runtime::Buffer> = c.inputs.iter().collect();
    drop(c.exe.execute(std::slice::from_ref(&refs))?);
    println!(
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
    let fwd_flops = 4.0 * d.head_dim as f64 * visible_pairs(&attn);
    println!(
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
    println!(
        "forward key blocks: {} computed ({} masked), {} skipped of {}",
        stats.computed(),
        stats.partial,
        stats.empty,
        stats.total
    );
    // Peak memory first, each program alone in a fresh process.
    let mut peak = HashMap::new();
    for variant in VARIANTS {
        peak.insert(variant, peak_memory(args, variant)?);
    }
    // Time the programs in one process, interleaved, so load changes hit all alike.
    let mut programs = Vec::new();
    for variant in VARIANTS {
        programs.push(Compiled::new(args, &attn, variant)?);
    }
    let mut best = [f64::INFINITY; VARIANTS.len()];
    let mut outputs: Vec<Vec<HostArray>> = vec![Vec::new(); VARIANTS.len()];
    for rep in 0..=args.reps.max(1) {
        for (i, p) in programs.iter().enumerate() {
            let (secs, outs) = p.run()?;
            // Run 0 warms up.
            if rep > 0 {
                best[i] = best[i].min(secs);
            }
            outputs[i] = outs;
        }
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!(
        "{:<14} {:>10} {:>10} {:>10} {:>15}",
        "program", "compile s", "best s", "GFLOP/s", "exec peak MiB"
    );
    for (i, variant) in VARIANTS.iter().enumerate() {
        let flops = match pass_of(variant) {
            Pass::Forward => fwd_flops,
            // Backward: 5 matmuls of the forward's size (dv, dp, dq, dk and the recomputed
            // or saved scores), so forward + backward is 3.5x the forward.
            Pass::ForwardBackward => 3.5 * fwd_flops,
        };
        println!(
            "{:<14} {:>10.2} {:>10.4} {:>10.2} {:>15.1}",
            variant,
            programs[i].compile_s,
            best[i],
            flops / best[i] / 1e9,
            mib(peak[variant])
        );
    }
    let mut summary = Vec::new();
    for (pass, s, dn) in [("fwd", 0, 1), ("fwd+bwd", 2, 3)] {
        let ratio = best[dn] / best[s];
        println!(
            "{pass:<8} splash {:.3} s vs dense {:.3} s: {ratio:.2}x faster; peak memory \
             {:.1} MiB vs {:.1} MiB",
            best[s],
            best[dn],
            mib(peak[VARIANTS[s]]),
            mib(peak[VARIANTS[dn]])
        );
        summary.push(format!("\"{}_speedup\":{ratio:.3}", pass.replace('+', "")));
    }
    // The two implementations must agree.
    let names = ["out", "lse", "dq", "dk", "dv"];
    let mut worst = 0.0f64;
    for (name, (a, b)) in names.iter().zip(outputs[2].iter().zip(&outputs[3])) {
        let (err, _) = crate::reference::max_abs_diff(&a.to_f64_vec(), &b.to_f64_vec());
        worst = worst.max(err);
        println!("max |splash - dense| {name}: {err:.2e}");
    }
    println!(
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

/// The number of visible (query, key) pairs over the whole batch and all heads.
fn visible_pairs(attn: &SplashAttention) -> f64 {
    let d = attn.dims();
    let o = attn.options().offsets;
    let count = |m: &Mask| -> u64 {
        (0..d.q_len)
            .map(|i| {
                (0..d.kv_len)
                    .filter(|&j| m.allows((o.q + i) as i64, (o.kv + j) as i64))
                    .count() as u64
            })
            .sum()
    };
    let pairs: u64 = match attn.mask() {
        tessera_splash::MultiHeadMask::Shared(m) => count(m) * d.heads as u64,
        tessera_splash::MultiHeadMask::PerHead(ms) => ms.iter().map(count).sum(),
    };
    (pairs * d.batch as u64) as f64
}
