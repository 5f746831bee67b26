//! The model and its train step as one SPMD StableHLO program on [`ModelMesh`].
//!
//! Every device holds its block of the batch: `b` sequences of `s` tokens (the batch split
//! over the batch axis `data`, each sequence over `context`), and either all parameters
//! (replicated: data parallelism) or, with fsdp (`ici_fsdp_parallelism`), its shard of each
//! parameter and AdamW moment: every tensor but the norm scales split over the batch axis
//! along one model dim ([`ParamSpec::fsdp_dim`]) and over `context` along the other
//! ([`ParamSpec::context_dim`]; MaxText's `embed` rule, fsdp x context ways; USP's ring axis
//! keeps them replicated). With [`TrainConfig::shard_weights_over_context`] on a batch axis
//! of one device the same layouts split them over `context` alone (the batch axis's split is
//! one way), and with USP the rows go over its ring axis instead (`WeightSplit::Ring`:
//! split over every context device); "with fsdp" below means any of these. The program, per
//! device:
//!
//! 1. **Forward.** The token embedding (a gather of the table's rows), then the decoder layers as one loop
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
//!
//! By job: `params.rs` holds the parameter specs and the layouts of stacked weights,
//! `forward.rs` step 1, `update.rs` steps 3 and 4, `ops.rs` the forward's RoPE, norm and
//! shape helpers; this file builds the program and takes the gradients (step 2).

use tessera_collectives::axes::{Context, Data};
use tessera_collectives::{
    CollectiveError, DTensor, Invariant, LocalValue, Mesh, Program, Replicated, Split, Spmd,
    Unstack,
};
use tessera_hlo::{DType, FuncBuilder, Grouping, HostArray, Reducer, TensorType, UnaryOp, Value};
use tessera_parallel::context::Seq;
use tessera_parallel::{AttentionLayer, ModelMesh, RingAxis, TokenLayout};

use tessera_dsl::Lowering;

use crate::collective_matmul::CollectiveMatmul;
use crate::config::{ModelConfig, RematPolicy, TrainConfig};
use crate::TrainError;

mod forward;
mod ops;
mod params;
mod update;

use forward::*;
use ops::*;
use params::*;
pub use params::{param_specs, Init, ParamSpec};
use update::*;

/// Runs `$body` with `$L` the layout type of a parameter (or moment) of `$spec` split as
/// `$split` ([`WeightSplit`]).
macro_rules! with_param_layout {
    ($spec:expr, $split:expr, |$L:ident| $body:expr) => {{
        let spec: &ParamSpec = $spec;
        let weights: WeightSplit = $split;
        let split = if weights.is_split() {
            spec.fsdp_dim.zip(spec.context_dim)
        } else {
            None
        };
        match (spec.shape.len(), split) {
            (2, Some((0, 1))) if weights == WeightSplit::Ring => {
                type $L = (Split<RingAxis>, Split<Context>);
                $body
            }
            (2, Some((1, 0))) if weights == WeightSplit::Ring => {
                type $L = (Split<Context>, Split<RingAxis>);
                $body
            }
            (3, Some((1, 2))) if weights == WeightSplit::Ring => {
                type $L = RingStackedMatrix;
                $body
            }
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
    /// The forward to the LM head: the logits `[vocab]` of the positions whose target is not
    /// -1, summed (sampling marks one). Text only ([`TrainConfig::segment_ids`]).
    Logits,
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
    let split = WeightSplit::of(cfg);
    let groups = ReduceGroups::new(&mesh, &specs, split);
    let m = cfg.model;
    let mut program = Program::build(
        match kind {
            StepKind::Train => "train_step",
            StepKind::Forward => "forward",
            StepKind::Gradients => "gradients",
            StepKind::Logits => "logits",
        },
        &mesh,
        |p| {
            let params = specs
                .iter()
                .map(|s| param_arg(p, s, split))
                .collect::<Result<Vec<_>, _>>()?;
            let moments = if kind == StepKind::Train {
                let mut mv = Vec::with_capacity(2 * n);
                for s in specs.iter().chain(&specs) {
                    mv.push(param_arg(p, s, split)?);
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
                p.arg::<TokenLayout>(token_dims, DType::I32)?,
                p.arg::<TokenLayout>(token_dims, DType::I32)?,
                p.arg::<TokenLayout>(token_dims, DType::I32)?,
            ];
            // Text's segment ids: whole `[B, S]` rows on each device, in natural order.
            let segments = if cfg.segment_ids {
                let dims = [token_dims[0], cfg.max_target_length as i64];
                Some(
                    p.arg::<(Split<Data>, Replicated)>(dims, DType::I32)?
                        .value(),
                )
            } else {
                None
            };
            let mut model = Model::new(&m, &params, cfg, layer);
            model.segments = segments;
            model.logits = kind == StepKind::Logits;
            // Only the programs with a backward run the last layer after the loop.
            if matches!(kind, StepKind::Forward | StepKind::Logits) {
                model.remat_last_layer = true;
            }
            let loss_sum = model.forward(p, &ids)?;
            if kind == StepKind::Logits {
                let all = p.with_builder(|f| all_reduce_sum(f, loss_sum, devices))?;
                return p
                    .declare::<(Replicated,), Invariant>(all)?
                    .output::<(Replicated,)>();
            }
            let norm = loss_norm(p, &ids[1], cfg, devices)?;
            if kind == StepKind::Forward {
                let loss = p.with_builder(|f| {
                    let all = all_reduce_sum(f, loss_sum, devices)?;
                    norm.apply(f, all)
                })?;
                return scalar_output(p, loss);
            }
            let grads = gradients(p, loss_sum, &params, &specs, cfg, norm)?;
            let (loss, grads) =
                p.with_builder(|f| reduce_gradients(f, &grads, loss_sum, norm, &groups))?;
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
                param_output(p, *v, &specs[i], split)?;
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

/// The argument of a parameter (or a moment) of `spec` (f32) split as `split`: replicated,
/// or along its [`ParamSpec::fsdp_dim`] over the batch (or ring) axis and over `context`
/// along its [`ParamSpec::context_dim`].
fn param_arg(
    p: &Spmd<'_, ModelMesh>,
    spec: &ParamSpec,
    split: WeightSplit,
) -> Result<Value, CollectiveError> {
    let dims: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
    with_param_layout!(spec, split, |L| Ok(p.arg::<L>(dims, DType::F32)?.value()))
}

/// The output of the updated parameter (or moment) `v` of `spec`, laid out as its argument.
fn param_output(
    p: &Spmd<'_, ModelMesh>,
    v: Value,
    spec: &ParamSpec,
    split: WeightSplit,
) -> Result<(), CollectiveError> {
    with_param_layout!(spec, split, |L| p.declare::<L, Invariant>(v)?.output::<L>())
}

/// A parameter as a tensor of its layout, to differentiate with respect to.
fn param_tensor<'p>(
    p: &'p Spmd<'_, ModelMesh>,
    v: Value,
    spec: &ParamSpec,
    split: WeightSplit,
) -> Result<Box<dyn LocalValue<ModelMesh> + 'p>, CollectiveError> {
    with_param_layout!(spec, split, |L| Ok(Box::new(p.declare::<L, Invariant>(v)?)))
}

fn scalar_output(p: &Spmd<'_, ModelMesh>, v: Value) -> Result<(), CollectiveError> {
    p.declare::<(), Invariant>(v)?.output::<()>()
}

/// What turns the loss summed over the step's targets into their mean.
#[derive(Debug, Clone, Copy)]
pub(super) enum LossNorm {
    /// `1 / tokens per step`: every position has a target (synthetic data).
    Tokens(f64),
    /// `1 / (real targets of the step)`, a replicated f32 scalar the program computes from
    /// the targets (text: padding has none).
    Targets(Value),
}

impl LossNorm {
    /// `x` times the norm.
    pub(super) fn apply(self, f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, CollectiveError> {
        match self {
            LossNorm::Tokens(c) => scale(f, x, c),
            LossNorm::Targets(v) => Ok(f.mul(x, v)?),
        }
    }

    /// The norm as an f32 scalar.
    fn value(self, f: &mut FuncBuilder<'_>) -> Result<Value, CollectiveError> {
        match self {
            LossNorm::Tokens(c) => Ok(f.scalar(c, DType::F32)?),
            LossNorm::Targets(v) => Ok(v),
        }
    }
}

/// The step's [`LossNorm`]: with segment ids, one over the targets that are not -1 counted
/// on every device and summed over all of them (at least 1).
fn loss_norm<'p>(
    p: &'p Spmd<'_, ModelMesh>,
    targets: &DTensor<'p, ModelMesh, TokenLayout>,
    cfg: &TrainConfig,
    devices: usize,
) -> Result<LossNorm, CollectiveError> {
    if !cfg.segment_ids {
        return Ok(LossNorm::Tokens(1.0 / cfg.tokens_per_step() as f64));
    }
    let count = targets.map_local_as::<(), Invariant>(|f, t| {
        let mask = target_mask(f, t)?;
        Ok(f.reduce(mask, &[0], Reducer::Sum)?)
    })?;
    let norm = p.with_builder(|f| {
        let all = all_reduce_sum(f, count.value(), devices)?;
        let one = f.scalar(1.0, DType::F32)?;
        let at_least_one = f.max(all, one)?;
        Ok(f.div(one, at_least_one)?)
    })?;
    Ok(LossNorm::Targets(norm))
}

/// The gradient of the step's mean loss with respect to every parameter, from this device's
/// tokens (summed over the devices afterwards): the VJP of the device's summed loss with the
/// cotangent `norm` (one over the step's targets).
fn gradients(
    p: &Spmd<'_, ModelMesh>,
    loss_sum: Value,
    params: &[Value],
    specs: &[ParamSpec],
    cfg: &TrainConfig,
    norm: LossNorm,
) -> Result<Vec<Value>, CollectiveError> {
    let seed = p.with_builder(|f| norm.value(f))?;
    let loss = p.declare::<(), Invariant>(loss_sum)?;
    let seed = p.declare::<(), Invariant>(seed)?;
    let wrt = params
        .iter()
        .zip(specs)
        .map(|(&v, s)| param_tensor(p, v, s, WeightSplit::of(cfg)))
        .collect::<Result<Vec<_>, _>>()?;
    let wrt: Vec<&dyn LocalValue<ModelMesh>> = wrt.iter().map(|t| t.as_ref()).collect();
    p.vjp(&[&loss], &[&seed], &wrt)
}
