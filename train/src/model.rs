//! The model and its train step as one SPMD StableHLO program on [`ModelMesh`].
//!
//! Every device holds its block of the batch: `b` sequences of `s` tokens (the batch split
//! over the batch axis `data`, each sequence over `context`), and either all parameters
//! (replicated: data parallelism) or, with fsdp (`ici_fsdp_parallelism`), its shard of each
//! parameter and AdamW moment: every tensor but the norm scales split over the batch axis
//! along one model dim ([`ParamSpec::fsdp_dim`]) and over `context` along the other
//! ([`ParamSpec::context_dim`]; MaxText's `embed` rule, fsdp x context ways; USP's ring axis
//! keeps them replicated). The program, per device:
//!
//! 1. **Forward.** One-hot token embedding, then the decoder layers as one loop
//!    ([`Spmd::scan`]) over the layers' stacked weights (`[L, ...]` parameters), whose body is
//!    one layer (with fsdp, the layer's matrices all-gathered over the batch and context axes
//!    first, as are the embedding and LM head before theirs): RMSNorm, the q/k/v projections,
//!    RoPE at the tokens' global positions (an input, so any sequence layout works), the
//!    context-parallel attention
//!    ([`AttentionLayer::forward`]: the strategy's collectives and splash kernels), the output
//!    projection and residual, RMSNorm, SwiGLU MLP and residual; final RMSNorm, LM head,
//!    softmax cross-entropy summed over the device's tokens. With
//!    [`TrainConfig::collective_matmul`] the layer's matrices are gathered over `context` only
//!    and each of its seven weight matmuls is the all-gather matmul kernel over the batch
//!    axis, a custom-VJP unit (`collective_matmul.rs`). The program's size and compile
//!    time do not grow with the number of layers.
//! 2. **Backward.** Reverse-mode autodiff of that forward ([`Spmd::vjp`], `tessera_hlo`'s
//!    VJP rules): through the attention, the splash calls are custom-VJP units running splash's
//!    backward kernels and every collective goes back through its transpose, so each strategy's
//!    backward is the gradient of its forward. The layer loop's backward is a loop too, which
//!    re-runs each layer's forward from its saved input (per-layer rematerialisation). With
//!    fsdp the all-gathers' transposes are reduce-scatters: each device gets its shard of a
//!    gradient, already summed over the batch and context axes.
//! 3. **Reduce.** One all-reduce over all devices sums every replicated parameter's gradient
//!    and the loss (each device contributed its tokens); with fsdp and USP a second one sums
//!    the gradient shards over the ring axis.
//! 4. **Update.** Global-norm clipping (with fsdp, the shards' squares summed over the batch
//!    and context axes) and AdamW, elementwise on what each device holds, so parameters and moments keep
//!    their layout from step to step.

use tessera_collectives::axes::{Context, Data};
use tessera_collectives::{
    CollectiveError, DTensor, Invariant, LocalValue, Mesh, Program, Replicated, Split, Spmd,
    Unstack,
};
use tessera_hlo::{DType, FuncBuilder, Grouping, HostArray, Reducer, TensorType, UnaryOp, Value};
use tessera_parallel::{AttentionLayer, ModelMesh, RingAxis, TokenLayout};

use tessera_dsl::Lowering;

use crate::collective_matmul::CollectiveMatmul;
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
    /// The dim split over the batch axis with fsdp (`--ici-fsdp-parallelism`): a model dim
    /// (`d_model`, `heads x head_dim` or `mlp_dim`), never the layer dim; `None` for the
    /// norm scales, which stay replicated (they are `d_model` floats per layer).
    pub fsdp_dim: Option<usize>,
    /// The dim split over the `context` axis with fsdp (MaxText's `embed` rule shards weights
    /// over fsdp x context): the tensor's other model dim; `None` for the norm scales.
    pub context_dim: Option<usize>,
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
        fsdp_dim: Some(0),
        context_dim: Some(1),
    };
    let norm = |name: String| ParamSpec {
        name,
        shape: vec![d],
        stacked: false,
        init: Init::Ones,
        decay: false,
        fsdp_dim: None,
        context_dim: None,
    };
    // A layer's tensor stacked over the layers: `[L, ...]`.
    let stack = |s: ParamSpec| ParamSpec {
        name: format!("layers.{}", s.name),
        shape: [m.layers].into_iter().chain(s.shape).collect(),
        stacked: true,
        fsdp_dim: s.fsdp_dim.map(|d| d + 1),
        context_dim: s.context_dim.map(|d| d + 1),
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
        fsdp_dim: Some(1),
        context_dim: Some(0),
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
/// A stacked matrix with fsdp: its rows split over the batch axis, its columns over
/// `context`.
type FsdpStackedMatrix = (Replicated, Split<Data>, Split<Context>);

/// How the layer loop reads its stacked matrices: a row (one layer's matrix) made whole.
trait StackedWeights: Unstack<ModelMesh> {
    /// Layer `i`'s whole matrix in `dtype` from its (f32) row of the stack.
    fn whole(
        row: &DTensor<'_, ModelMesh, Self::Row>,
        dtype: DType,
    ) -> Result<Value, CollectiveError>;

    /// Layer `i`'s matrix in `dtype` as the all-gather matmul takes it: this device's rows
    /// (its block over the batch axis), every column. Only fsdp splits the rows.
    fn rows(
        row: &DTensor<'_, ModelMesh, Self::Row>,
        dtype: DType,
    ) -> Result<Value, CollectiveError> {
        Self::whole(row, dtype)
    }
}

impl StackedWeights for StackedMatrix {
    fn whole(
        row: &DTensor<'_, ModelMesh, Self::Row>,
        dtype: DType,
    ) -> Result<Value, CollectiveError> {
        Ok(in_dtype(row, dtype)?.value())
    }
}

/// `row` in `dtype` (itself when it already is).
fn in_dtype<'p, S>(
    row: &DTensor<'p, ModelMesh, S>,
    dtype: DType,
) -> Result<DTensor<'p, ModelMesh, S>, CollectiveError> {
    if row.dtype()? == dtype {
        Ok(row.clone())
    } else {
        row.convert(dtype)
    }
}

/// `x` in `dtype` (itself when it already is).
fn cast(f: &mut FuncBuilder<'_>, x: Value, dtype: DType) -> Result<Value, CollectiveError> {
    if f.value_type(x)?.dtype == dtype {
        Ok(x)
    } else {
        Ok(f.convert(x, dtype)?)
    }
}

impl StackedWeights for FsdpStackedMatrix {
    /// The cast, then the all-gathers over the batch and context axes, whose transposes in
    /// the backward are the reduce-scatters that leave each device its shard of the
    /// gradient.
    fn whole(
        row: &DTensor<'_, ModelMesh, Self::Row>,
        dtype: DType,
    ) -> Result<Value, CollectiveError> {
        Ok(in_dtype(row, dtype)?
            .all_gather::<Data, 0>()?
            .all_gather::<Context, 1>()?
            .value())
    }

    /// The cast, then the all-gather over the context axis only: the rows stay split over
    /// the batch axis, which the all-gather matmul gathers itself.
    fn rows(
        row: &DTensor<'_, ModelMesh, Self::Row>,
        dtype: DType,
    ) -> Result<Value, CollectiveError> {
        Ok(in_dtype(row, dtype)?.all_gather::<Context, 1>()?.value())
    }
}

/// Runs `$body` with `$L` the layout type of a parameter (or moment) of `$spec` on a mesh
/// with (`$fsdp`) or without fsdp.
macro_rules! with_param_layout {
    ($spec:expr, $fsdp:expr, |$L:ident| $body:expr) => {{
        let spec: &ParamSpec = $spec;
        let split = if $fsdp {
            spec.fsdp_dim.zip(spec.context_dim)
        } else {
            None
        };
        match (spec.shape.len(), split) {
            (1, None) => {
                type $L = (Replicated,);
                $body
            }
            (2, None) => {
                type $L = StackedVector;
                $body
            }
            (3, None) => {
                type $L = StackedMatrix;
                $body
            }
            (2, Some((0, 1))) => {
                type $L = (Split<Data>, Split<Context>);
                $body
            }
            (2, Some((1, 0))) => {
                type $L = (Split<Context>, Split<Data>);
                $body
            }
            (3, Some((1, 2))) => {
                type $L = FsdpStackedMatrix;
                $body
            }
            (rank, split) => Err(CollectiveError::local(format!(
                "no layout for {} (rank {rank}, fsdp and context dims {split:?})",
                spec.name
            ))),
        }
    }};
}

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

/// Bytes of training state (parameters, `mu`, `nu`) each device holds in a train step
/// (`StepKind::Train`) of a model with `params` parameter tensors, from the step's argument
/// types: the whole state when replicated, about `1 / (F x C)` of it with fsdp over `F`
/// devices and `C` context devices (the Ulysses degree for USP).
pub fn state_bytes_per_device(program: &Program<ModelMesh>, params: usize) -> usize {
    program.inputs()[..3 * params]
        .iter()
        .map(|t| t.local.dims.iter().product::<i64>() as usize * t.local.dtype.size_bytes())
        .sum()
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
    let groups = ReduceGroups::new(&mesh, &specs, cfg.fsdp());
    let fsdp = cfg.fsdp();
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
                .map(|s| param_arg(p, s, fsdp))
                .collect::<Result<Vec<_>, _>>()?;
            let moments = if kind == StepKind::Train {
                let mut mv = Vec::with_capacity(2 * n);
                for s in specs.iter().chain(&specs) {
                    mv.push(param_arg(p, s, fsdp)?);
                }
                mv
            } else {
                Vec::new()
            };
            let hyper = if kind == StepKind::Train {
                Some(p.arg::<(Replicated,)>([3], DType::F32)?.value())
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
            let grads = gradients(p, loss_sum, &params, &specs, cfg)?;
            let (loss, grads) =
                p.with_builder(|f| reduce_gradients(f, &grads, loss_sum, cfg, &groups))?;
            if kind == StepKind::Gradients {
                // The global norm depends on every gradient, so nothing is pruned, and the
                // program writes no more than the full step does.
                let norm = p.with_builder(|f| global_norm(f, &grads, &groups))?;
                scalar_output(p, loss)?;
                return scalar_output(p, norm);
            }
            let hyper = hyper.expect("a train step has its scalars");
            let (norm, new) = p.with_builder(|f| {
                adamw(f, cfg, &specs, &params, &moments, &grads, hyper, &groups)
            })?;
            for (v, i) in new.iter().zip((0..n).cycle()) {
                param_output(p, *v, &specs[i], fsdp)?;
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

/// The argument of a parameter (or a moment) of `spec` (f32): replicated, or with fsdp
/// split over the batch axis along its [`ParamSpec::fsdp_dim`] and over `context` along its
/// [`ParamSpec::context_dim`].
fn param_arg(
    p: &Spmd<'_, ModelMesh>,
    spec: &ParamSpec,
    fsdp: bool,
) -> Result<Value, CollectiveError> {
    let dims: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
    with_param_layout!(spec, fsdp, |L| Ok(p.arg::<L>(dims, DType::F32)?.value()))
}

/// The output of the updated parameter (or moment) `v` of `spec`, laid out as its argument.
fn param_output(
    p: &Spmd<'_, ModelMesh>,
    v: Value,
    spec: &ParamSpec,
    fsdp: bool,
) -> Result<(), CollectiveError> {
    with_param_layout!(spec, fsdp, |L| p.declare::<L, Invariant>(v)?.output::<L>())
}

/// A parameter as a tensor of its layout, to differentiate with respect to.
fn param_tensor<'p>(
    p: &'p Spmd<'_, ModelMesh>,
    v: Value,
    spec: &ParamSpec,
    fsdp: bool,
) -> Result<Box<dyn LocalValue<ModelMesh> + 'p>, CollectiveError> {
    with_param_layout!(spec, fsdp, |L| Ok(Box::new(p.declare::<L, Invariant>(v)?)))
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
    /// Whether the weights are shards to gather before use.
    fsdp: bool,
    /// The compute dtype of the matmuls and the attention ([`TrainConfig::dtype`]).
    dtype: DType,
    /// [`TrainConfig::layers_per_iteration`].
    layers_per_iteration: usize,
    /// With [`TrainConfig::collective_matmul`], the kernels' lowering: the layers' weight
    /// matmuls run the all-gather matmul.
    collective_matmul: Option<&'a Lowering>,
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
            b: cfg.sequences_per_shard() as i64,
            s: (cfg.max_target_length / cp) as i64,
            fsdp: cfg.fsdp(),
            dtype: cfg.dtype,
            layers_per_iteration: cfg.layers_per_iteration,
            collective_matmul: (cfg.fsdp() && cfg.collective_matmul).then_some(&cfg.lowering),
        }
    }

    /// The cross-entropy summed over this device's tokens (f32 scalar).
    fn forward(&self, p: &Spmd<'_, ModelMesh>, ids: [Value; 3]) -> Result<Value, CollectiveError> {
        let m = self.m;
        let n = self.b * self.s;
        let dtype = self.dtype;
        let (embed, lm_head) = if self.fsdp {
            let embed = p.declare::<(Split<Context>, Split<Data>), Invariant>(self.embed)?;
            let lm_head = p.declare::<(Split<Data>, Split<Context>), Invariant>(self.lm_head)?;
            // Cast before the gathers, so they move `dtype` bytes.
            let (embed, lm_head) = if dtype == DType::F32 {
                (embed, lm_head)
            } else {
                (embed.convert(dtype)?, lm_head.convert(dtype)?)
            };
            (
                embed
                    .all_gather::<Data, 1>()?
                    .all_gather::<Context, 0>()?
                    .value(),
                lm_head
                    .all_gather::<Data, 0>()?
                    .all_gather::<Context, 1>()?
                    .value(),
            )
        } else {
            p.with_builder(|f| Ok((cast(f, self.embed, dtype)?, cast(f, self.lm_head, dtype)?)))?
        };
        let (target_onehot, cos, sin, x) = p.with_builder(|f| {
            let flat = |f: &mut FuncBuilder<'_>, v| f.reshape(v, &[n]);
            let (tokens, targets, positions) =
                (flat(f, ids[0])?, flat(f, ids[1])?, flat(f, ids[2])?);
            let onehot = one_hot(f, tokens, m.vocab)?;
            let target_onehot = one_hot(f, targets, m.vocab)?;
            let (cos, sin) = rope_tables(f, positions, m.head_dim, m.rope_theta)?;
            let (cos, sin) = (cast(f, cos, dtype)?, cast(f, sin, dtype)?);
            let onehot = cast(f, onehot, dtype)?;
            let x = f.matmul(onehot, embed, dtype)?;
            Ok((target_onehot, cos, sin, x))
        })?;
        let x0 = p.declare::<TokenRows, Invariant>(x)?;
        let x = if self.fsdp {
            self.layers::<FsdpStackedMatrix>(p, &x0, cos, sin)?
        } else {
            self.layers::<StackedMatrix>(p, &x0, cos, sin)?
        };
        p.with_builder(|f| {
            let x = cast(f, x, DType::F32)?;
            let (h, _) = rms_norm(f, x, self.final_norm, m.norm_eps)?;
            let h = cast(f, h, dtype)?;
            let logits = f.matmul(h, lm_head, DType::F32)?;
            let lse = logsumexp(f, logits)?;
            let picked = f.mul(logits, target_onehot)?;
            let picked = f.reduce(picked, &[1], Reducer::Sum)?;
            let per_token = f.sub(lse, picked)?;
            Ok(f.reduce(per_token, &[0], Reducer::Sum)?)
        })
    }

    /// The decoder layers on the token rows `x0`: one loop over the stacked weights, whose
    /// matrices are laid out as `W`.
    fn layers<W: StackedWeights>(
        &self,
        p: &Spmd<'_, ModelMesh>,
        x0: &DTensor<'_, ModelMesh, TokenRows>,
        cos: Value,
        sin: Value,
    ) -> Result<Value, CollectiveError> {
        let stacks = &self.layers;
        let vectors = [stacks.attention_norm, stacks.mlp_norm]
            .map(|v| p.declare::<StackedVector, Invariant>(v))
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let matrices = [
            stacks.wq, stacks.wk, stacks.wv, stacks.wo, stacks.w1, stacks.w3, stacks.w2,
        ]
        .map(|v| p.declare::<W, Invariant>(v))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        // With `k` layers per iteration, group `j` holds layers `j, j + k, j + 2k, ...`, so
        // iteration `i` runs layers `i k .. i k + k` in order.
        let k = self.layers_per_iteration;
        let groups = (0..k)
            .map(|j| -> Result<_, CollectiveError> {
                Ok((
                    vectors
                        .iter()
                        .map(|t| every_kth_layer(t, j, k))
                        .collect::<Result<Vec<_>, _>>()?,
                    matrices
                        .iter()
                        .map(|t| every_kth_layer(t, j, k))
                        .collect::<Result<Vec<_>, _>>()?,
                ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let x = p.scan(self.m.layers / k, x0, &groups, |p, _i, mut x, groups| {
            // With the all-gather matmul, each matrix enters its matmul as this device's
            // rows; otherwise whole.
            let collective = self.collective_matmul.map(|l| CollectiveMatmul::new(p, l));
            let matrix = |row: &DTensor<'_, ModelMesh, W::Row>| {
                if collective.is_some() {
                    W::rows(row, self.dtype)
                } else {
                    W::whole(row, self.dtype)
                }
            };
            for (vectors, matrices) in groups {
                let w = LayerParams {
                    attention_norm: vectors[0].value(),
                    mlp_norm: vectors[1].value(),
                    wq: matrix(&matrices[0])?,
                    wk: matrix(&matrices[1])?,
                    wv: matrix(&matrices[2])?,
                    wo: matrix(&matrices[3])?,
                    w1: matrix(&matrices[4])?,
                    w3: matrix(&matrices[5])?,
                    w2: matrix(&matrices[6])?,
                };
                let mm = Matmul {
                    dtype: self.dtype,
                    collective: collective.as_ref(),
                };
                let y = self.layer(p, x.value(), &w, mm, cos, sin)?;
                x = p.declare::<TokenRows, Invariant>(y)?;
            }
            Ok(x)
        })?;
        Ok(x.value())
    }

    /// One decoder layer on the token rows `x` with the weights `w` (one layer's) and their
    /// matmul `mm`, built on `p` (the layer loop's body).
    fn layer(
        &self,
        p: &Spmd<'_, ModelMesh>,
        x: Value,
        w: &LayerParams,
        mm: Matmul<'_>,
        cos: Value,
        sin: Value,
    ) -> Result<Value, CollectiveError> {
        let m = self.m;
        let (q, k, v) = p.with_builder(|f| {
            let x = cast(f, x, DType::F32)?;
            let (h, _) = rms_norm(f, x, w.attention_norm, m.norm_eps)?;
            let h = cast(f, h, self.dtype)?;
            let q = mm.apply(f, h, w.wq)?;
            let k = mm.apply(f, h, w.wk)?;
            let v = mm.apply(f, h, w.wv)?;
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
            let proj = mm.apply(f, out, w.wo)?;
            // The residual stream is in the compute dtype (MaxText's activation dtype), so
            // the layer loop saves each layer's input in it; the norms compute in f32.
            let x1 = f.add(x, proj)?;
            let x1_f32 = cast(f, x1, DType::F32)?;
            let (h2, _) = rms_norm(f, x1_f32, w.mlp_norm, m.norm_eps)?;
            let h2 = cast(f, h2, self.dtype)?;
            let a = mm.apply(f, h2, w.w1)?;
            let c = mm.apply(f, h2, w.w3)?;
            let act = silu(f, a)?;
            let gated = f.mul(act, c)?;
            let down = mm.apply(f, gated, w.w2)?;
            Ok(f.add(x1, down)?)
        })
    }
}

/// How a layer multiplies its activations by a weight matrix: a dot with the whole matrix
/// in the compute dtype, or the all-gather matmul of this device's rows of it.
#[derive(Debug, Clone, Copy)]
struct Matmul<'c> {
    dtype: DType,
    collective: Option<&'c CollectiveMatmul>,
}

impl Matmul<'_> {
    fn apply(&self, f: &mut FuncBuilder<'_>, x: Value, w: Value) -> Result<Value, CollectiveError> {
        match self.collective {
            Some(c) => c.apply(f, x, w),
            None => Ok(f.matmul(x, w, self.dtype)?),
        }
    }
}

/// The gradient of the step's mean loss with respect to every parameter, from this device's
/// tokens (summed over the devices afterwards): the VJP of the device's summed loss with the
/// cotangent `1 / tokens per step`.
fn gradients(
    p: &Spmd<'_, ModelMesh>,
    loss_sum: Value,
    params: &[Value],
    specs: &[ParamSpec],
    cfg: &TrainConfig,
) -> Result<Vec<Value>, CollectiveError> {
    let inv_tokens = 1.0 / cfg.tokens_per_step() as f64;
    let seed = p.with_builder(|f| Ok(f.scalar(inv_tokens, DType::F32)?))?;
    let loss = p.declare::<(), Invariant>(loss_sum)?;
    let seed = p.declare::<(), Invariant>(seed)?;
    let wrt = params
        .iter()
        .zip(specs)
        .map(|(&v, s)| param_tensor(p, v, s, cfg.fsdp()))
        .collect::<Result<Vec<_>, _>>()?;
    let wrt: Vec<&dyn LocalValue<ModelMesh>> = wrt.iter().map(|t| t.as_ref()).collect();
    p.vjp(&[&loss], &[&seed], &wrt)
}

/// Layers `j, j + k, j + 2k, ...` of a stacked `[L, ...]` parameter (the whole stack when
/// `k` is 1), in the same layout (dim 0 is never split).
fn every_kth_layer<'p, S>(
    stack: &DTensor<'p, ModelMesh, S, Invariant>,
    j: usize,
    k: usize,
) -> Result<DTensor<'p, ModelMesh, S, Invariant>, CollectiveError> {
    if k == 1 {
        return Ok(stack.clone());
    }
    stack.map_local(|f, x| {
        let dims = f.value_type(x)?.dims.clone();
        let (k, j) = (k as i64, j as i64);
        let grouped: Vec<i64> = [&[dims[0] / k, k][..], &dims[1..]].concat();
        let x = f.reshape(x, &grouped)?;
        let mut start = vec![0; grouped.len()];
        start[1] = j;
        let mut limit = grouped.clone();
        limit[1] = j + 1;
        let x = f.slice(x, &start, &limit)?;
        let kept: Vec<i64> = [&[dims[0] / k][..], &dims[1..]].concat();
        Ok(f.reshape(x, &kept)?)
    })
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

/// Which gradients are sharded over the batch axis (fsdp), and the device groups their
/// sums run over.
struct ReduceGroups {
    /// Per parameter: whether its gradient is a shard (it came out of the all-gathers'
    /// transposes, reduce-scatters over the batch and context axes, already summed over
    /// them).
    sharded: Vec<bool>,
    /// Every device.
    all: Vec<Vec<i64>>,
    /// Devices with the same batch and context coordinates (the ring axis of USP; one
    /// device each otherwise): where a shard's gradient still needs its sum.
    ring: Vec<Vec<i64>>,
    /// Devices with the same ring coordinate (the batch x context plane): where the
    /// shards' squares add up to the global norm.
    shards: Vec<Vec<i64>>,
}

impl ReduceGroups {
    fn new(mesh: &Mesh<ModelMesh>, specs: &[ParamSpec], fsdp: bool) -> Self {
        let devices = mesh.num_devices() as i64;
        // Row-major device ids: the ring axis is the innermost, so a device's ring
        // coordinate is its id modulo the ring size.
        let ring_size = mesh.axis_size::<RingAxis>() as i64;
        ReduceGroups {
            sharded: specs.iter().map(|s| fsdp && s.fsdp_dim.is_some()).collect(),
            all: vec![(0..devices).collect()],
            ring: mesh.axis::<RingAxis>().groups().to_vec(),
            shards: (0..ring_size)
                .map(|r| (r..devices).step_by(ring_size as usize).collect())
                .collect(),
        }
    }
}

/// Sums `values` over each group of `groups` in one all-reduce of their concatenation
/// (nothing to do for groups of one device).
fn all_reduce_concat(
    f: &mut FuncBuilder<'_>,
    values: &[Value],
    groups: &[Vec<i64>],
) -> Result<Vec<Value>, CollectiveError> {
    if values.is_empty() || groups.iter().all(|g| g.len() == 1) {
        return Ok(values.to_vec());
    }
    let mut flat = Vec::with_capacity(values.len());
    let mut sizes = Vec::with_capacity(values.len());
    for &v in values {
        let t = f.value_type(v)?.clone();
        let size: i64 = t.dims.iter().product();
        sizes.push((size, t.dims.clone()));
        flat.push(f.reshape(v, &[size])?);
    }
    let all = f.concatenate(&flat, 0)?;
    let all = f.all_reduce(all, Reducer::Sum, groups, Grouping::FlattenedIds)?;
    let mut out = Vec::with_capacity(values.len());
    let mut at = 0;
    for (size, dims) in sizes {
        let v = f.slice(all, &[at], &[at + size])?;
        out.push(f.reshape(v, &dims)?);
        at += size;
    }
    Ok(out)
}

/// Sums the gradients and the loss over the devices: replicated gradients and the loss over
/// every device, in one all-reduce; with fsdp the shards (already summed over the batch and
/// context axes by the reduce-scatters) over the ring axis (USP), in another. Returns the mean loss
/// and the gradients.
fn reduce_gradients(
    f: &mut FuncBuilder<'_>,
    grads: &[Value],
    loss_sum: Value,
    cfg: &TrainConfig,
    groups: &ReduceGroups,
) -> Result<(Value, Vec<Value>), CollectiveError> {
    let (mut whole, mut shards) = (Vec::new(), Vec::new());
    for (&g, &sharded) in grads.iter().zip(&groups.sharded) {
        if sharded { &mut shards } else { &mut whole }.push(g);
    }
    whole.push(loss_sum);
    let mut whole = all_reduce_concat(f, &whole, &groups.all)?.into_iter();
    let mut shards = all_reduce_concat(f, &shards, &groups.ring)?.into_iter();
    let mut out = Vec::with_capacity(grads.len());
    for &sharded in &groups.sharded {
        let next = if sharded { shards.next() } else { whole.next() };
        out.push(next.ok_or_else(|| CollectiveError::local("a gradient per parameter"))?);
    }
    let loss = whole
        .next()
        .ok_or_else(|| CollectiveError::local("the loss after the gradients"))?;
    let loss = scale(f, loss, 1.0 / cfg.tokens_per_step() as f64)?;
    Ok((loss, out))
}

/// `sqrt(sum of g^2)` over every gradient: the shards' squares summed over the batch and
/// context axes.
fn global_norm(
    f: &mut FuncBuilder<'_>,
    grads: &[Value],
    groups: &ReduceGroups,
) -> Result<Value, CollectiveError> {
    let mut whole = f.scalar(0.0, DType::F32)?;
    let mut shards = f.scalar(0.0, DType::F32)?;
    for (&g, &sharded) in grads.iter().zip(&groups.sharded) {
        let rank = f.value_type(g)?.rank() as i64;
        let g2 = f.mul(g, g)?;
        let s = f.reduce(g2, &(0..rank).collect::<Vec<_>>(), Reducer::Sum)?;
        let acc = if sharded { &mut shards } else { &mut whole };
        *acc = f.add(*acc, s)?;
    }
    if groups.sharded.iter().any(|&s| s) {
        let summed = all_reduce_concat(f, &[shards], &groups.shards)?;
        whole = f.add(whole, summed[0])?;
    }
    Ok(f.sqrt(whole)?)
}

/// Global-norm clipping and AdamW. `moments` are `mu` then `nu` (one per parameter), `hyper`
/// is `[lr, 1/(1-b1^t), 1/(1-b2^t)]`. Returns the gradient norm (before clipping) and the new
/// parameters, `mu` and `nu`, in that order. Elementwise, so with fsdp it runs on the shards.
#[allow(clippy::too_many_arguments)]
fn adamw(
    f: &mut FuncBuilder<'_>,
    cfg: &TrainConfig,
    specs: &[crate::model::ParamSpec],
    params: &[Value],
    moments: &[Value],
    grads: &[Value],
    hyper: Value,
    groups: &ReduceGroups,
) -> Result<(Value, Vec<Value>), CollectiveError> {
    let n = params.len();
    let norm = global_norm(f, grads, groups)?;
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
