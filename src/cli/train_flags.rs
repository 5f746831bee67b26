//! The flags that shape a train step (sequence, batch, mesh, context-parallel strategy,
//! splash blocks), MaxText's names, shared by `tessera compile train` and
//! `examples/train.rs` (which includes this file by path).

use clap::Args;
use tessera::dsl::DType;
use tessera::parallel::Strategy;
use tessera_train::{ModelConfig, TrainConfig};

/// Sequence, batch, mesh (data or fsdp x context), strategy and splash blocks of a train
/// step.
#[derive(Args, Debug, Clone)]
pub struct StepFlags {
    /// Tokens per sequence (default: the preset's, 256 for tiny).
    #[arg(long)]
    pub max_target_length: Option<usize>,
    /// Sequences per device; the global batch is this times the devices.
    #[arg(long, default_value_t = 1)]
    pub per_device_batch_size: usize,
    /// Devices on the context axis (each sequence is split over them).
    #[arg(long, default_value_t = 4)]
    pub ici_context_parallelism: usize,
    /// Devices on the batch axis as data parallelism (the batch is split over them,
    /// parameters and optimizer state replicated). At most one of this and
    /// --ici-fsdp-parallelism exceeds 1: the mesh has one batch axis.
    #[arg(long, default_value_t = 1)]
    pub ici_data_parallelism: usize,
    /// Devices on the batch axis as fully sharded data parallelism (the batch is split over
    /// them, and so are parameters, gradients and AdamW moments: each layer's weights are
    /// all-gathered before use).
    #[arg(long, default_value_t = 1)]
    pub ici_fsdp_parallelism: usize,
    /// ulysses, all_gather, ring, or usp[:UxR] (Ulysses degree x ring degree).
    #[arg(long, default_value = "ulysses")]
    pub context_parallel_strategy: String,
    /// Causal load balancing (zigzag) for all_gather and ring.
    #[arg(long)]
    pub context_parallel_load_balance: bool,
    /// Splash block sizes (default: the largest power of two up to 512 dividing what each
    /// attention call holds).
    #[arg(long)]
    pub sa_block_q: Option<usize>,
    #[arg(long)]
    pub sa_block_kv: Option<usize>,
    #[arg(long)]
    pub sa_block_q_dkv: Option<usize>,
    #[arg(long)]
    pub sa_block_kv_dkv: Option<usize>,
    /// Compute dtype (MaxText's `dtype`): f32, or bf16 for the matmuls, activations, weight
    /// gathers and attention (parameters and AdamW moments stay f32; norms, softmax and the
    /// loss in f32).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

impl StepFlags {
    /// `model` trained as these flags say (the other settings at their defaults), not yet
    /// validated.
    pub fn config(&self, model: ModelConfig) -> Result<TrainConfig, String> {
        let cp = self.ici_context_parallelism;
        let strategy = Strategy::parse(&self.context_parallel_strategy, cp).map_err(|_| {
            format!(
                "--context-parallel-strategy {} is not a strategy; use ulysses, all_gather, \
                 ring, usp or usp:UxR",
                self.context_parallel_strategy
            )
        })?;
        let dtype = DType::compute_from_name(&self.dtype).ok_or_else(|| {
            format!(
                "--dtype {} is not a compute dtype of the train step; use f32 or bf16",
                self.dtype
            )
        })?;
        let mut cfg = TrainConfig::new(model);
        cfg.dtype = dtype;
        cfg.max_target_length = self.max_target_length.unwrap_or(model.default_seq());
        cfg.per_device_batch_size = self.per_device_batch_size;
        cfg.ici_context_parallelism = cp;
        cfg.ici_data_parallelism = self.ici_data_parallelism;
        cfg.ici_fsdp_parallelism = self.ici_fsdp_parallelism;
        cfg.strategy = strategy;
        cfg.load_balance = self.context_parallel_load_balance;
        let mut cfg = cfg.with_default_blocks();
        let blocks = [
            (&mut cfg.sa_block_q, self.sa_block_q),
            (&mut cfg.sa_block_kv, self.sa_block_kv),
            (&mut cfg.sa_block_q_dkv, self.sa_block_q_dkv),
            (&mut cfg.sa_block_kv_dkv, self.sa_block_kv_dkv),
        ];
        for (block, flag) in blocks {
            if let Some(b) = flag {
                *block = b;
            }
        }
        Ok(cfg)
    }
}
