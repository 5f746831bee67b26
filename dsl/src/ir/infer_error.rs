//! Why an op is ill-formed: the errors of [`infer`](super::infer), one variant per rule, with
//! the values the sentence names as fields.

use std::fmt;

use super::types::{DType, Literal, MemorySpace, ValueType};

/// An ill-formed op, as [`infer`](super::infer) reports it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InferError {
    #[error("unknown ref #{index}")]
    UnknownRef { index: usize },
    #[error("axis {axis} is out of range for a rank-{grid_rank} grid")]
    GridAxisOutOfRange { axis: usize, grid_rank: usize },
    #[error("literal {value} does not fit {dtype}")]
    LiteralDoesNotFit { value: Literal, dtype: DType },
    #[error(
        "`{name}` lives in {} memory; only VMEM refs can be loaded as blocks{}",
        memory.name(),
        if *memory == MemorySpace::Smem { " (use `.get([..])` for SMEM)" } else { "" }
    )]
    LoadNotVmem { name: String, memory: MemorySpace },
    #[error("`{name}` is an input; inputs are read-only")]
    StoreToInput { name: String },
    #[error("`{name}` lives in {} memory; stores need VMEM", memory.name())]
    StoreNotVmem { name: String, memory: MemorySpace },
    #[error("storing a {value} value into `{name}` of dtype {dtype} (cast it first)")]
    StoreDtype {
        value: DType,
        name: String,
        dtype: DType,
    },
    #[error("storing a value of shape {value:?} into a window of shape {window:?} of `{name}`")]
    StoreShape {
        value: Vec<usize>,
        window: Vec<usize>,
        name: String,
    },
    #[error(
        "`{name}` lives in {} memory; scalar reads need SMEM (load the block instead)",
        memory.name()
    )]
    ScalarLoadNotSmem { name: String, memory: MemorySpace },
    #[error(
        "`{name}` is not SMEM scratch: only `#[scratch(..)] {name}: Smem<T>` takes scalar \
         stores (scalar prefetch tables are read-only)"
    )]
    ScalarStoreNotSmemScratch { name: String },
    #[error(
        "`{name}` holds {dtype} words; storing a {value} (cast it, and store one scalar at a time)"
    )]
    ScalarStoreType {
        name: String,
        dtype: DType,
        value: ValueType,
    },
    #[error("`{name}` has rank {rank} but was indexed with {indices} indices")]
    SmemIndexCount {
        name: String,
        rank: usize,
        indices: usize,
    },
    #[error("{what} must be an i32 scalar, got {got}")]
    NotI32Scalar { what: &'static str, got: ValueType },
    #[error(
        "`{name}` has a rank-{} block {block:?} but the access gives {indices} indices",
        block.len()
    )]
    AccessRank {
        name: String,
        block: Vec<usize>,
        indices: usize,
    },
    #[error("slice {start}..{end} of dim {dim} of `{name}` is outside its block size {block}")]
    StaticSliceOutside {
        start: usize,
        end: usize,
        dim: usize,
        name: String,
        block: usize,
    },
    #[error(
        "dynamic slice of length {len} on dim {dim} of `{name}` exceeds its block size {block}"
    )]
    DynamicSliceTooLong {
        len: usize,
        dim: usize,
        name: String,
        block: usize,
    },
    #[error("{op} is not defined for {dtype}")]
    UndefinedFor { op: &'static str, dtype: DType },
    #[error("operands differ in dtype: {lhs} and {rhs} (cast one of them)")]
    OperandDtypes { lhs: DType, rhs: DType },
    #[error("operands differ in shape: {lhs:?} and {rhs:?}")]
    OperandShapes { lhs: Vec<usize>, rhs: Vec<usize> },
    #[error("the condition must be bool of shape {shape:?}, got {cond}")]
    SelectCondition { shape: Vec<usize>, cond: ValueType },
    #[error("cannot broadcast shape {from:?} to {to:?}")]
    Broadcast { from: Vec<usize>, to: Vec<usize> },
    #[error("cannot reshape {from:?} ({elements} elements) to {to:?}")]
    Reshape {
        from: Vec<usize>,
        elements: usize,
        to: Vec<usize>,
    },
    #[error("repeat axis {axis} is out of range for shape {shape:?}")]
    RepeatAxis { axis: usize, shape: Vec<usize> },
    #[error("repeat of shape {shape:?} needs at least one copy, got 0")]
    RepeatNone { shape: Vec<usize> },
    #[error("iota produces integers, not {dtype}")]
    IotaDtype { dtype: DType },
    #[error("iota dim {dim} is out of range for shape {shape:?}")]
    IotaDim { dim: usize, shape: Vec<usize> },
    #[error("axis {axis} is out of range for shape {shape:?}")]
    ReduceAxis { axis: usize, shape: Vec<usize> },
    #[error("dot takes rank-2 operands, got {lhs} and {rhs}")]
    DotRank { lhs: ValueType, rhs: ValueType },
    #[error("dot operands differ in dtype: {lhs} and {rhs}")]
    DotDtypes { lhs: DType, rhs: DType },
    #[error(
        "contracting dims differ: lhs {lhs}{} has {lhs_k}, rhs {rhs}{} has {rhs_k}",
        transposed(*lhs_transposed),
        transposed(*rhs_transposed)
    )]
    DotContraction {
        lhs: ValueType,
        lhs_transposed: bool,
        lhs_k: usize,
        rhs: ValueType,
        rhs_transposed: bool,
        rhs_k: usize,
    },
    #[error("the condition of `when` must be a bool scalar, got {cond}")]
    WhenCondition { cond: ValueType },
    #[error("a `when` body yields no values")]
    WhenYields,
    #[error("the loop body must take the index and one value per carried value")]
    LoopParams,
    #[error("the loop body yields {yields} values but {carried} are carried")]
    LoopYields { yields: usize, carried: usize },
    #[error("carried value {index} changes type: starts as {start}, the body yields {yields}")]
    CarriedType {
        index: usize,
        start: ValueType,
        yields: ValueType,
    },
    #[error(
        "`{name}` cannot be allocated by `run_scoped`: only VMEM buffers and DMA or regular \
         semaphores can"
    )]
    NotScopedAllocatable { name: String },
    #[error("the format `{format}` has {placeholders} `{{}}` placeholders for {values} values")]
    PrintPlaceholders {
        format: String,
        placeholders: usize,
        values: usize,
    },
    #[error(
        "the format `{format}` has a lone `{brace}`: placeholders are `{{}}` (no names or \
         specs), and `{{{{` / `}}}}` print a brace"
    )]
    PrintLoneBrace { format: String, brace: char },
    #[error("`debug_print!` prints scalars, or one vector whose `{{}}` ends the format")]
    PrintVector,
    #[error("the condition of `debug_check` must be a bool scalar, got {cond}")]
    CheckCondition { cond: ValueType },
    #[error("{what} must be a semaphore, but `{name}` lives in {} memory", memory.name())]
    NotASemaphore {
        what: &'static str,
        name: String,
        memory: MemorySpace,
    },
    #[error("{what} must be {}, but `{name}` is a {}", wanted.describe(), memory.name())]
    SemaphoreKind {
        what: &'static str,
        wanted: WantedSemaphore,
        name: String,
        memory: MemorySpace,
    },
    #[error(
        "`{name}` is an array of semaphores of shape {shape:?}: give one index per dim, got \
         {indices}"
    )]
    SemaphoreIndexCount {
        name: String,
        shape: Vec<usize>,
        indices: usize,
    },
    #[error(
        "`{name}` is {why}; copies move data between HBM operands (`Hbm`, `HbmMut`) and VMEM \
         scratch (`Vmem`)"
    )]
    NotCopyable { name: String, why: NotCopyableWhy },
    #[error(
        "copying {src_dtype} elements of `{src}` into `{dst}` of dtype {dst_dtype}; a copy does \
         not convert"
    )]
    CopyDtypes {
        src_dtype: DType,
        src: String,
        dst: String,
        dst_dtype: DType,
    },
    #[error(
        "the source window {src_window:?} of `{src}` and the destination window {dst_window:?} \
         of `{dst}` differ in shape (unit dims aside)"
    )]
    CopyShapes {
        src_window: Vec<usize>,
        src: String,
        dst_window: Vec<usize>,
        dst: String,
    },
}

/// The semaphore kind a semaphore reference needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WantedSemaphore {
    Dma,
    Regular,
}

impl WantedSemaphore {
    fn describe(self) -> &'static str {
        match self {
            WantedSemaphore::Dma => "a DMA semaphore (copies signal DMA semaphores)",
            WantedSemaphore::Regular => {
                "a regular semaphore (DMA semaphores are signalled by copies only)"
            }
        }
    }
}

/// Why a ref cannot be one side of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCopyableWhy {
    /// An HBM input written by the copy.
    ReadOnlyInput,
    /// A block-spec operand (the pipeline owns its VMEM block).
    PipelinedBlock,
    /// A ref in a memory copies do not reach.
    Memory(MemorySpace),
}

impl fmt::Display for NotCopyableWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotCopyableWhy::ReadOnlyInput => f.write_str("an input, and inputs are read-only"),
            NotCopyableWhy::PipelinedBlock => {
                f.write_str("a pipelined block (a block-spec operand)")
            }
            NotCopyableWhy::Memory(m) => write!(f, "in {} memory", m.name()),
        }
    }
}

/// The marker a transposed dot operand gets in [`InferError::DotContraction`].
fn transposed(yes: bool) -> &'static str {
    if yes {
        " (transposed)"
    } else {
        ""
    }
}
