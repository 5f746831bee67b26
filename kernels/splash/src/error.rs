//! Errors: each names the culprit and how to fix it.

use std::fmt;

use tessera_dsl::{DType, KernelError};

use crate::attention::{Dims, Tensor, DEFAULT_MASK_VALUE};
use crate::block_sizes::NUM_LANES;
use crate::mask::MAX_POSITION;

/// A boxed error from another layer (a backend, an array constructor).
pub type BoxedError = Box<dyn std::error::Error + Send + Sync>;

/// Why a splash attention could not be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum SplashError {
    /// A block size that does not fit the sequence, its compute block or the TPU tiling.
    #[error("block sizes: {0}")]
    BlockSizes(BlockSizeError),
    /// Inputs of the wrong rank, shape, dtype or values.
    #[error("inputs: {0}")]
    Shape(InputError),
    /// A mask that cannot be used (bad parameters, wrong extent, wrong head count).
    #[error("mask: {0}")]
    Mask(MaskError),
    /// An option out of range (scale, soft cap, mask value).
    #[error("options: {0}")]
    Options(OptionsError),
    /// A kernel failed to instantiate or run.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Building a StableHLO program around the kernels failed. (The message includes the
    /// cause, so it is not also a `source`: a chain printer would repeat it.)
    #[error("program: {0}")]
    Program(tessera_hlo::HloError),
    /// The backend that ran a kernel failed; its error is the source.
    #[error("backend: {0}")]
    Backend(#[source] BoxedError),
    /// A splash plan broke its own invariant: a tessera bug, not a user error.
    #[error("internal error (a tessera bug, please report): {0}")]
    Internal(PlanBug),
}

impl From<tessera_hlo::HloError> for SplashError {
    fn from(e: tessera_hlo::HloError) -> Self {
        SplashError::Program(e)
    }
}

/// Block sizes that do not fit the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockSizeError {
    /// Every block with a problem; blocks of equal size with the same problem share one.
    #[error("{}", join_problems(problems))]
    Blocks { problems: Vec<BlockProblem> },
    /// The mask's blocks do not tile the attention.
    #[error("mask blocks {block_q}x{block_kv} do not tile the {q_len}x{kv_len} attention")]
    MaskBlocks {
        block_q: usize,
        block_kv: usize,
        q_len: usize,
        kv_len: usize,
    },
}

/// Blocks (by parameter name) that share one problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockProblem {
    pub blocks: Vec<&'static str>,
    pub reason: BlockSizeReason,
}

fn join_problems(problems: &[BlockProblem]) -> String {
    let text: Vec<String> = problems
        .iter()
        .map(|p| format!("{} {}", p.blocks.join(", "), p.reason))
        .collect();
    text.join("; ")
}

/// Why one block size is refused (printed after the block's name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockSizeReason {
    #[error("= 0; block sizes must be positive")]
    Zero,
    /// `block` does not divide `extent` (`len`); `suggestion` is the nearest divisor.
    #[error(
        "= {block}, which does not divide {extent} ({len}); use a divisor of {len} such as \
         {suggestion}"
    )]
    NotADivisor {
        block: usize,
        extent: &'static str,
        len: usize,
        suggestion: usize,
    },
    /// `block` is neither a multiple of the TPU lane count nor the whole extent `len`.
    #[error(
        "= {block}, which is neither a multiple of {} (lane tiling of {lanes} on TPU) nor \
         {len}; use {suggestion} (or KernelRules::portable() for non-TPU backends)",
        NUM_LANES
    )]
    NotTiled {
        block: usize,
        lanes: &'static str,
        len: usize,
        suggestion: usize,
    },
    /// A diagonal sub-tile asked of blocks that are not square.
    #[error(
        "= {block}, but diagonal sub-tiles need square blocks (block_q = {block_q}, \
         block_kv = {block_kv}); leave block_diagonal unset or make the blocks equal"
    )]
    NotSquare {
        block: usize,
        block_q: usize,
        block_kv: usize,
    },
}

/// Inputs of the wrong rank, shape, dtype or values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputError {
    #[error("{name} must be {layout}, got shape {shape:?}")]
    Rank {
        name: &'static str,
        layout: &'static str,
        shape: Vec<usize>,
    },
    #[error("empty arrays: q {q:?}, k {k:?}, v {v:?}; every dim must be positive")]
    Empty {
        q: Vec<usize>,
        k: Vec<usize>,
        v: Vec<usize>,
    },
    #[error("batch sizes differ: q {q:?}, k {k:?}, v {v:?}; dim 0 must agree")]
    BatchSizes {
        q: Vec<usize>,
        k: Vec<usize>,
        v: Vec<usize>,
    },
    #[error("k {k:?} and v {v:?} must agree in batch, heads and sequence length")]
    KeyValueShapes { k: Vec<usize>, v: Vec<usize> },
    #[error("q head dim {} differs from k head dim {} (shapes {q:?} and {k:?})", q[3], k[3])]
    HeadDims { q: Vec<usize>, k: Vec<usize> },
    #[error(
        "{heads} query heads are not divisible by {kv_heads} key/value heads; query head h uses \
         kv head h / (H / KVH), so KVH must divide H"
    )]
    KvHeadsOfShapes { heads: usize, kv_heads: usize },
    #[error("{heads} query heads are not divisible by {kv_heads} key/value heads")]
    KvHeads { heads: usize, kv_heads: usize },
    #[error("every dim must be positive, got {dims:?}")]
    NonPositiveDims { dims: Dims },
    #[error("q, k and v are {dtype}; splash attention takes f32 or bf16")]
    UnsupportedDtype { dtype: DType },
    #[error("the inputs have dims {found:?} but the attention was configured for {configured:?}")]
    Dims { found: Dims, configured: Dims },
    #[error("{name} is {found} but the attention was configured for {configured}")]
    Dtype {
        name: &'static str,
        found: DType,
        configured: DType,
    },
    #[error("{name} segment ids must be i32{want:?}, got {dtype}{shape:?}")]
    SegmentIds {
        name: &'static str,
        want: Vec<usize>,
        dtype: DType,
        shape: Vec<usize>,
    },
    #[error("sinks must be f32[{heads}] (one per query head), got {dtype}{shape:?}")]
    Sinks {
        heads: usize,
        dtype: DType,
        shape: Vec<usize>,
    },
    #[error("{name} must be {want_dtype}{want:?} like the output, got {dtype}{shape:?}")]
    OutputLike {
        name: String,
        want_dtype: DType,
        want: Vec<usize>,
        dtype: DType,
        shape: Vec<usize>,
    },
    #[error("lse must be f32{want:?}, got {dtype}{shape:?}")]
    Lse {
        want: Vec<usize>,
        dtype: DType,
        shape: Vec<usize>,
    },
    #[error("lse holds {value} at flat index {index}; a logsumexp is finite or -inf")]
    LseValue { value: f64, index: usize },
    #[error(
        "{name} holds a non-finite value ({value}) at flat index {index}; attention inputs must \
         be finite"
    )]
    NonFinite {
        name: String,
        value: f64,
        index: usize,
    },
}

/// A mask that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    #[error("a dense mask of {q_len}x{kv_len} needs {} booleans, got {got}", q_len * kv_len)]
    DenseSize {
        q_len: usize,
        kv_len: usize,
        got: usize,
    },
    #[error(
        "bad mask `{spec}`: {why}; expected full, causal, causal:OFFSET, local:LEFT:RIGHT or \
         chunked:SIZE"
    )]
    Parse { spec: String, why: MaskParseError },
    #[error("chunked causal mask with chunk size 0; use a positive chunk size")]
    ZeroChunk,
    #[error(
        "the dense mask is {q_len}x{kv_len} but the attention reads query positions up to \
         {q_end} and key positions up to {kv_end}; give a mask covering the whole (offset) \
         sequence"
    )]
    DenseExtent {
        q_len: usize,
        kv_len: usize,
        q_end: i64,
        kv_end: i64,
    },
    #[error("{masks} per-head masks for {heads} query heads; give one mask per query head")]
    PerHeadCount { masks: usize, heads: usize },
    #[error("an empty list of per-head masks")]
    NoPerHeadMasks,
    #[error(
        "positions reach {reach} but must stay below {} (2^29) so that mask arithmetic fits in \
         i32; shorten the sequence or the offsets",
        MAX_POSITION
    )]
    PositionsTooLarge { reach: usize },
    #[error("the dense baseline takes computable masks only (no dense masks)")]
    DenseInBaseline,
}

/// Why the CLI form of a mask does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskParseError {
    #[error("{what} `{text}` is not an integer")]
    NotAnInteger { what: &'static str, text: String },
    #[error("{what} `{text}` is not a non-negative integer")]
    NotACount { what: &'static str, text: String },
    #[error("the chunk size must be positive")]
    ZeroChunk,
    #[error("unknown form")]
    UnknownForm,
}

/// An option out of range, or one a path does not take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptionsError {
    #[error("a sharded splash attention needs at least one shard")]
    NoShards,
    #[error("scale {scale} is not finite; give a finite scale")]
    Scale { scale: f32 },
    #[error("soft cap {cap} must be positive and finite")]
    SoftCap { cap: f32 },
    #[error(
        "mask value {value} must be finite (it is the floor of the running max; masked entries \
         are excluded regardless); the default is {:e}",
        DEFAULT_MASK_VALUE
    )]
    MaskValue { value: f32 },
    #[error("splash programs take no attention sinks; leave them out")]
    SinksInProgram,
    #[error("the dense baseline computes the forward, or forward and backward together")]
    DenseBaselineDirection,
}

/// A splash plan that broke its own invariant (the planner's bug, not the caller's).
#[derive(Debug, thiserror::Error)]
pub enum PlanBug {
    #[error(
        "kernel `{kernel}` differs between shards; sharded splash needs one kernel for every \
         shard"
    )]
    KernelDiffersBetweenShards { kernel: String },
    #[error("argument {argument} of kernel `{kernel}` has different shapes between shards")]
    ArgumentDiffersBetweenShards { argument: usize, kernel: String },
    #[error("kernel `{kernel}` needs {tensor:?}, which no earlier stage produced")]
    NotYetProduced { kernel: String, tensor: Tensor },
    #[error(
        "kernel `{kernel}` has per-shard tables: it runs inside an SPMD program, lowered with \
         its shard index, not on one device"
    )]
    PerShardOnOneDevice { kernel: String },
    #[error("kernel `{kernel}` returned {returned} arrays, expected {expected}")]
    OutputCount {
        kernel: String,
        returned: usize,
        expected: usize,
    },
    #[error("{}", Missing(*tensor, *place))]
    Missing { tensor: Tensor, place: MissingIn },
    #[error("stage `{kernel}` has per-shard tables but no shard index")]
    NoShardIndex { kernel: String },
    #[error("the backward plan must start with the preprocessing stage computing Di")]
    BackwardWithoutDi,
    #[error("per-shard tables: {source}")]
    PerShardTables {
        #[source]
        source: BoxedError,
    },
}

/// Where a plan looked for a tensor it did not find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingIn {
    /// After running every stage of a plan.
    Stages,
    /// In the environment the splash forward program starts from.
    ForwardEnvironment,
    /// Among the forward plan's results.
    ForwardResults,
    /// Among the backward plan's results.
    BackwardResults,
}

/// The sentence for [`PlanBug::Missing`].
struct Missing(Tensor, MissingIn);

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Missing(t, place) = self;
        match place {
            MissingIn::Stages => write!(f, "no stage produced {t:?}"),
            MissingIn::ForwardEnvironment => {
                write!(f, "the splash forward needs {t:?} in its environment")
            }
            MissingIn::ForwardResults => write!(f, "the splash forward plan produced no {t:?}"),
            MissingIn::BackwardResults => write!(f, "the backward plan produced no {t:?}"),
        }
    }
}
