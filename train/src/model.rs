//! The model and its train step as one SPMD StableHLO program on [`ModelMesh`].
//!
//! Every device holds all parameters (replicated) and its block of the batch: `b` sequences
//! of `s` tokens (the batch split over `data`, each sequence over `context`). The program,
//! per device:
//!
//! 1. **Forward.** One-hot token embedding, then the decoder layers as one loop
//!    ([`Spmd::scan`]) over the layers' stacked weights (`[L, ...]` parameters), whose body is
//!    one layer: RMSNorm, the q/k/v projections, RoPE at the tokens' global positions (an
//!    input, so any sequence layout works), the context-parallel attention
//!    ([`AttentionLayer::forward`]: the strategy's collectives and splash kernels), the output
//!    projection and residual, RMSNorm, SwiGLU MLP and residual; final RMSNorm, LM head,
//!    softmax cross-entropy summed over the device's tokens. The program's size and compile
//!    time do not grow with the number of layers.
//! 2. **Backward.** Reverse-mode autodiff of that forward ([`Spmd::vjp`], `tessera_hlo`'s
//!    VJP rules): through the attention, the splash calls are custom-VJP units running splash's
//!    backward kernels and every collective goes back through its transpose, so each strategy's
//!    backward is the gradient of its forward. The layer loop's backward is a loop too, which
//!    re-runs each layer's forward from its saved input (per-layer rematerialisation).
//! 3. **Reduce.** One all-reduce over all devices sums every parameter's gradient and the
//!    loss (each device contributed its tokens).
//! 4. **Update.** Global-norm clipping and AdamW, identical on every device, so parameters
//!    and moments stay replicated on the devices from step to step.

use tessera_collectives::axes::Data;
use tessera_collectives::{
    CollectiveError, DTensor, Invariant, LocalValue, Program, Replicated, Split, Spmd,
};
use tessera_hlo::{DType, FuncBuilder, Grouping, HostArray, Reducer, TensorType, UnaryOp, Value};
use tessera_parallel::{AttentionLayer, ModelMesh, TokenLayout};

use crate::config::{ModelConfig, TrainConfig};
use crate::TrainError;

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal with this standard deviation.
    Normal(f64),
    /// All ones (norm scales).
    Ones,
}

/// One parameter tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Its name in checkpoints (`layers.attention.wq`).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Whether it stacks one tensor per decoder layer along dim 0 (`[L, ...]`).
    pub stacked: bool,
    /// Its initialisation.
    pub init: Init,
    /// Whether AdamW decays it (matrices, not norms).
    pub decay: bool,
}

/// The parameters of `m`, in the order the programs take them.
pub fn param_specs(m: &ModelConfig) -> Vec<ParamSpec> {
    let (d, hd, f) = (m.d_model, m.head_dim, m.mlp_dim);
    let matrix = |name: String, rows: usize, cols: usize, scale: f64| ParamSpec {
        name,
        shape: vec![rows, cols],
        stacked: false,
        init: Init::Normal(scale / (rows as f64).sqrt()),
        decay: true,
    };
    let norm = |name: String| ParamSpec {
        name,
        shape: vec![d],
        stacked: false,
        init: Init::Ones,
        decay: false,
    };
    // A layer's tensor stacked over the layers: `[L, ...]`.
    let stack = |s: ParamSpec| ParamSpec {
        name: format!("layers.{}", s.name),
        shape: [m.layers].into_iter().chain(s.shape).collect(),
        stacked: true,
        ..s
    };
    // Residual branches' output projections start smaller, so the stream's scale does not
    // grow with depth (GPT-2's 1/sqrt(2L)).
    let out_scale = 1.0 / (2.0 * m.layers as f64).sqrt();
    let mut specs = vec![ParamSpec {
        name: "embed".into(),
        shape: vec![m.vocab, d],
        stacked: false,
        init: Init::Normal(1.0),
        decay: true,
    }];
    let p = |s: &str| s.to_string();
    specs.extend(
        [
            norm(p("attention_norm")),
            matrix(p("attention.wq"), d, m.heads * hd, 1.0),
            matrix(p("attention.wk"), d, m.kv_heads * hd, 1.0),
            matrix(p("attention.wv"), d, m.kv_heads * hd, 1.0),
            matrix(p("attention.wo"), m.heads * hd, d, out_scale),
            norm(p("mlp_norm")),
            matrix(p("mlp.w1"), d, f, 1.0),
            matrix(p("mlp.w3"), d, f, 1.0),
            matrix(p("mlp.w2"), f, d, out_scale),
        ]
        .map(stack),
    );
    specs.push(norm("final_norm".into()));
    specs.push(matrix("lm_head".into(), d, m.vocab, 1.0));
    specs
}

/// The parameters of one layer (or their `[L, ...]` stacks), as program values.
#[derive(Debug, Clone, Copy)]
struct LayerParams {
    attention_norm: Value,
    wq: Value,
    wk: Value,
    wv: Value,
    wo: Value,
    mlp_norm: Value,
    w1: Value,
    w3: Value,
    w2: Value,
}

impl LayerParams {
    /// The layer's parameters in [`param_specs`] order.
    fn from_slice(x: &[Value]) -> Self {
        LayerParams {
            attention_norm: x[0],
            wq: x[1],
            wk: x[2],
            wv: x[3],
            wo: x[4],
            mlp_norm: x[5],
            w1: x[6],
            w3: x[7],
            w2: x[8],
        }
    }
}

/// Stacked layer parameters in [`param_specs`].
const PER_LAYER: usize = 9;

/// This device's token rows `[b * s, d]` of the residual stream: its batch block over `data`,
/// its sequence block over `context` (and `ring`, which one dim cannot say). A layer's
/// input and output.
type TokenRows = (Split<Data>, Replicated);
/// A stacked norm scale `[L, d]`.
type StackedVector = (Replicated, Replicated);
/// A stacked matrix `[L, rows, cols]`.
type StackedMatrix = (Replicated, Replicated, Replicated);

/// What the programs compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Forward, backward, all-reduce, AdamW: params, moments, loss and gradient norm out.
    Train,
    /// The forward alone: the loss.
    Forward,
    /// Forward and backward with the all-reduce: the loss and the gradient norm, no update.
    Gradients,
}

/// Builds the program of `kind` for `cfg` with `layer` as its attention. Inputs: the
/// parameters (and for `Train` the AdamW moments `mu`, `nu`, and the step's scalars), then
/// tokens, targets, positions (`[B, S]` int32 declared as [`TokenLayout`]).
pub fn build_program(
    cfg: &TrainConfig,
    layer: &AttentionLayer,
    kind: StepKind,
) -> Result<Program<ModelMesh>, TrainError> {
    let specs = param_specs(&cfg.model);
    let n = specs.len();
    let mesh = layer.mesh()?;
    let devices = mesh.num_devices();
    let m = cfg.model;
    let mut program = Program::build(
        match kind {
            StepKind::Train => "train_step",
            StepKind::Forward => "forward",
            StepKind::Gradients => "gradients",
        },
        &mesh,
        |p| {
            let params = specs
                .iter()
                .map(|s| replicated_arg(p, &s.shape))
                .collect::<Result<Vec<_>, _>>()?;
            let moments = if kind == StepKind::Train {
                let mut mv = Vec::with_capacity(2 * n);
                for s in specs.iter().chain(&specs) {
                    mv.push(replicated_arg(p, &s.shape)?);
                }
                mv
            } else {
                Vec::new()
            };
            let hyper = if kind == StepKind::Train {
                Some(replicated_arg(p, &[3])?)
            } else {
                None
            };
            let token_dims = layer.token_dims();
            let ids = [
                p.arg::<TokenLayout>(token_dims, DType::I32)?.value(),
                p.arg::<TokenLayout>(token_dims, DType::I32)?.value(),
                p.arg::<TokenLayout>(token_dims, DType::I32)?.value(),
            ];
            let model = Model::new(&m, &params, cfg, layer);
            let loss_sum = model.forward(p, ids)?;
            if kind == StepKind::Forward {
                let loss = p.with_builder(|f| {
                    let all = all_reduce_sum(f, loss_sum, devices)?;
                    scale(f, all, 1.0 / cfg.tokens_per_step() as f64)
                })?;
                return scalar_output(p, loss);
            }
            let grads = gradients(p, loss_sum, &params, cfg)?;
            let (loss, grads) = p.with_builder(|f| reduce_gradients(f, &grads, loss_sum, cfg))?;
            if kind == StepKind::Gradients {
                // The global norm depends on every gradient, so nothing is pruned, and the
                // program writes no more than the full step does.
                let norm = p.with_builder(|f| global_norm(f, &grads))?;
                scalar_output(p, loss)?;
                return scalar_output(p, norm);
            }
            let hyper = hyper.expect("a train step has its scalars");
            let (norm, new) =
                p.with_builder(|f| adamw(f, cfg, &specs, &params, &moments, &grads, hyper))?;
            for (v, i) in new.iter().zip((0..n).cycle()) {
                replicated_output(p, *v, specs[i].shape.len())?;
            }
            scalar_output(p, loss)?;
            scalar_output(p, norm)
        },
    )?;
    if kind == StepKind::Train {
        // Parameters and moments are updated in place: each state output reuses the memory
        // of its (donated) argument.
        for i in 0..3 * n {
            program.donate(i, i)?;
        }
    }
    Ok(program)
}

/// A replicated argument of `shape` (f32).
fn replicated_arg(p: &Spmd<'_, ModelMesh>, shape: &[usize]) -> Result<Value, CollectiveError> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Ok(match shape.len() {
        1 => p.arg::<(Replicated,)>(dims, DType::F32)?.value(),
        2 => p.arg::<StackedVector>(dims, DType::F32)?.value(),
        3 => p.arg::<StackedMatrix>(dims, DType::F32)?.value(),
        r => return Err(CollectiveError::local(format!("no rank-{r} parameters"))),
    })
}

fn replicated_output(
    p: &Spmd<'_, ModelMesh>,
    v: Value,
    rank: usize,
) -> Result<(), CollectiveError> {
    match rank {
        1 => p
            .declare::<(Replicated,), Invariant>(v)?
            .output::<(Replicated,)>(),
        2 => p
            .declare::<(Replicated, Replicated), Invariant>(v)?
            .output::<(Replicated, Replicated)>(),
        _ => p
            .declare::<StackedMatrix, Invariant>(v)?
            .output::<StackedMatrix>(),
    }
}

fn scalar_output(p: &Spmd<'_, ModelMesh>, v: Value) -> Result<(), CollectiveError> {
    p.declare::<(), Invariant>(v)?.output::<()>()
}

/// The model's values in one program.
struct Model<'a> {
    m: &'a ModelConfig,
    layer: &'a AttentionLayer,
    embed: Value,
    /// Every layer's parameters stacked `[L, ...]`.
    layers: LayerParams,
    final_norm: Value,
    lm_head: Value,
    /// Sequences and tokens per sequence on each device.
    b: i64,
    s: i64,
}

impl<'a> Model<'a> {
    fn new(
        m: &'a ModelConfig,
        params: &[Value],
        cfg: &'a TrainConfig,
        layer: &'a AttentionLayer,
    ) -> Self {
        let layers = LayerParams::from_slice(&params[1..1 + PER_LAYER]);
        let cp = cfg.ici_context_parallelism;
        Model {
            m,
            layer,
            embed: params[0],
            layers,
            final_norm: params[params.len() - 2],
            lm_head: params[params.len() - 1],
            b: (cfg.per_device_batch_size * cp) as i64,
            s: (cfg.max_target_length / cp) as i64,
        }
    }

    /// The cross-entropy summed over this device's tokens (f32 scalar).
    fn forward(&self, p: &Spmd<'_, ModelMesh>, ids: [Value; 3]) -> Result<Value, CollectiveError> {
        let m = self.m;
        let n = self.b * self.s;
        let (target_onehot, cos, sin, x) = p.with_builder(|f| {
            let flat = |f: &mut FuncBuilder<'_>, v| f.reshape(v, &[n]);
            let (tokens, targets, positions) =
                (flat(f, ids[0])?, flat(f, ids[1])?, flat(f, ids[2])?);
            let onehot = one_hot(f, tokens, m.vocab)?;
            let target_onehot = one_hot(f, targets, m.vocab)?;
            let (cos, sin) = rope_tables(f, positions, m.head_dim, m.rope_theta)?;
            let x = f.matmul(onehot, self.embed, DType::F32)?;
            Ok((target_onehot, cos, sin, x))
        })?;
        let stacks = &self.layers;
        let vectors = [stacks.attention_norm, stacks.mlp_norm]
            .map(|v| p.declare::<StackedVector, Invariant>(v))
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let matrices = [
            stacks.wq, stacks.wk, stacks.wv, stacks.wo, stacks.w1, stacks.w3, stacks.w2,
        ]
        .map(|v| p.declare::<StackedMatrix, Invariant>(v))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        let x0 = p.declare::<TokenRows, Invariant>(x)?;
        let x = p
            .scan(
                m.layers,
                &x0,
                &(vectors, matrices),
                |p, _layer, x, (vectors, matrices)| {
                    let w = LayerParams {
                        attention_norm: vectors[0].value(),
                        mlp_norm: vectors[1].value(),
                        wq: matrices[0].value(),
                        wk: matrices[1].value(),
                        wv: matrices[2].value(),
                        wo: matrices[3].value(),
                        w1: matrices[4].value(),
                        w3: matrices[5].value(),
                        w2: matrices[6].value(),
                    };
                    let y = self.layer(p, x.value(), &w, cos, sin)?;
                    p.declare::<TokenRows, Invariant>(y)
                },
            )?
            .value();
        p.with_builder(|f| {
            let (h, _) = rms_norm(f, x, self.final_norm, m.norm_eps)?;
            let logits = f.matmul(h, self.lm_head, DType::F32)?;
            let lse = logsumexp(f, logits)?;
            let picked = f.mul(logits, target_onehot)?;
            let picked = f.reduce(picked, &[1], Reducer::Sum)?;
            let per_token = f.sub(lse, picked)?;
            Ok(f.reduce(per_token, &[0], Reducer::Sum)?)
        })
    }

    /// One decoder layer on the token rows `x` with the weights `w` (one layer's), built on
    /// `p` (the layer loop's body).
    fn layer(
        &self,
        p: &Spmd<'_, ModelMesh>,
        x: Value,
        w: &LayerParams,
        cos: Value,
        sin: Value,
    ) -> Result<Value, CollectiveError> {
        let m = self.m;
        let (q, k, v) = p.with_builder(|f| {
            let (h, _) = rms_norm(f, x, w.attention_norm, m.norm_eps)?;
            let q = f.matmul(h, w.wq, DType::F32)?;
            let k = f.matmul(h, w.wk, DType::F32)?;
            let v = f.matmul(h, w.wv, DType::F32)?;
            let q = rope(f, q, m.heads, cos, sin)?;
            let k = rope(f, k, m.kv_heads, cos, sin)?;
            Ok((
                to_heads(f, q, self.b, self.s, m.heads)?,
                to_heads(f, k, self.b, self.s, m.kv_heads)?,
                to_heads(f, v, self.b, self.s, m.kv_heads)?,
            ))
        })?;
        let (out, _lse) = self.layer.forward(p, q, k, v)?;
        p.with_builder(|f| {
            let out = from_heads(f, out)?;
            let proj = f.matmul(out, w.wo, DType::F32)?;
            let x1 = f.add(x, proj)?;
            let (h2, _) = rms_norm(f, x1, w.mlp_norm, m.norm_eps)?;
            let a = f.matmul(h2, w.w1, DType::F32)?;
            let c = f.matmul(h2, w.w3, DType::F32)?;
            let act = silu(f, a)?;
            let gated = f.mul(act, c)?;
            let down = f.matmul(gated, w.w2, DType::F32)?;
            Ok(f.add(x1, down)?)
        })
    }
}

/// The gradient of the step's mean loss with respect to every parameter, from this device's
/// tokens (summed over the devices afterwards): the VJP of the device's summed loss with the
/// cotangent `1 / tokens per step`.
fn gradients(
    p: &Spmd<'_, ModelMesh>,
    loss_sum: Value,
    params: &[Value],
    cfg: &TrainConfig,
) -> Result<Vec<Value>, CollectiveError> {
    let inv_tokens = 1.0 / cfg.tokens_per_step() as f64;
    let seed = p.with_builder(|f| Ok(f.scalar(inv_tokens, DType::F32)?))?;
    let loss = p.declare::<(), Invariant>(loss_sum)?;
    let seed = p.declare::<(), Invariant>(seed)?;
    let wrt: Vec<ParamTensor<'_>> = params
        .iter()
        .map(|&v| ParamTensor::declare(p, v))
        .collect::<Result<_, _>>()?;
    let wrt: Vec<&dyn LocalValue<ModelMesh>> = wrt.iter().map(ParamTensor::local).collect();
    p.vjp(&[&loss], &[&seed], &wrt)
}

/// A replicated parameter as a typed tensor of its rank.
enum ParamTensor<'p> {
    Vector(DTensor<'p, ModelMesh, (Replicated,)>),
    Matrix(DTensor<'p, ModelMesh, (Replicated, Replicated)>),
    StackedMatrix(DTensor<'p, ModelMesh, StackedMatrix>),
}

impl<'p> ParamTensor<'p> {
    fn declare(p: &'p Spmd<'_, ModelMesh>, v: Value) -> Result<Self, CollectiveError> {
        let rank = p.with_builder(|f| Ok(f.value_type(v)?.rank()))?;
        Ok(match rank {
            1 => ParamTensor::Vector(p.declare::<(Replicated,), Invariant>(v)?),
            2 => ParamTensor::Matrix(p.declare::<(Replicated, Replicated), Invariant>(v)?),
            _ => ParamTensor::StackedMatrix(p.declare::<StackedMatrix, Invariant>(v)?),
        })
    }

    fn local(&self) -> &dyn LocalValue<ModelMesh> {
        match self {
            ParamTensor::Vector(t) => t,
            ParamTensor::Matrix(t) => t,
            ParamTensor::StackedMatrix(t) => t,
        }
    }
}

/// `x * c` for a constant `c`.
fn scale(f: &mut FuncBuilder<'_>, x: Value, c: f64) -> Result<Value, CollectiveError> {
    let t = f.value_type(x)?.clone();
    let c = f.splat(c, t)?;
    Ok(f.mul(x, c)?)
}

/// `x` ([`N`] or a scalar) broadcast along new dims to `dims`, keeping `keep`.
fn bcast(
    f: &mut FuncBuilder<'_>,
    x: Value,
    dims: &[i64],
    keep: &[i64],
) -> Result<Value, CollectiveError> {
    Ok(f.broadcast_in_dim(x, dims, keep)?)
}

/// `[N]` int32 ids as `[N, vocab]` f32 one-hot rows.
fn one_hot(f: &mut FuncBuilder<'_>, ids: Value, vocab: usize) -> Result<Value, CollectiveError> {
    let n = f.value_type(ids)?.dims[0];
    let dims = [n, vocab as i64];
    let ids = bcast(f, ids, &dims, &[0])?;
    let columns = f.iota(TensorType::new(dims, DType::I32), 1)?;
    let hit = f.eq(ids, columns)?;
    Ok(f.convert(hit, DType::F32)?)
}

/// RoPE's `cos` and `sin` `[N, head_dim / 2]` at `positions [N]` (int32).
fn rope_tables(
    f: &mut FuncBuilder<'_>,
    positions: Value,
    head_dim: usize,
    theta: f64,
) -> Result<(Value, Value), CollectiveError> {
    let n = f.value_type(positions)?.dims[0];
    let half = head_dim / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|j| theta.powf(-2.0 * j as f64 / head_dim as f64))
        .collect();
    let inv_freq = HostArray::from_f64(DType::F32, vec![half], &inv_freq)
        .map_err(|e| CollectiveError::local(e.to_string()))?;
    let inv_freq = f.constant(&inv_freq)?;
    let dims = [n, half as i64];
    let pos = f.convert(positions, DType::F32)?;
    let pos = bcast(f, pos, &dims, &[0])?;
    let freq = bcast(f, inv_freq, &dims, &[1])?;
    let angle = f.mul(pos, freq)?;
    Ok((f.cos(angle)?, f.sin(angle)?))
}

/// RoPE on `x [N, heads * head_dim]`: each head's halves `(x1, x2)` become
/// `(x1 cos - x2 sin, x2 cos + x1 sin)`.
fn rope(
    f: &mut FuncBuilder<'_>,
    x: Value,
    heads: usize,
    cos: Value,
    sin: Value,
) -> Result<Value, CollectiveError> {
    let n = f.value_type(x)?.dims[0];
    let width = f.value_type(x)?.dims[1];
    let hd = width / heads as i64;
    let half = hd / 2;
    let h = heads as i64;
    let x = f.reshape(x, &[n, h, hd])?;
    let x1 = f.slice(x, &[0, 0, 0], &[n, h, half])?;
    let x2 = f.slice(x, &[0, 0, half], &[n, h, hd])?;
    let dims = [n, h, half];
    let c = bcast(f, cos, &dims, &[0, 2])?;
    let s = bcast(f, sin, &dims, &[0, 2])?;
    let (x1c, x2s) = (f.mul(x1, c)?, f.mul(x2, s)?);
    let (x2c, x1s) = (f.mul(x2, c)?, f.mul(x1, s)?);
    let y1 = f.sub(x1c, x2s)?;
    let y2 = f.add(x2c, x1s)?;
    let y = f.concatenate(&[y1, y2], 2)?;
    Ok(f.reshape(y, &[n, width])?)
}

/// `[N, heads * hd]` rows to the attention's `[b, heads, s, hd]`.
fn to_heads(
    f: &mut FuncBuilder<'_>,
    x: Value,
    b: i64,
    s: i64,
    heads: usize,
) -> Result<Value, CollectiveError> {
    let width = f.value_type(x)?.dims[1];
    let h = heads as i64;
    let x = f.reshape(x, &[b, s, h, width / h])?;
    Ok(f.transpose(x, &[0, 2, 1, 3])?)
}

/// The attention's `[b, heads, s, hd]` back to `[N, heads * hd]` rows.
fn from_heads(f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, CollectiveError> {
    let d = f.value_type(x)?.dims.clone();
    let x = f.transpose(x, &[0, 2, 1, 3])?;
    Ok(f.reshape(x, &[d[0] * d[2], d[1] * d[3]])?)
}

/// RMSNorm of the rows of `x [N, D]` with scale `g [D]`: `(x r g, r)` where
/// `r = 1 / sqrt(mean(x^2) + eps)` per row.
fn rms_norm(
    f: &mut FuncBuilder<'_>,
    x: Value,
    g: Value,
    eps: f64,
) -> Result<(Value, Value), CollectiveError> {
    let dims = f.value_type(x)?.dims.clone();
    let sq = f.mul(x, x)?;
    let ms = f.reduce(sq, &[1], Reducer::Sum)?;
    let ms = scale(f, ms, 1.0 / dims[1] as f64)?;
    let eps = f.splat(eps, TensorType::new([dims[0]], DType::F32))?;
    let r = f.add(ms, eps)?;
    let r = f.unary(UnaryOp::Rsqrt, r)?;
    let rb = bcast(f, r, &dims, &[0])?;
    let gb = bcast(f, g, &dims, &[1])?;
    let y = f.mul(x, rb)?;
    Ok((f.mul(y, gb)?, r))
}

/// `a * sigmoid(a)`.
fn silu(f: &mut FuncBuilder<'_>, a: Value) -> Result<Value, CollectiveError> {
    let s = f.logistic(a)?;
    Ok(f.mul(a, s)?)
}

/// The logsumexp of the rows of `logits [N, V]`.
fn logsumexp(f: &mut FuncBuilder<'_>, logits: Value) -> Result<Value, CollectiveError> {
    let dims = f.value_type(logits)?.dims.clone();
    let max = f.reduce(logits, &[1], Reducer::Max)?;
    let maxb = bcast(f, max, &dims, &[0])?;
    let z = f.sub(logits, maxb)?;
    let e = f.exp(z)?;
    let sum = f.reduce(e, &[1], Reducer::Sum)?;
    let log_sum = f.log(sum)?;
    Ok(f.add(log_sum, max)?)
}

/// Sum over every device (one all-reduce).
fn all_reduce_sum(
    f: &mut FuncBuilder<'_>,
    x: Value,
    devices: usize,
) -> Result<Value, CollectiveError> {
    let group: Vec<i64> = (0..devices as i64).collect();
    Ok(f.all_reduce(x, Reducer::Sum, &[group], Grouping::FlattenedIds)?)
}

/// Sums the gradients and the loss over every device in one all-reduce of their
/// concatenation; returns the mean loss and the gradients.
fn reduce_gradients(
    f: &mut FuncBuilder<'_>,
    grads: &[Value],
    loss_sum: Value,
    cfg: &TrainConfig,
) -> Result<(Value, Vec<Value>), CollectiveError> {
    let mut flat = Vec::with_capacity(grads.len() + 1);
    let mut sizes = Vec::with_capacity(grads.len());
    for &g in grads {
        let t = f.value_type(g)?.clone();
        let size: i64 = t.dims.iter().product();
        sizes.push((size, t.dims.clone()));
        flat.push(f.reshape(g, &[size])?);
    }
    flat.push(f.reshape(loss_sum, &[1])?);
    let all = f.concatenate(&flat, 0)?;
    let all = all_reduce_sum(f, all, cfg.devices())?;
    let mut out = Vec::with_capacity(grads.len());
    let mut at = 0;
    for (size, dims) in sizes {
        let g = f.slice(all, &[at], &[at + size])?;
        out.push(f.reshape(g, &dims)?);
        at += size;
    }
    let loss = f.slice(all, &[at], &[at + 1])?;
    let loss = f.reshape(loss, &[])?;
    let loss = scale(f, loss, 1.0 / cfg.tokens_per_step() as f64)?;
    Ok((loss, out))
}

/// `sqrt(sum of g^2)` over every gradient.
fn global_norm(f: &mut FuncBuilder<'_>, grads: &[Value]) -> Result<Value, CollectiveError> {
    let mut sq = None;
    for &g in grads {
        let rank = f.value_type(g)?.rank() as i64;
        let g2 = f.mul(g, g)?;
        let s = f.reduce(g2, &(0..rank).collect::<Vec<_>>(), Reducer::Sum)?;
        sq = Some(match sq {
            None => s,
            Some(acc) => f.add(acc, s)?,
        });
    }
    let sq = sq.ok_or_else(|| CollectiveError::local("a model has parameters"))?;
    Ok(f.sqrt(sq)?)
}

/// Global-norm clipping and AdamW. `moments` are `mu` then `nu` (one per parameter), `hyper`
/// is `[lr, 1/(1-b1^t), 1/(1-b2^t)]`. Returns the gradient norm (before clipping) and the new
/// parameters, `mu` and `nu`, in that order.
fn adamw(
    f: &mut FuncBuilder<'_>,
    cfg: &TrainConfig,
    specs: &[crate::model::ParamSpec],
    params: &[Value],
    moments: &[Value],
    grads: &[Value],
    hyper: Value,
) -> Result<(Value, Vec<Value>), CollectiveError> {
    let n = params.len();
    let norm = global_norm(f, grads)?;
    let scalar = |f: &mut FuncBuilder<'_>, i: i64| -> Result<Value, CollectiveError> {
        let x = f.slice(hyper, &[i], &[i + 1])?;
        Ok(f.reshape(x, &[])?)
    };
    let (lr, bc1, bc2) = (scalar(f, 0)?, scalar(f, 1)?, scalar(f, 2)?);
    // Clipping: g * clip / max(norm, clip).
    let clip = cfg.gradient_clipping_threshold;
    let factor = if clip > 0.0 {
        let c = f.scalar(clip, DType::F32)?;
        let denom = f.max(norm, c)?;
        Some(f.div(c, denom)?)
    } else {
        None
    };
    let mut new_params = Vec::with_capacity(n);
    let mut new_mu = Vec::with_capacity(n);
    let mut new_nu = Vec::with_capacity(n);
    for i in 0..n {
        let (p, mu, nu) = (params[i], moments[i], moments[n + i]);
        let t = f.value_type(p)?.clone();
        let dims = t.dims.clone();
        let full = |f: &mut FuncBuilder<'_>, s: Value| -> Result<Value, CollectiveError> {
            Ok(f.broadcast_in_dim(s, &dims, &[])?)
        };
        let mut g = grads[i];
        if let Some(factor) = factor {
            let fb = full(f, factor)?;
            g = f.mul(g, fb)?;
        }
        let mu_decay = scale(f, mu, cfg.adam_b1)?;
        let g1 = scale(f, g, 1.0 - cfg.adam_b1)?;
        let mu1 = f.add(mu_decay, g1)?;
        let nu_decay = scale(f, nu, cfg.adam_b2)?;
        let gg = f.mul(g, g)?;
        let g2 = scale(f, gg, 1.0 - cfg.adam_b2)?;
        let nu1 = f.add(nu_decay, g2)?;
        let bc1b = full(f, bc1)?;
        let bc2b = full(f, bc2)?;
        let mhat = f.mul(mu1, bc1b)?;
        let vhat = f.mul(nu1, bc2b)?;
        let root = f.sqrt(vhat)?;
        let eps = f.splat(cfg.adam_eps, t.clone())?;
        let denom = f.add(root, eps)?;
        let mut update = f.div(mhat, denom)?;
        if specs[i].decay && cfg.weight_decay > 0.0 {
            let wd = scale(f, p, cfg.weight_decay)?;
            update = f.add(update, wd)?;
        }
        let lrb = full(f, lr)?;
        let step = f.mul(update, lrb)?;
        new_params.push(f.sub(p, step)?);
        new_mu.push(mu1);
        new_nu.push(nu1);
    }
    let mut all = new_params;
    all.extend(new_mu);
    all.extend(new_nu);
    Ok((norm, all))
}
