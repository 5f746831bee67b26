//! Splash attention inside StableHLO programs: lowering a plan's kernel stages into a
//! function being built ([`lower_stages`], and [`lower_stages_on_shard`] inside an SPMD
//! program), a forward that autodiff differentiates through the backward kernels
//! ([`lower_forward_on_shard`]), a whole attention as one program ([`splash_program`]), and
//! the dense-attention baseline an XLA user writes without a kernel ([`dense_program`]).
//!
//! This module builds programs; it never runs them (splash does not depend on the runtime).

use std::collections::HashMap;
use std::rc::Rc;

use tessera_dsl::mosaic::ArgValues;
use tessera_dsl::{ArgSpec, CallFacts, DType, HostArray};
use tessera_hlo::autodiff::{VjpCall, VjpRule};
use tessera_hlo::{
    self as hlo, ComparisonDirection, DotDims, FuncBuilder, HloError, Module, Reducer,
};

use crate::attention::{Dims, Features, SplashAttention, Stage, StageArg, Tensor};
use crate::error::{MaskError, MissingIn, OptionsError, PlanBug, SplashError};
use crate::mask::{Mask, PositionOps};

type Result<T, E = SplashError> = std::result::Result<T, E>;

/// Lowers `stages` into the function `f` is building, each kernel for its stage's lowering
/// (inline StableHLO loops, or a Mosaic `tpu_custom_call` for
/// [`Lowering::tpu`](tessera_dsl::Lowering::tpu)). `env` holds
/// the program values of the tensors the stages read (inputs) and receives those they
/// produce. Constant arguments (tables, placeholders) become program constants.
pub fn lower_stages(
    f: &mut FuncBuilder<'_>,
    stages: &[Stage],
    env: &mut HashMap<Tensor, hlo::Value>,
) -> Result<()> {
    lower_stages_on_shard(f, stages, env, None)
}

/// [`lower_stages`] inside an SPMD program: a [`StageArg::PerShard`] argument becomes one
/// constant holding every shard's array, sliced at run time by `shard` (this device's shard
/// index, an `i32` scalar).
pub fn lower_stages_on_shard(
    f: &mut FuncBuilder<'_>,
    stages: &[Stage],
    env: &mut HashMap<Tensor, hlo::Value>,
    shard: Option<hlo::Value>,
) -> Result<()> {
    for stage in stages {
        let mut args = Vec::with_capacity(stage.args.len());
        for a in &stage.args {
            args.push(match a {
                StageArg::Const(c) => f.constant(c)?,
                StageArg::Tensor(t) => *env.get(t).ok_or_else(|| {
                    SplashError::Internal(PlanBug::NotYetProduced {
                        kernel: stage.def.name().to_string(),
                        tensor: *t,
                    })
                })?,
                StageArg::PerShard(arrays) => {
                    let shard = shard.ok_or_else(|| {
                        SplashError::Internal(PlanBug::NoShardIndex {
                            kernel: stage.def.name().to_string(),
                        })
                    })?;
                    shard_constant(f, arrays, shard)?
                }
                StageArg::Zeros(spec) => f.splat(0.0, tensor_type(spec.dtype, &spec.shape))?,
            });
        }
        let mut specs = Vec::with_capacity(args.len());
        for &v in &args {
            let ty = f.value_type(v)?;
            let shape: Vec<usize> = ty.dims.iter().map(|&d| d as usize).collect();
            specs.push(ArgSpec::new(ty.dtype, shape));
        }
        let kernel = stage.def.instantiate(&specs, &stage.lowering.rules)?;
        // The tables are host arrays: a Mosaic call's schedule counts the blocks they run.
        let known: Vec<ArgValues<'_>> = stage
            .args
            .iter()
            .map(|a| match a {
                StageArg::Const(c) => ArgValues::Same(c),
                StageArg::PerShard(arrays) => ArgValues::PerShard(arrays),
                StageArg::Tensor(_) | StageArg::Zeros(_) => ArgValues::Unknown,
            })
            .collect();
        let facts = CallFacts {
            active_grid_steps: stage.active_steps,
            known: &known,
        };
        let outs = stage.lowering.lower_into(&kernel, f, &args, facts)?;
        env.extend(stage.outputs.iter().copied().zip(outs));
    }
    Ok(())
}

/// Lowers a forward plan (`Q, K, V -> Out, Lse`) into `f` like [`lower_stages_on_shard`], as
/// one custom-VJP unit ([`FuncBuilder::custom_vjp`]) whose backward lowers `backward`, the
/// same attention's [`backward_plan`](crate::SplashAttention::backward_plan): reverse-mode
/// autodiff of a program holding the attention runs the kernel author's backward kernels,
/// never the forward kernel's loop. The unit's inputs are `Q`, `K`, `V` (their cotangents
/// `Dq`, `Dk`, `Dv`); the other tensors in `env` (segment ids, sinks) are not differentiated.
/// A cotangent of `Lse` (ring attention's merge has one) enters the backward kernels as
/// `Di - dLse`: `d lse / d logits` is the softmax, so it adds `p dLse` to `ds = p (dp - Di)`.
pub fn lower_forward_on_shard(
    f: &mut FuncBuilder<'_>,
    forward: &[Stage],
    backward: Vec<Stage>,
    env: &mut HashMap<Tensor, hlo::Value>,
    shard: Option<hlo::Value>,
) -> Result<()> {
    let mut inputs = Vec::with_capacity(3);
    for t in DIFFERENTIATED {
        inputs.push(*env.get(&t).ok_or_else(|| {
            SplashError::Internal(PlanBug::Missing {
                tensor: t,
                place: MissingIn::ForwardEnvironment,
            })
        })?);
    }
    if !backward
        .first()
        .is_some_and(|s| s.outputs.contains(&Tensor::Di))
    {
        return Err(SplashError::Internal(PlanBug::BackwardWithoutDi));
    }
    let context: HashMap<Tensor, hlo::Value> = env
        .iter()
        .filter(|(t, _)| !DIFFERENTIATED.contains(t))
        .map(|(&t, &v)| (t, v))
        .collect();
    let rule = Rc::new(SplashVjp {
        backward,
        context: context.clone(),
        shard,
    });
    let outs = f.custom_vjp(rule, &inputs, |f, x| {
        let mut env = context.clone();
        env.extend(DIFFERENTIATED.into_iter().zip(x.iter().copied()));
        lower_stages_on_shard(f, forward, &mut env, shard)?;
        let out = |t: Tensor| {
            env.get(&t).copied().ok_or_else(|| {
                SplashError::Internal(PlanBug::Missing {
                    tensor: t,
                    place: MissingIn::ForwardResults,
                })
            })
        };
        Ok::<_, SplashError>(vec![out(Tensor::Out)?, out(Tensor::Lse)?])
    })?;
    env.insert(Tensor::Out, outs[0]);
    env.insert(Tensor::Lse, outs[1]);
    Ok(())
}

/// The tensors a splash forward unit differentiates.
const DIFFERENTIATED: [Tensor; 3] = [Tensor::Q, Tensor::K, Tensor::V];

/// The VJP of a splash forward: its backward plan on the unit's inputs and outputs.
#[derive(Debug)]
struct SplashVjp {
    backward: Vec<Stage>,
    /// The forward's other tensors (segment ids, sinks).
    context: HashMap<Tensor, hlo::Value>,
    shard: Option<hlo::Value>,
}

impl VjpRule for SplashVjp {
    fn name(&self) -> &str {
        "splash attention"
    }

    fn vjp(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<hlo::Value>>, HloError> {
        let failed = |e: SplashError| HloError::Autodiff {
            op: "custom_vjp".into(),
            reason: format!("`splash attention`: lowering its backward: {e}"),
        };
        let mut env = self.context.clone();
        env.extend(DIFFERENTIATED.into_iter().zip(call.inputs.iter().copied()));
        env.insert(Tensor::Out, call.outputs[0]);
        env.insert(Tensor::Lse, call.outputs[1]);
        let dout = match call.cotangents[0] {
            Some(d) => d,
            None => {
                let t = f.value_type(call.outputs[0])?.clone();
                f.splat(0.0, t)?
            }
        };
        env.insert(Tensor::DOut, dout);
        let (prep, kernels) = self.backward.split_at(1);
        lower_stages_on_shard(f, prep, &mut env, self.shard).map_err(failed)?;
        if let Some(dlse) = call.cotangents[1] {
            let di = env[&Tensor::Di];
            env.insert(Tensor::Di, f.sub(di, dlse)?);
        }
        lower_stages_on_shard(f, kernels, &mut env, self.shard).map_err(failed)?;
        let mut grads = Vec::with_capacity(3);
        for (t, &x) in [Tensor::Dq, Tensor::Dk, Tensor::Dv]
            .into_iter()
            .zip(call.inputs)
        {
            let g = *env.get(&t).ok_or_else(|| {
                failed(SplashError::Internal(PlanBug::Missing {
                    tensor: t,
                    place: MissingIn::BackwardResults,
                }))
            })?;
            let want = f.value_type(x)?.dtype;
            grads.push(Some(if f.value_type(g)?.dtype == want {
                g
            } else {
                f.convert(g, want)?
            }));
        }
        Ok(grads)
    }
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
    let stacked = HostArray::from_f64(arrays[0].dtype(), stacked_shape, &values).map_err(|e| {
        SplashError::Internal(PlanBug::PerShardTables {
            source: Box::new(e),
        })
    })?;
    let all = f.constant(&stacked)?;
    let zero = f.scalar(0.0, DType::I32)?;
    let mut starts = vec![shard];
    starts.extend(std::iter::repeat_n(zero, shape.len()));
    let mut sizes = vec![1i64];
    sizes.extend(shape.iter().map(|&d| d as i64));
    let one = f.dynamic_slice(all, &starts, &sizes)?;
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Ok(f.reshape(one, &dims)?)
}

/// What a program computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// `q, k, v -> out, lse`.
    Forward,
    /// `q, k, v -> out`: the forward without its residual
    /// ([`SplashAttention::inference_plan`]), for a forward no backward follows.
    Inference,
    /// `q, k, v, out, lse, dout -> dq, dk, dv` (the backward kernels alone).
    Backward,
    /// `q, k, v, dout -> out, lse, dq, dk, dv`.
    ForwardBackward,
}

fn tensor_type(dtype: DType, shape: &[usize]) -> hlo::TensorType {
    hlo::TensorType::new(shape.iter().map(|&d| d as i64).collect::<Vec<_>>(), dtype)
}

/// Splash attention (no sinks) as one StableHLO program over its kernels, each lowered for
/// the attention's lowering. Arguments: `q, k, v`, then with `features.segmented` the query
/// and key segment ids `[B, Sq]`, `[B, Skv]` int32, then for [`Pass::Backward`]
/// `out, lse [B, H, Sq], dout` and for [`Pass::ForwardBackward`] `dout`.
pub fn splash_program(attn: &SplashAttention, pass: Pass, features: Features) -> Result<Module> {
    if features.sinks {
        return Err(SplashError::Options(OptionsError::SinksInProgram));
    }
    let d = attn.dims();
    let mut m = Module::new("splash_attention");
    let mut f = m.func("main");
    let dt = attn.dtype();
    let out_shape = [d.batch, d.heads, d.q_len, d.head_dim_v];
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
    if features.segmented {
        let (b, sq, skv) = (d.batch as i64, d.q_len as i64, d.kv_len as i64);
        let qs = f.arg(tensor_type(DType::I32, &[d.batch, d.q_len]))?;
        let ks = f.arg(tensor_type(DType::I32, &[d.batch, d.kv_len]))?;
        let qs = f.reshape(qs, &[b, 1, sq])?;
        let ks = f.reshape(ks, &[b, 1, skv])?;
        env.extend([(Tensor::QSegments, qs), (Tensor::KvSegments, ks)]);
    }
    let lse_dims = [d.batch as i64, d.heads as i64, d.q_len as i64];
    let mut results = Vec::new();
    match pass {
        Pass::Inference => {
            lower_stages(&mut f, &attn.inference_plan(features), &mut env)?;
            results.push(env[&Tensor::Out]);
        }
        Pass::Forward => {
            lower_stages(&mut f, &attn.forward_plan(features), &mut env)?;
            let lse = f.reshape(env[&Tensor::Lse], &lse_dims)?;
            results.extend([env[&Tensor::Out], lse]);
        }
        Pass::ForwardBackward => {
            // The gradient of sum(out * dout): the backward kernels, through autodiff.
            let (forward, backward) = (attn.forward_plan(features), attn.backward_plan(features));
            lower_forward_on_shard(&mut f, &forward, backward, &mut env, None)?;
            let lse = f.reshape(env[&Tensor::Lse], &lse_dims)?;
            results.extend([env[&Tensor::Out], lse]);
            let dout = f.arg(tensor_type(dt, &out_shape))?;
            results.extend(f.vjp(&[env[&Tensor::Out]], &[dout], &[q, k, v])?);
        }
        Pass::Backward => {
            // The backward kernels alone, on the forward's saved results.
            let out = f.arg(tensor_type(dt, &out_shape))?;
            let lse = f.arg(tensor_type(DType::F32, &[d.batch, d.heads, d.q_len]))?;
            let lse = f.reshape(lse, &[lse_dims[0], lse_dims[1], 1, lse_dims[2]])?;
            env.extend([(Tensor::Out, out), (Tensor::Lse, lse)]);
            let dout = f.arg(tensor_type(dt, &out_shape))?;
            env.insert(Tensor::DOut, dout);
            lower_stages(&mut f, &attn.backward_plan(features), &mut env)?;
            results.extend([env[&Tensor::Dq], env[&Tensor::Dk], env[&Tensor::Dv]]);
        }
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
    if pass == Pass::Backward {
        return Err(SplashError::Options(OptionsError::DenseBaselineDirection));
    }
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
    let mut results = if pass == Pass::Inference {
        vec![out_t]
    } else {
        vec![out_t, lse]
    };
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
    mask.check(sq, skv)?;
    let expr = mask
        .to_expr()
        .ok_or_else(|| SplashError::Mask(MaskError::DenseInBaseline))?;
    let ty = tensor_type(DType::I32, &[d.q_len, d.kv_len]);
    let q = f.iota(ty.clone(), 0)?;
    let kv = f.iota(ty.clone(), 1)?;
    let vis = expr.eval(&mut ProgramPositions { f, ty }, q, kv)?;
    let vis = f.broadcast_in_dim(vis, &[d.batch as i64, d.heads as i64, sq, skv], &[2, 3])?;
    Ok(Some(vis))
}

/// Masks on StableHLO values: `i32` positions and `i1` visibility, all of type `ty`'s shape.
struct ProgramPositions<'f, 'm> {
    f: &'f mut FuncBuilder<'m>,
    ty: hlo::TensorType,
}

impl ProgramPositions<'_, '_> {
    fn int(&mut self, x: i64) -> Result<hlo::Value> {
        Ok(self.f.splat(x as f64, self.ty.clone())?)
    }
}

impl PositionOps for ProgramPositions<'_, '_> {
    type Pos = hlo::Value;
    type Vis = hlo::Value;
    type Error = SplashError;

    fn add(&mut self, p: hlo::Value, by: i64) -> Result<hlo::Value> {
        if by == 0 {
            return Ok(p);
        }
        let by = self.int(by)?;
        Ok(self.f.add(p, by)?)
    }
    fn chunk_index(&mut self, p: hlo::Value, chunk: i64) -> Result<hlo::Value> {
        let chunk = self.int(chunk)?;
        Ok(self.f.div(p, chunk)?)
    }
    fn le(&mut self, a: hlo::Value, b: hlo::Value) -> Result<hlo::Value> {
        Ok(self.f.compare(ComparisonDirection::Le, a, b)?)
    }
    fn eq(&mut self, a: hlo::Value, b: hlo::Value) -> Result<hlo::Value> {
        Ok(self.f.compare(ComparisonDirection::Eq, a, b)?)
    }
    fn and(&mut self, a: hlo::Value, b: hlo::Value) -> Result<hlo::Value> {
        Ok(self.f.and(a, b)?)
    }
    fn or(&mut self, a: hlo::Value, b: hlo::Value) -> Result<hlo::Value> {
        Ok(self.f.or(a, b)?)
    }
    fn all_visible(&mut self) -> Result<hlo::Value> {
        Ok(self.f.splat(1.0, self.ty.with_dtype(DType::Bool))?)
    }
}
