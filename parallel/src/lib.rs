//! tessera-parallel: parallelism strategies built from the typed collectives.
//!
//! [`context`]: context-parallel splash attention, the sequence sharded over the devices of a
//! `context` mesh axis, with MaxText's strategies (`ulysses`, `all_gather`, `ring`), the
//! Ulysses x ring hybrid (`usp`) and causal load balancing. Each pass is one SPMD StableHLO
//! program built from `tessera-collectives` with the splash kernels of `tessera-splash`
//! inlined; [`ContextParallel`] builds, compiles and runs them on the devices of a
//! [`Platform`](tessera_runtime::Platform), its kernels lowered as [`kernel_target`] says.
//!
//! This crate knows no CLI; it uses `tessera-runtime` only to compile and run its programs.

pub mod context;
mod platform;

pub use context::layer::{AttentionLayer, ModelMesh, TokenLayout};
pub use context::ops;
pub use context::{
    CollectiveStat, ContextMesh, ContextParallel, CpError, CpExecutable, CpForwardBackward,
    CpInputs, CpProgram, CpStats, RingAxis, Strategy, UlyssesAxis, UspMesh,
};
pub use platform::kernel_target;
