//! tessera-parallel: parallelism strategies built from the typed collectives.
//!
//! [`context`]: context-parallel splash attention, the sequence sharded over the devices of a
//! `context` mesh axis, with MaxText's strategies (`ulysses`, `all_gather`, `ring`), the
//! Ulysses x ring hybrid (`usp`) and causal load balancing, one unit per strategy
//! ([`strategy`]). Each pass is one SPMD StableHLO program built from `tessera-collectives`
//! with the splash kernels of `tessera-splash` inlined (Mosaic custom calls on TPU);
//! [`ContextParallel`] builds, compiles and runs them on the devices of a
//! [`Platform`](tessera_runtime::Platform), its kernels lowered as [`kernel_lowering`] says, and
//! [`AttentionLayer`] puts the same composition inside a model's program.
//!
//! This crate knows no CLI; it uses `tessera-runtime` only to compile and run its programs.
//! Its errors name model and mesh quantities; a command line renders them with its flags
//! through [`Names`].

pub mod context;

pub use context::layer::AttentionLayer;
pub use context::{
    chunk_of, kernel_devices, Block, CollectiveStat, ConfigError, ContextMesh, ContextParallel,
    CpError, CpExecutable, CpForwardBackward, CpInputs, CpProgram, CpStats, LibraryNames,
    ModelMesh, Names, Quantity, RingAxis, Strategy, StrategyName, Term, TermKind, TokenLayout,
};
pub use context::{local_splash, strategy};
pub use tessera_backend::kernel_lowering;
