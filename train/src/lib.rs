//! tessera-train: a small Llama-style model trained with context-parallel splash attention,
//! the whole step (forward, backward, optimizer) one SPMD program on a `data x context` mesh.
//!
//! * [`ModelConfig`] (presets `tiny`, `small`, `llama2-7b`, `llama3.1-8b`) and
//!   [`TrainConfig`] (MaxText's settings: `steps`, `max_target_length`,
//!   `per_device_batch_size`, `ici_context_parallelism`, `ici_data_parallelism`, `ici_fsdp_parallelism`, `context_parallel_strategy`, `context_parallel_load_balance`,
//!   `sa_block_*`, `learning_rate`, ...), validated before anything is built.
//! * [`model`]: the parameters and the train-step program (see its docs for what runs
//!   where).
//! * [`Trainer`]: compiles the step once for the devices of a
//!   [`Platform`](tessera_runtime::Platform), keeps parameters and AdamW moments on them
//!   (each step's outputs are the next step's inputs), feeds [`SyntheticData`], and copies to
//!   the host only the loss and gradient norm of each step, and checkpoints
//!   ([`checkpoint`], safetensors).
//! * [`flops`]: model FLOPs per step as MaxText counts them, and the machine's measured
//!   matmul peak for MFU.
//! * [`predict`]: a transparent step-time model of the step on a TPU slice (matmul and
//!   splash-block FLOPs, collectives on the torus, overlap rules), pure arithmetic.
//!
//! This crate has no CLI; `examples/train.rs` is the command line over it.

pub mod checkpoint;
mod config;
pub mod data;
pub mod flops;
pub mod model;
pub mod predict;
mod trainer;

pub use config::{maxtext_name, ModelConfig, TrainConfig};
pub use data::SyntheticData;
pub use trainer::{learning_rate, train_step_program, StepMetrics, StepTimes, Trainer};

/// Why training could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting or a combination of settings that cannot run; the message names the flags
    /// and the fix.
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    ContextParallel(#[from] tessera_parallel::CpError),
    #[error(transparent)]
    Collective(#[from] tessera_collectives::CollectiveError),
    /// (The message includes the cause.)
    #[error("XLA runtime: {0}")]
    Runtime(tessera_runtime::Error),
    /// The platform's devices could not be had (none on this machine, too few, ...).
    #[error(transparent)]
    Devices(tessera_runtime::Error),
    /// A checkpoint that cannot be written or read, or does not fit this run.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: String, reason: String },
}

impl From<tessera_runtime::Error> for TrainError {
    fn from(e: tessera_runtime::Error) -> Self {
        TrainError::Runtime(e)
    }
}
