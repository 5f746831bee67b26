//! What a run trains and how: the model's dims ([`ModelConfig`], presets `tiny`, `small`,
//! `llama2-7b`, `llama3.1-8b`) and the run's settings ([`TrainConfig`], MaxText's names),
//! checked before anything is compiled with one error per problem naming the settings and
//! the fix ([`SettingError`]; the context-parallel rules are the strategy's own, asked
//! through [`TrainConfig::context_parallel`]).

use std::fmt;

use tessera_dsl::Lowering;
use tessera_hlo::DType;
use tessera_parallel::strategy::Ulysses;
use tessera_parallel::{ContextParallel, Strategy};
use tessera_splash::{default_block, BlockSizes, Dims, Mask, SplashOptions};

use crate::error::{Setting, SettingError, WeightDim};
use crate::TrainError;

/// A Llama-style decoder: token embedding, `layers` x (RMSNorm, GQA attention with RoPE,
/// RMSNorm, SwiGLU MLP, residuals), final RMSNorm, LM head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (GQA: `heads` is a multiple of them).
    pub kv_heads: usize,
    /// Dims per head.
    pub head_dim: usize,
    /// Hidden width of the SwiGLU MLP.
    pub mlp_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub norm_eps: f64,
}

impl ModelConfig {
    /// The default: 0.5 M parameters, trains on 4 CPU devices in about a minute.
    pub fn tiny() -> Self {
        ModelConfig {
            vocab: 256,
            d_model: 128,
            layers: 2,
            heads: 8,
            kv_heads: 4,
            head_dim: 16,
            mlp_dim: 384,
            rope_theta: 10_000.0,
            norm_eps: 1e-6,
        }
    }

    /// 13 M parameters: the size the benchmark reports.
    pub fn small() -> Self {
        ModelConfig {
            vocab: 1024,
            d_model: 512,
            layers: 4,
            heads: 8,
            kv_heads: 4,
            head_dim: 64,
            mlp_dim: 1536,
            rope_theta: 10_000.0,
            norm_eps: 1e-6,
        }
    }

    /// MaxText's `llama2-7b` (MHA: 32 KV heads), as in MaxText's
    /// `src/MaxText/configs/models/llama2-7b.yml`: `base_emb_dim` 4096,
    /// `base_num_query_heads` 32, `base_num_kv_heads` 32, `base_mlp_dim` 11008,
    /// `base_num_decoder_layers` 32, `head_dim` 128, `vocab_size` 32000,
    /// `normalization_layer_epsilon` 1e-5 (RoPE at MaxText's default `rope_max_timescale`
    /// 10000).
    pub fn llama2_7b() -> Self {
        ModelConfig {
            vocab: 32_000,
            d_model: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 32,
            head_dim: 128,
            mlp_dim: 11_008,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
        }
    }

    /// MaxText's `llama3.1-8b` (GQA: 8 KV heads), as in MaxText's
    /// `src/MaxText/configs/models/llama3.1-8b.yml`: `base_emb_dim` 4096,
    /// `base_num_query_heads` 32, `base_num_kv_heads` 8, `base_mlp_dim` 14336,
    /// `base_num_decoder_layers` 32, `head_dim` 128, `vocab_size` 128256,
    /// `rope_max_timescale` 500000, `normalization_layer_epsilon` 1e-5.
    pub fn llama3_1_8b() -> Self {
        ModelConfig {
            vocab: 128_256,
            d_model: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            mlp_dim: 14_336,
            rope_theta: 500_000.0,
            norm_eps: 1e-5,
        }
    }

    /// A preset by name (`tiny`, `small`, `llama2-7b`, `llama3.1-8b`).
    pub fn preset(name: &str) -> Result<Self, TrainError> {
        match name {
            "tiny" => Ok(Self::tiny()),
            "small" => Ok(Self::small()),
            "llama2-7b" => Ok(Self::llama2_7b()),
            "llama3.1-8b" => Ok(Self::llama3_1_8b()),
            _ => Err(SettingError::UnknownModel {
                name: name.to_string(),
            }
            .into()),
        }
    }

    /// The sequence length a preset trains on by default.
    pub fn default_seq(&self) -> usize {
        if self.d_model >= 512 {
            1024
        } else {
            256
        }
    }

    /// The number of parameters.
    pub fn num_params(&self) -> usize {
        crate::model::param_specs(self)
            .iter()
            .map(|p| p.shape.iter().product::<usize>())
            .sum()
    }

    /// Parameters of the matmuls a token goes through (everything but the embedding table,
    /// which is a lookup, and the norms): what `6 N` counts per token.
    pub fn matmul_params(&self) -> usize {
        let (d, hd) = (self.d_model, self.head_dim);
        let attention = d * hd * (2 * self.heads + 2 * self.kv_heads);
        let mlp = 3 * d * self.mlp_dim;
        self.layers * (attention + mlp) + d * self.vocab
    }

    fn check(&self) -> Result<(), SettingError> {
        let dims = [
            (Setting::Vocab, self.vocab),
            (Setting::DModel, self.d_model),
            (Setting::Layers, self.layers),
            (Setting::Heads, self.heads),
            (Setting::KvHeads, self.kv_heads),
            (Setting::HeadDim, self.head_dim),
            (Setting::MlpDim, self.mlp_dim),
        ];
        if let Some(&(setting, _)) = dims.iter().find(|(_, n)| *n == 0) {
            return Err(SettingError::Zero { setting });
        }
        if self.heads % self.kv_heads != 0 {
            return Err(SettingError::GqaHeads {
                heads: self.heads,
                kv_heads: self.kv_heads,
            });
        }
        if self.head_dim % 2 != 0 {
            return Err(SettingError::OddHeadDim {
                head_dim: self.head_dim,
            });
        }
        Ok(())
    }
}

impl fmt::Display for ModelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "vocab {} d_model {} layers {} heads {} kv_heads {} head_dim {} mlp {}",
            self.vocab,
            self.d_model,
            self.layers,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.mlp_dim
        )
    }
}

/// A training run, in MaxText's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// The model.
    pub model: ModelConfig,
    /// Training steps (`steps`); the cosine schedule ends here.
    pub steps: usize,
    /// Tokens per sequence (`max_target_length`).
    pub max_target_length: usize,
    /// Sequences per device (`per_device_batch_size`): the global batch is this times the
    /// devices, split over the batch axis (data or fsdp); each sequence is split over
    /// `context`. It may be fractional, as MaxText's (0.015625: one sequence on 64 chips),
    /// when the context axis covers it: each batch shard gets `per_device_batch_size x
    /// ici_context_parallelism` sequences, which must be a whole number
    /// ([`TrainConfig::sequences_per_shard`]).
    pub per_device_batch_size: f64,
    /// Devices on the context axis (`ici_context_parallelism`).
    pub ici_context_parallelism: usize,
    /// Devices on the batch axis as pure data parallelism (`ici_data_parallelism`):
    /// parameters and optimizer state replicated.
    pub ici_data_parallelism: usize,
    /// Devices on the batch axis as fully sharded data parallelism
    /// (`ici_fsdp_parallelism`): parameters, gradients and AdamW moments split over it and
    /// over the context axis (fsdp x context ways, MaxText's `embed` rule). The mesh has one
    /// batch axis, so at most one of this and `ici_data_parallelism` exceeds 1.
    pub ici_fsdp_parallelism: usize,
    /// `dtype`: the compute dtype of the matmuls, activations and attention (f32 or bf16).
    /// Parameters and AdamW moments stay f32 (each layer's weights are cast before their
    /// all-gather). The residual stream is in this dtype too, as MaxText's activations are
    /// (so the layer loop saves each layer's input in it); norms, softmax and the loss run
    /// in f32.
    pub dtype: DType,
    /// `context_parallel_strategy`.
    pub strategy: Strategy,
    /// `context_parallel_load_balance` (all_gather and ring).
    pub load_balance: bool,
    /// `sa_block_q`, `sa_block_kv`, `sa_block_q_dkv`, `sa_block_kv_dkv`.
    pub sa_block_q: usize,
    pub sa_block_kv: usize,
    pub sa_block_q_dkv: usize,
    pub sa_block_kv_dkv: usize,
    /// `sa_use_fused_bwd_kernel`: splash's backward as one kernel per key block that also
    /// adds each block's dQ into one of 3 partials (MaxText's `dq_reduction_steps=3`, as its
    /// tokamax splash runs it) instead of separate dK/dV and dQ kernels, which compute the
    /// scores and their gradient twice. Off by default (MaxText's default). The fused
    /// Ulysses strategy runs its own backward kernels either way.
    pub sa_use_fused_bwd_kernel: bool,
    /// Peak learning rate (`learning_rate`).
    pub learning_rate: f64,
    /// Linear warmup steps (`warmup_steps_fraction` x steps in MaxText; here a count), at
    /// most `steps` ([`TrainConfig::validate`] refuses a longer one).
    pub warmup_steps: usize,
    /// The learning rate at the end of the cosine, as a fraction of the peak.
    pub final_lr_fraction: f64,
    /// Seed of the initialisation and the data.
    pub seed: u64,
    /// AdamW's `b1`, `b2`, `eps` and decoupled weight decay (on matrices only).
    pub adam_b1: f64,
    pub adam_b2: f64,
    pub adam_eps: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clipping threshold (`gradient_clipping_threshold`; 0: off).
    pub gradient_clipping_threshold: f64,
    /// What the attention kernels are built for: [`Lowering::portable`] (inline StableHLO; the
    /// default) or [`Lowering::tpu`] (Mosaic `tpu_custom_call`s, for a TPU topology). The
    /// [`crate::Trainer`] builds for its platform's devices from it
    /// ([`tessera_parallel::kernel_lowering`]: Mosaic on TPU, inline elsewhere).
    pub lowering: Lowering,
    /// Decoder layers per iteration of the layer loop (1, the default; must divide the
    /// layers). The step computes the same; the loop body holds that many layers, which is
    /// how `tessera compile train` measures what one layer costs in libtpu's cost analysis
    /// (which counts a loop body once).
    pub layers_per_iteration: usize,
    /// With fsdp: each layer's weight matmuls run the all-gather matmul kernel
    /// (`tessera_collective_kernels::all_gather_matmul`: the remote copy of the
    /// next weight shard overlaps the matmul of the current one) instead of an all-gather of
    /// the weight and a dot (`collective_matmul`; off by default). Refused without fsdp.
    pub collective_matmul: bool,
    /// With the batch axis one device (no data or fsdp parallelism): parameters, gradients
    /// and AdamW moments split over the context axis as fsdp splits them over fsdp x context
    /// (each matrix along its [`crate::model::ParamSpec::context_dim`], gathered inside the
    /// layer loop). MaxText's `embed` rule shards over the context axis whatever the fsdp
    /// degree, which is what lets a long sequence over many chips hold a large model; with
    /// fsdp the weights are split over context anyway. With USP the rows go over its ring
    /// axis ([`TrainConfig::weight_rows_over_ring`]), so every context device holds its own
    /// share. Off by default (the train example replicates them); `tessera compile train`
    /// turns it on as MaxText's rule does. With
    /// data parallelism above 1 it is refused ([`TrainConfig::validate`]): the weights
    /// would need a layout replicated over the batch axis and split over context, which the
    /// step does not build.
    pub shard_weights_over_context: bool,
    /// Whether the step takes text's packed rows (off: synthetic data): per-document segment
    /// ids (each query attends to its own document's keys only, through every strategy),
    /// positions from the data, and targets of -1 where a position has none (padding); the
    /// loss is then the mean over the real targets. [`crate::Trainer`] sets it from its data.
    pub segment_ids: bool,
    /// What the layer loop's backward recomputes (MaxText's `remat_policy`): each layer's
    /// whole forward ([`RematPolicy::Full`], the default) or all but its attention.
    pub remat_policy: RematPolicy,
    /// Whether the backward re-runs the last iteration of the layer loop (its last layer,
    /// or its last [`TrainConfig::layers_per_iteration`] layers) as it re-runs every other
    /// one, as MaxText's scanned layers do (on by default). Off: that iteration runs after
    /// the loop, and its backward, the first after the loss's, reads the activations its
    /// forward computed instead of recomputing them (PyTorch's `checkpoint_sequential`
    /// likewise leaves its last segment out): one iteration's forward less per step, for
    /// one iteration's activations held through the loss's forward and backward (which
    /// [`crate::memory::estimate`] already counts beside the logits). The losses are the
    /// same.
    pub remat_last_layer: bool,
}

/// What the backward of the layer loop recomputes of each layer's forward (MaxText's
/// `remat_policy`; its default, `full`, is [`RematPolicy::Full`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RematPolicy {
    /// The layer's whole forward, re-run from its saved input.
    #[default]
    Full,
    /// All but the attention: the forward also saves, per layer, splash's residuals (q, k,
    /// v as the kernel takes them, after the strategy's exchange, its output and logsumexp)
    /// and the attention's output as the output projection takes it, so the backward runs
    /// no projection of q, k or v, no exchange and no attention kernel forward again
    /// ([`tessera_splash::SplashOptions::keep_residuals`]). It costs that much more memory
    /// per layer ([`crate::memory::estimate`] counts it), more where the kernels take the
    /// whole gathered K/V (all-gather) or one call per ring step (ring, USP): every call's
    /// inputs and outputs are kept. The fused Ulysses kernels keep their inputs (this
    /// device's q, k, v rows, before the in-kernel exchange) and outputs.
    SaveAttention,
}

impl RematPolicy {
    /// The policy's name as `--remat-policy` takes it.
    pub fn name(self) -> &'static str {
        match self {
            RematPolicy::Full => "full",
            RematPolicy::SaveAttention => "save_attention",
        }
    }
}

impl TrainConfig {
    /// The defaults for `model`: its preset sequence length, 1 sequence per device, 4
    /// context devices with Ulysses, 1e-3 with 10 warmup steps, seed 0.
    pub fn new(model: ModelConfig) -> Self {
        TrainConfig {
            model,
            steps: 100,
            max_target_length: model.default_seq(),
            per_device_batch_size: 1.0,
            ici_context_parallelism: 4,
            ici_data_parallelism: 1,
            ici_fsdp_parallelism: 1,
            dtype: DType::F32,
            strategy: Ulysses.into(),
            load_balance: false,
            sa_block_q: 128,
            sa_block_kv: 128,
            sa_block_q_dkv: 128,
            sa_block_kv_dkv: 128,
            sa_use_fused_bwd_kernel: false,
            learning_rate: 3e-3,
            warmup_steps: 10,
            final_lr_fraction: 0.1,
            seed: 0,
            adam_b1: 0.9,
            adam_b2: 0.95,
            adam_eps: 1e-8,
            weight_decay: 0.1,
            gradient_clipping_threshold: 1.0,
            lowering: Lowering::portable(),
            layers_per_iteration: 1,
            collective_matmul: false,
            shard_weights_over_context: false,
            segment_ids: false,
            remat_policy: RematPolicy::Full,
            remat_last_layer: true,
        }
    }

    /// Sets the four splash blocks to splash's default ([`default_block`]) along what each
    /// attention call holds: the local queries for the `q` blocks, the local keys for the
    /// `kv` blocks (the lengths the strategy's blocks divide).
    pub fn with_default_blocks(mut self) -> Self {
        let (q, kv) = self.context_parallel().block_lengths();
        self.sa_block_q = default_block(q);
        self.sa_block_q_dkv = default_block(q);
        self.sa_block_kv = default_block(kv);
        self.sa_block_kv_dkv = default_block(kv);
        self
    }

    /// The attention of every layer as a context-parallel configuration: the batch of one
    /// data shard, the context devices, a causal mask, the strategy, the blocks and the
    /// lowering. Its strategy's rules are the step's (validation, local lengths, the mesh).
    pub fn context_parallel(&self) -> ContextParallel {
        let m = &self.model;
        ContextParallel {
            dims: Dims {
                batch: self.sequences_per_shard(),
                heads: m.heads,
                kv_heads: m.kv_heads,
                q_len: self.max_target_length,
                kv_len: self.max_target_length,
                head_dim: m.head_dim,
                head_dim_v: m.head_dim,
            },
            dtype: self.dtype,
            mask: Mask::causal(),
            block_sizes: self.block_sizes(),
            options: SplashOptions {
                keep_residuals: self.remat_policy == RematPolicy::SaveAttention,
                ..Default::default()
            },
            strategy: self.strategy.clone(),
            devices: self.ici_context_parallelism,
            load_balance: self.load_balance,
            lowering: self.lowering.clone(),
        }
    }

    /// Devices on the mesh's batch axis: the data or the fsdp degree (the other is 1).
    pub fn batch_shards(&self) -> usize {
        self.ici_data_parallelism * self.ici_fsdp_parallelism
    }

    /// Whether the batch axis is fsdp (parameters and optimizer state sharded over it).
    pub fn fsdp(&self) -> bool {
        self.ici_fsdp_parallelism > 1
    }

    /// Whether parameters and optimizer state are sharded: over fsdp x context with fsdp,
    /// over context alone with [`TrainConfig::shard_weights_over_context`] on a batch axis of
    /// one device.
    pub fn shards_weights(&self) -> bool {
        self.fsdp() || (self.shard_weights_over_context && self.ici_context_parallelism > 1)
    }

    /// Whether the weights' rows ([`crate::model::ParamSpec::fsdp_dim`]) are split over USP's
    /// ring axis: when they are split over the context axis without fsdp and the strategy
    /// has a ring (the batch axis, which fsdp splits them over, is one device then), so they
    /// are split over every context device. With fsdp the ring axis keeps them replicated.
    pub fn weight_rows_over_ring(&self) -> bool {
        !self.fsdp() && self.shards_weights() && self.weight_ring_shards() > 1
    }

    /// The devices on the mesh's ring axis (USP's ring degree; 1 for the other strategies).
    pub fn weight_ring_shards(&self) -> usize {
        self.context_parallel().mesh_sizes(1)[2]
    }

    /// All devices: batch x context.
    pub fn devices(&self) -> usize {
        self.batch_shards() * self.ici_context_parallelism
    }

    /// Sequences per batch shard (per data or fsdp shard): `per_device_batch_size x
    /// ici_context_parallelism`, rounded to the nearest whole number (which
    /// [`TrainConfig::validate`] requires it to be, `whole_sequences`).
    pub fn sequences_per_shard(&self) -> usize {
        sequences(self.per_device_batch_size, self.ici_context_parallelism)
            .round()
            .max(0.0) as usize
    }

    /// Sequences per step (the global batch): the sequences of every batch shard.
    pub fn global_batch(&self) -> usize {
        self.sequences_per_shard() * self.batch_shards()
    }

    /// Tokens per step.
    pub fn tokens_per_step(&self) -> usize {
        self.global_batch() * self.max_target_length
    }

    /// The splash block sizes of the flags (the backward's dq blocks follow the dkv ones).
    pub fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            block_q: self.sa_block_q,
            block_kv: self.sa_block_kv,
            block_kv_compute: self.sa_block_kv,
            block_q_dkv: self.sa_block_q_dkv,
            block_kv_dkv: self.sa_block_kv_dkv,
            block_kv_dkv_compute: self.sa_block_kv_dkv,
            block_q_dq: self.sa_block_q_dkv,
            block_kv_dq: self.sa_block_kv_dkv,
            block_kv_dq_compute: None,
            block_diagonal: None,
            use_fused_bwd_kernel: self.sa_use_fused_bwd_kernel,
        }
    }

    /// Checks every setting and combination before anything is built: the model's dims,
    /// the run's counts (a warmup no longer than the run), the batch axis, and the attention's context-parallel configuration
    /// by its strategy's rules ([`ContextParallel::check`]).
    pub fn validate(&self) -> Result<(), TrainError> {
        self.model.check()?;
        let counts = [
            (Setting::Steps, self.steps),
            (Setting::ContextParallelism, self.ici_context_parallelism),
            (Setting::DataParallelism, self.ici_data_parallelism),
            (Setting::FsdpParallelism, self.ici_fsdp_parallelism),
        ];
        if let Some(&(setting, _)) = counts.iter().find(|(_, n)| *n == 0) {
            return Err(SettingError::Zero { setting }.into());
        }
        if self.warmup_steps > self.steps {
            return Err(SettingError::WarmupPastRun {
                warmup: self.warmup_steps,
                steps: self.steps,
            }
            .into());
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return Err(SettingError::NotPositive {
                setting: Setting::LearningRate,
                value: self.learning_rate,
            }
            .into());
        }
        whole_sequences(
            self.per_device_batch_size,
            self.ici_context_parallelism,
            self.batch_shards(),
        )?;
        let per = self.layers_per_iteration;
        if per == 0 || self.model.layers % per != 0 {
            return Err(SettingError::LayersPerIteration {
                per,
                layers: self.model.layers,
            }
            .into());
        }
        if !matches!(self.dtype, DType::F32 | DType::BF16) {
            return Err(SettingError::ComputeDtype { dtype: self.dtype }.into());
        }
        self.check_fsdp()?;
        self.context_parallel().check()?;
        Ok(())
    }
}

/// `per_device_batch_size x context` as a number (the sequences of one batch shard).
fn sequences(per_device_batch_size: f64, context: usize) -> f64 {
    per_device_batch_size * context as f64
}

/// The sequences each batch shard trains on: `per_device_batch_size x context`, which must be
/// a positive whole number. A fraction of a sequence per device is fine as long as the
/// context axis (which splits one sequence over its `context` devices, the ring's included)
/// covers it; the batch shards (data or fsdp, `batch_shards` of them) each need whole
/// sequences. A product within `1e-9` of a whole number is that number (MaxText's values are
/// decimal fractions such as `0.015625`).
pub fn whole_sequences(
    per_device_batch_size: f64,
    context: usize,
    batch_shards: usize,
) -> Result<usize, SettingError> {
    if !(per_device_batch_size.is_finite() && per_device_batch_size > 0.0) {
        return Err(SettingError::NotPositive {
            setting: Setting::PerDeviceBatchSize,
            value: per_device_batch_size,
        });
    }
    let per_shard = sequences(per_device_batch_size, context);
    let whole = per_shard.round();
    if whole < 1.0 || (per_shard - whole).abs() > 1e-9 * whole.max(1.0) {
        return Err(SettingError::PartialSequences {
            per_device: per_device_batch_size,
            context,
            batch_shards,
        });
    }
    Ok(whole as usize)
}

impl TrainConfig {
    /// The batch axis is either data or fsdp (the all-gather matmul needs fsdp), and fsdp
    /// splits every model dim it shards
    /// ([`crate::model::ParamSpec::fsdp_dim`] over the batch axis,
    /// [`crate::model::ParamSpec::context_dim`] over the context axis) evenly.
    fn check_fsdp(&self) -> Result<(), SettingError> {
        let (data, fsdp) = (self.ici_data_parallelism, self.ici_fsdp_parallelism);
        if data > 1 && fsdp > 1 {
            return Err(SettingError::BatchAxes { data, fsdp });
        }
        if data > 1 && self.shard_weights_over_context {
            return Err(SettingError::WeightsOverContextWithData { data });
        }
        if fsdp == 1 && self.collective_matmul {
            return Err(SettingError::CollectiveMatmulWithoutFsdp { fsdp });
        }
        if !self.shards_weights() {
            return Ok(());
        }
        let m = &self.model;
        let width = |a, b| WeightDim(a, Some(b));
        let one = |a| WeightDim(a, None);
        let dims = [
            (one(Setting::DModel), m.d_model),
            (
                width(Setting::Heads, Setting::HeadDim),
                m.heads * m.head_dim,
            ),
            (one(Setting::MlpDim), m.mlp_dim),
        ];
        if let Some(&(dim, size)) = dims.iter().find(|(_, n)| n % fsdp != 0) {
            return Err(SettingError::FsdpDim { dim, size, fsdp });
        }
        // Without fsdp, USP's ring axis splits those dims in its place.
        if self.weight_rows_over_ring() {
            let ring = self.weight_ring_shards();
            if let Some(&(dim, size)) = dims.iter().find(|(_, n)| n % ring != 0) {
                return Err(SettingError::RingWeightDim { dim, size, ring });
            }
        }
        // Each matrix's other model dim is split over the context axis
        // ([`crate::model::ParamSpec::context_dim`]).
        let shards = self.weight_context_shards();
        let dims = [
            (one(Setting::Vocab), m.vocab),
            (one(Setting::DModel), m.d_model),
            (
                width(Setting::Heads, Setting::HeadDim),
                m.heads * m.head_dim,
            ),
            (
                width(Setting::KvHeads, Setting::HeadDim),
                m.kv_heads * m.head_dim,
            ),
            (one(Setting::MlpDim), m.mlp_dim),
        ];
        if let Some(&(dim, size)) = dims.iter().find(|(_, n)| n % shards != 0) {
            return Err(SettingError::FsdpContextDim {
                dim,
                size,
                fsdp,
                shards,
                context: self.ici_context_parallelism,
            });
        }
        if self.collective_matmul && self.lowering.is_tpu() {
            // The layers' matrices `[rows, columns]`: each device's rows over fsdp, and the
            // columns, in 128-lane tiles.
            let rows = [
                (one(Setting::DModel), m.d_model),
                (
                    width(Setting::Heads, Setting::HeadDim),
                    m.heads * m.head_dim,
                ),
                (one(Setting::MlpDim), m.mlp_dim),
            ];
            let columns = [
                (
                    width(Setting::Heads, Setting::HeadDim),
                    m.heads * m.head_dim,
                ),
                (
                    width(Setting::KvHeads, Setting::HeadDim),
                    m.kv_heads * m.head_dim,
                ),
                (one(Setting::DModel), m.d_model),
                (one(Setting::MlpDim), m.mlp_dim),
            ];
            let tiles = rows
                .iter()
                .map(|&(dim, size)| (dim, size, fsdp))
                .chain(columns.iter().map(|&(dim, size)| (dim, size, 1)));
            for (dim, size, shards) in tiles {
                if (size / shards) % 128 != 0 {
                    return Err(SettingError::CollectiveMatmulTiles { dim, size, shards });
                }
            }
        }
        Ok(())
    }

    /// Devices on the mesh's `context` axis, over which fsdp also splits the weights: the
    /// context degree, or a strategy's own share of it when it has a ring axis too (USP's
    /// Ulysses degree; the ring axis splits the other dim only without fsdp,
    /// [`TrainConfig::weight_rows_over_ring`]).
    pub fn weight_context_shards(&self) -> usize {
        self.context_parallel().mesh_sizes(1)[1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// USP's ring splits the weights' rows without fsdp: a ring degree that does not divide
    /// a row dim is refused naming it; with the split off, or with fsdp, the ring does not
    /// split them.
    #[test]
    fn a_ring_that_does_not_divide_the_weights_is_refused() {
        let mut cfg = TrainConfig::new(ModelConfig {
            mlp_dim: 390,
            ..ModelConfig::tiny()
        });
        cfg.strategy = Strategy::parse("usp:1x4", 4).unwrap();
        let mut cfg = cfg.with_default_blocks();
        cfg.shard_weights_over_context = true;
        assert!(cfg.weight_rows_over_ring());
        assert_eq!(
            cfg.validate().unwrap_err().to_string(),
            "shard_weights_over_context splits the parameters' mlp_dim dim (390) over USP's \
             ring of 4 devices, which does not divide it; use a ring degree that divides 390, \
             or turn shard_weights_over_context off"
        );
        cfg.shard_weights_over_context = false;
        assert!(!cfg.weight_rows_over_ring());
        cfg.validate().unwrap();
    }

    #[test]
    fn a_warmup_longer_than_the_run_is_refused() {
        let mut cfg = TrainConfig::new(ModelConfig::tiny());
        cfg.steps = 3;
        for warmup in [0, 3] {
            cfg.warmup_steps = warmup;
            cfg.validate().unwrap();
        }
        cfg.warmup_steps = 4;
        assert_eq!(
            cfg.validate().unwrap_err().to_string(),
            "warmup_steps = 4 is longer than the run (steps = 3): the learning rate would never \
             reach its peak, and the cosine after it would have no steps; use warmup_steps 3 or \
             less, or more steps"
        );
    }
}
