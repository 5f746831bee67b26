//! The model's parameters: their specs (shape, init, the dims fsdp and context split), the
//! layout types of stacked weights and how the layer loop reads one layer's matrix.

use super::*;

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
pub(super) struct LayerParams {
    pub(super) attention_norm: Value,
    pub(super) wq: Value,
    pub(super) wk: Value,
    pub(super) wv: Value,
    pub(super) wo: Value,
    pub(super) mlp_norm: Value,
    pub(super) w1: Value,
    pub(super) w3: Value,
    pub(super) w2: Value,
}

impl LayerParams {
    /// The layer's parameters in [`param_specs`] order.
    pub(super) fn from_slice(x: &[Value]) -> Self {
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
pub(super) const PER_LAYER: usize = 9;

/// A stacked norm scale `[L, d]`.
pub(super) type StackedVector = (Replicated, Replicated);

/// A stacked matrix `[L, rows, cols]`.
pub(super) type StackedMatrix = (Replicated, Replicated, Replicated);

/// A stacked matrix with fsdp: its rows split over the batch axis, its columns over
/// `context`.
pub(super) type FsdpStackedMatrix = (Replicated, Split<Data>, Split<Context>);

/// A stacked matrix split over every context device of USP: its rows over the ring axis, its
/// columns over `context` (the Ulysses axis).
pub(super) type RingStackedMatrix = (Replicated, Split<RingAxis>, Split<Context>);

/// How the step lays out the parameters and moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WeightSplit {
    /// Every device holds them whole.
    Replicated,
    /// Rows ([`ParamSpec::fsdp_dim`]) over the batch axis, the other model dim over
    /// `context`: fsdp, or [`TrainConfig::shard_weights_over_context`] on a batch axis of one
    /// device.
    Batch,
    /// Rows over USP's ring axis, the other model dim over `context`
    /// ([`TrainConfig::weight_rows_over_ring`]).
    Ring,
}

impl WeightSplit {
    pub(super) fn of(cfg: &TrainConfig) -> Self {
        if cfg.weight_rows_over_ring() {
            WeightSplit::Ring
        } else if cfg.shards_weights() {
            WeightSplit::Batch
        } else {
            WeightSplit::Replicated
        }
    }

    pub(super) fn is_split(self) -> bool {
        self != WeightSplit::Replicated
    }
}

/// How the layer loop reads its stacked matrices: a row (one layer's matrix) made whole.
pub(super) trait StackedWeights: Unstack<ModelMesh> {
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
pub(super) fn in_dtype<'p, S>(
    row: &DTensor<'p, ModelMesh, S>,
    dtype: DType,
) -> Result<DTensor<'p, ModelMesh, S>, CollectiveError> {
    if row.dtype()? == dtype {
        Ok(row.clone())
    } else {
        row.convert(dtype)
    }
}

/// A layer's matrix whole in `dtype` from its shard, rows split over `R`, columns over
/// `context`: the cast, then the all-gathers over both, whose transposes in the backward are
/// the reduce-scatters that leave each device its shard of the gradient.
pub(super) fn gathered<R>(
    row: &DTensor<'_, ModelMesh, (Split<R>, Split<Context>)>,
    dtype: DType,
) -> Result<Value, CollectiveError>
where
    R: tessera_collectives::MeshAxis,
    ModelMesh: tessera_collectives::HasAxis<R>,
{
    Ok(in_dtype(row, dtype)?
        .all_gather::<R, 0>()?
        .all_gather::<Context, 1>()?
        .value())
}

impl StackedWeights for FsdpStackedMatrix {
    /// Gathered over the batch and context axes.
    fn whole(
        row: &DTensor<'_, ModelMesh, Self::Row>,
        dtype: DType,
    ) -> Result<Value, CollectiveError> {
        gathered::<Data>(row, dtype)
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

impl StackedWeights for RingStackedMatrix {
    /// Gathered over the ring and context axes.
    fn whole(
        row: &DTensor<'_, ModelMesh, Self::Row>,
        dtype: DType,
    ) -> Result<Value, CollectiveError> {
        gathered::<RingAxis>(row, dtype)
    }
}

/// Layers `j, j + k, j + 2k, ...` of a stacked `[L, ...]` parameter (the whole stack when
/// `k` is 1), in the same layout (dim 0 is never split).
pub(super) fn every_kth_layer<'p, S>(
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

/// Row `i` (an `i32` scalar: the layer loop's index, or a constant) of a stacked `[L, ...]`
/// parameter of the enclosing program, read on `p` (the loop's body, or the program after
/// the loop): a loop over the first layers of the stack reads them so, without a copy of
/// those layers.
pub(super) fn layer_row_at<'q, S: Unstack<ModelMesh>>(
    p: &'q Spmd<'_, ModelMesh>,
    stack: &DTensor<'_, ModelMesh, S, Invariant>,
    i: Value,
) -> Result<DTensor<'q, ModelMesh, S::Row, Invariant>, CollectiveError> {
    let row = p.with_builder(|f| Ok(f.stacked_row(stack.value(), i)?))?;
    p.declare::<S::Row, Invariant>(row)
}
