//! Why a kernel as a whole could not be run: [`KernelFailure`], carried by
//! [`EvalError::Kernel`](crate::EvalError::Kernel). A module outside the subset, arguments that
//! do not match it, devices that do not meet, or state left wrong when the kernel ends.

use tessera_array::{DType, ShapeError};

/// What went wrong with the kernel, its arguments or its devices (not at one op).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelFailure {
    #[error("expected exactly one function with `tpu.core_type` (the kernel)")]
    NoKernelFunction,
    #[error("the kernel function has no {attr}")]
    MissingAttr { attr: &'static str },
    #[error("{attr}: expected array<i64: ...>")]
    NotAnI64Array { attr: &'static str },
    #[error("{attr}: `{text}` is not a size")]
    NotASize { attr: &'static str, text: String },
    #[error("{attr}: `{text}` is not a count")]
    NotACount { attr: &'static str, text: String },
    #[error(
        "dimension_semantics must list one `#tpu.dimension_semantics<..>` per grid dim ({rank})"
    )]
    DimensionSemanticsCount { rank: usize },
    /// `semantics` is the attribute as parsed (its debug form).
    #[error("dimension semantics {semantics} are not part of the subset (parallel, arbitrary)")]
    DimensionSemantics { semantics: String },
    #[error("a window has no transform_indices")]
    WindowWithoutTransform,
    /// `value` is the entry's attribute as parsed (its debug form).
    #[error("window_params entry `{key}` ({value}) is not part of the subset")]
    WindowEntry { key: String, value: String },
    #[error("window_params holds a non-dictionary")]
    WindowNotADictionary,
    #[error("the kernel must take one i32 per grid dim first")]
    GridArguments,
    #[error(
        "the kernel takes {memrefs} memrefs but scalar_prefetch ({prefetch}), window_params \
         ({windows}) and scratch_operands ({scratch}) account for {}",
        prefetch + windows + scratch
    )]
    MemrefCount {
        memrefs: usize,
        prefetch: usize,
        windows: usize,
        scratch: usize,
    },
    #[error("{args} arguments but {prefetch} scalar-prefetch tables")]
    ArgumentCount { args: usize, prefetch: usize },
    #[error("{inputs} inputs and {outputs} outputs but {windows} window_params")]
    WindowCount {
        inputs: usize,
        outputs: usize,
        windows: usize,
    },
    #[error("kernel argument {name} is not a memref")]
    NotAMemref { name: String },
    /// `ty` is the memref type as parsed (its debug form).
    #[error("scalar prefetch {name}: {ty} does not match the argument {elem}{shape:?}")]
    PrefetchMismatch {
        name: String,
        ty: String,
        elem: &'static str,
        shape: Vec<usize>,
    },
    /// `ty` is the memref type as parsed (its debug form).
    #[error("{name}: {ty} is not its whole array {shape:?} ({elem}) in HBM (`any`)")]
    NotTheWholeArray {
        name: String,
        ty: String,
        shape: Vec<usize>,
        elem: &'static str,
    },
    #[error("{name} is not in VMEM")]
    NotInVmem { name: String },
    #[error("{name}: block {block:?} ({elem}) does not tile its array {array:?} ({array_elem})")]
    BlockDoesNotTile {
        name: String,
        block: Vec<usize>,
        elem: &'static str,
        array: Vec<usize>,
        array_elem: &'static str,
    },
    #[error("@{transform} returns {returned} indices for a rank-{rank} block")]
    IndexMapArity {
        transform: String,
        returned: usize,
        rank: usize,
    },
    #[error("@{transform} returns a non-integer")]
    IndexMapNonInteger { transform: String },
    #[error("@{transform} returns a memref")]
    IndexMapMemref { transform: String },
    #[error(
        "@{transform} gives block index {index} for dim {dim} (of {blocks} blocks) at grid step \
         {step:?}"
    )]
    BlockIndexOutOfRange {
        transform: String,
        index: i64,
        dim: usize,
        blocks: usize,
        step: Vec<usize>,
    },
    /// `shown` lists the first few unvisited block indices.
    #[error(
        "output {output}: {missing} of its {total} blocks are never visited by the grid, so they \
         end as garbage (NaN): blocks {}{}; visit every block, or alias the output to an input \
         (`output_operand_aliases`) whose values they should keep",
        shown.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(", "),
        if *missing > shown.len() { ", ..." } else { "" }
    )]
    UnvisitedBlocks {
        output: usize,
        missing: usize,
        total: usize,
        shown: Vec<Vec<usize>>,
    },
    /// `device` is the device's id in a run on several devices.
    #[error(
        "semaphore {name}{} is not zero when the kernel ends (counts {counts:?}): a copy not \
         waited or a signal not waited",
        device.map(|d| format!(" on device {d}")).unwrap_or_default()
    )]
    SemaphoreNotZero {
        name: String,
        device: Option<usize>,
        counts: Vec<i64>,
    },
    #[error("an output buffer does not hold {dtype}")]
    OutputDtype { dtype: DType },
    #[error(transparent)]
    OutputShape(#[from] ShapeError),
    #[error("a device's thread panicked")]
    DeviceThreadPanicked,
    #[error("device {device} finished before {} reached it", undelivered.join(" and "))]
    Undelivered {
        device: usize,
        undelivered: Vec<String>,
    },
    #[error("stopped: another device failed")]
    StoppedByAnotherDevice,
    #[error("deadlock: no device can progress; blocked: {}", blocked.join("; "))]
    Deadlock { blocked: Vec<String> },
}
