//! tessera-train: a small Llama-style model trained with context-parallel splash attention,
//! the whole step (forward, backward, optimizer) one SPMD program on a `data x context` mesh.
//!
//! * [`ModelConfig`] (presets `tiny`, `small`, `llama2-7b`, `llama3.1-8b`) and
//!   [`TrainConfig`] (MaxText's settings: `steps`, `max_target_length`,
//!   `per_device_batch_size`, `ici_context_parallelism`, `ici_data_parallelism`, `ici_fsdp_parallelism`, `context_parallel_strategy`, `context_parallel_load_balance`,
//!   `sa_block_*`, `learning_rate`, ...), validated before anything is built: the
//!   context-parallel rules by the strategy itself (`tessera-parallel`), the rest here, with
//!   structured errors ([`TrainError`]) that a command line renders with its flags.
//! * [`model`]: the parameters and the train-step program (see its docs for what runs
//!   where).
//! * [`Trainer`]: compiles the step once for the devices of a
//!   [`Platform`](tessera_runtime::Platform), keeps parameters and AdamW moments on them
//!   (each step's outputs are the next step's inputs), feeds its [`Dataset`] ([`SyntheticData`],
//!   or [`TextData`]: packed rows with segment ids), and copies to the host only the loss and
//!   gradient norm of each step; the held-out loss ([`Trainer::eval_loss`]), and checkpoints
//!   ([`checkpoint`], safetensors, with a text run's tokenizer).
//! * [`data`]: the synthetic chain, and text: documents from `.txt`, `.jsonl`/`.json` and
//!   `.parquet` files, a Hugging Face tokenizer or a byte-level BPE trained on them, packing.
//! * [`sample`]: a continuation of a prompt from a model trained on text.
//! * [`flops`]: model FLOPs per step as MaxText counts them, and the machine's measured
//!   matmul peak for MFU.
//! * [`predict`]: a transparent step-time model of the step on a TPU slice (matmul and
//!   splash-block FLOPs, collectives on the torus, overlap rules), pure arithmetic.
//!
//! This crate has no CLI; `examples/train.rs` is the command line over it.

pub mod checkpoint;
mod collective_matmul;
mod config;
pub mod data;
mod error;
pub mod flops;
pub mod memory;
pub mod model;
pub mod predict;
pub mod sample;
mod trainer;

pub use config::{ModelConfig, RematPolicy, TrainConfig};
pub use data::{SyntheticData, TextData};
pub use error::{Setting, SettingError, TrainError, WeightDim};
pub use trainer::{learning_rate, train_step_program, Dataset, StepMetrics, StepTimes, Trainer};
