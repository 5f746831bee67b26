//! Run-time errors: what the types cannot know (sizes, device counts, host data).

use tessera_hlo::HloError;

/// Everything that can go wrong while building, compiling or running an SPMD program, or
/// sharding host data. Nothing in this crate panics on user input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// An invalid mesh (sizes, names), or an axis the mesh does not have.
    #[error("mesh: {reason}")]
    Mesh {
        /// What is wrong.
        reason: String,
    },

    /// A dim split over an axis (or scattered, or split by an `all_to_all`) does not divide
    /// by the axis size.
    #[error(
        "{context}: dim {dim} (size {size}) is split over mesh axis `{axis}` (size {axis_size}), \
         but {size} is not divisible by {axis_size}"
    )]
    NotDivisible {
        /// The op or argument, e.g. ``all_to_all over `context` of tensor<1x6x4x8xf32>``.
        context: String,
        /// The dim.
        dim: usize,
        /// Its size (per device for a collective, global for an argument).
        size: i64,
        /// The mesh axis.
        axis: &'static str,
        /// The axis size.
        axis_size: usize,
    },

    /// A sharding that does not fit the tensor or the mesh (rank, an axis used twice).
    #[error("{context}: invalid sharding {spec}: {reason}")]
    Spec {
        /// Where the sharding was given.
        context: String,
        /// The sharding, as text.
        spec: String,
        /// What is wrong.
        reason: String,
    },

    /// A device count that does not match the mesh.
    #[error("{context}: expected {expected} devices (the mesh), got {actual}")]
    DeviceCount {
        /// What was counted.
        context: String,
        /// The mesh's device count.
        expected: usize,
        /// The count found.
        actual: usize,
    },

    /// An operand or host array of the wrong shape, element type or count.
    #[error("{context}: {reason}")]
    Operand {
        /// Which operand or input.
        context: String,
        /// The mismatch.
        reason: String,
    },

    /// An invalid `ppermute` permutation.
    #[error("ppermute over `{axis}`: {reason}")]
    Permutation {
        /// The mesh axis.
        axis: &'static str,
        /// What is wrong.
        reason: String,
    },

    /// Devices that should hold the same replica of a tensor hold different data.
    #[error(
        "{context}: device {device} and device {reference} should hold the same replica (sharding \
         {spec}), but their data differ"
    )]
    ReplicaMismatch {
        /// Which tensor.
        context: String,
        /// The sharding.
        spec: String,
        /// The device whose data differ.
        device: usize,
        /// The device it was compared with.
        reference: usize,
    },

    /// A tensor op was called while the program's builder was in use (from inside a local
    /// op's closure).
    #[error(
        "{op}: the SPMD program is busy: tensor ops cannot be called inside a local op's closure \
         (use the FuncBuilder it receives)"
    )]
    Busy {
        /// The op that was called.
        op: &'static str,
    },

    /// The error of a local op (a kernel lowering, a user closure).
    #[error("local op: {0}")]
    Local(Box<dyn std::error::Error + Send + Sync>),

    /// The StableHLO builder rejected an op.
    #[error(transparent)]
    Hlo(#[from] HloError),

    /// The PJRT runtime failed (compile, transfer, execute).
    #[error(transparent)]
    Runtime(#[from] tessera_runtime::Error),
}

impl CollectiveError {
    /// Wraps the error of a local op (e.g. a kernel lowering error).
    pub fn local(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        CollectiveError::Local(e.into())
    }

    pub(crate) fn operand(context: impl Into<String>, reason: impl Into<String>) -> Self {
        CollectiveError::Operand {
            context: context.into(),
            reason: reason.into(),
        }
    }
}
