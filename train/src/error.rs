//! Why training could not start or go on.
//!
//! A [`SettingError`] carries the settings at fault as fields and is written in the library's
//! words (`the fsdp degree 3`, `d_model = 32`, `block_q = 16`); a command line renders it
//! with its flags through [`Names`] ([`TrainError::describe`]): MaxText's
//! `--ici-fsdp-parallelism 3`, `--d-model 32`, `--sa-block-q 16`. The context-parallel
//! strategy's rules are `tessera-parallel`'s, with its errors.

use std::fmt;

use tessera_hlo::DType;
use tessera_parallel::{CpError, Names, Quantity, Strategy, Term, TermKind};
use tessera_splash::SplashError;

/// A setting of a run or a dim of its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setting {
    Steps,
    PerDeviceBatchSize,
    /// The batch axis as pure data parallelism (`ici_data_parallelism`).
    DataParallelism,
    /// The batch axis as fsdp (`ici_fsdp_parallelism`).
    FsdpParallelism,
    /// The context axis (`ici_context_parallelism`).
    ContextParallelism,
    /// `max_target_length`.
    SeqLen,
    LearningRate,
    LayersPerIteration,
    Dtype,
    /// The model preset.
    Model,
    Vocab,
    DModel,
    Layers,
    Heads,
    KvHeads,
    HeadDim,
    MlpDim,
    /// The checkpoint a run resumes from.
    Resume,
    /// The seed of the initialisation and the data.
    Seed,
    /// The all-gather matmul in place of fsdp's gathered weight matmuls
    /// (`collective_matmul`).
    CollectiveMatmul,
    /// Linear warmup steps of the schedule.
    WarmupSteps,
    /// The schedule's final learning rate as a fraction of the peak.
    FinalLrFraction,
    /// The step a run stops at (the schedule still spans `steps`).
    StopAt,
    /// Parameters and optimizer state split over the context axis without fsdp
    /// (`shard_weights_over_context`).
    ShardWeightsOverContext,
}

impl Setting {
    /// How messages name it (the keys a command line maps to its flags; the attention's
    /// quantities are `tessera-parallel`'s).
    pub fn term(self) -> Term {
        let named = |key, words| Term {
            key,
            words,
            kind: TermKind::Setting,
        };
        match self {
            Setting::Steps => named("steps", "steps"),
            Setting::PerDeviceBatchSize => named("per_device_batch_size", "per_device_batch_size"),
            Setting::DataParallelism => Quantity::DataDegree.term(),
            Setting::FsdpParallelism => Term {
                key: "fsdp",
                words: "fsdp degree",
                kind: TermKind::Named,
            },
            Setting::ContextParallelism => Quantity::ContextDegree.term(),
            Setting::SeqLen => Quantity::SeqLen.term(),
            Setting::LearningRate => named("learning_rate", "learning_rate"),
            Setting::LayersPerIteration => named("layers_per_iteration", "layers_per_iteration"),
            Setting::Dtype => named("dtype", "dtype"),
            Setting::Model => named("model", "model"),
            Setting::Vocab => named("vocab", "vocab"),
            Setting::DModel => named("d_model", "d_model"),
            Setting::Layers => named("layers", "layers"),
            Setting::Heads => Quantity::Heads.term(),
            Setting::KvHeads => Quantity::KvHeads.term(),
            Setting::HeadDim => Quantity::HeadDim.term(),
            Setting::MlpDim => named("mlp_dim", "mlp_dim"),
            Setting::Seed => named("seed", "seed"),
            Setting::CollectiveMatmul => named("collective_matmul", "collective_matmul"),
            Setting::WarmupSteps => named("warmup_steps", "warmup_steps"),
            Setting::FinalLrFraction => named("final_lr_fraction", "final_lr_fraction"),
            Setting::StopAt => named("stop_at", "stop_at"),
            Setting::ShardWeightsOverContext => {
                named("shard_weights_over_context", "shard_weights_over_context")
            }
            Setting::Resume => Term {
                key: "resume",
                words: "checkpoint",
                kind: TermKind::Named,
            },
        }
    }
}

/// A model dim that fsdp and the context axis split a weight along: one setting, or the
/// product of two (`heads x head_dim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightDim(pub Setting, pub Option<Setting>);

impl WeightDim {
    fn name(&self, names: &dyn Names) -> String {
        let first = self.0.term().name(names);
        match self.1 {
            Some(second) => format!("{first} x {}", second.term().name(names)),
            None => first,
        }
    }
}

/// A setting, or a combination of settings, that cannot run.
#[derive(Debug)]
pub enum SettingError {
    /// No preset of that name.
    UnknownModel { name: String },
    /// A count or degree is 0.
    Zero { setting: Setting },
    /// A rate that must be a positive number.
    NotPositive { setting: Setting, value: f64 },
    /// The layers per loop iteration do not divide the layers.
    LayersPerIteration { per: usize, layers: usize },
    /// Not a compute dtype of the step.
    ComputeDtype { dtype: DType },
    /// The query heads are not a multiple of the KV heads.
    GqaHeads { heads: usize, kv_heads: usize },
    /// RoPE rotates pairs of dims.
    OddHeadDim { head_dim: usize },
    /// Data and fsdp both above 1 on the one batch axis.
    BatchAxes { data: usize, fsdp: usize },
    /// Weights split over the context axis on a data-parallel batch axis.
    WeightsOverContextWithData { data: usize },
    /// USP's ring axis, which splits the weights with `shard_weights_over_context`, does not
    /// divide a weight dim.
    RingWeightDim {
        dim: WeightDim,
        size: usize,
        ring: usize,
    },
    /// fsdp does not divide a weight dim it splits.
    FsdpDim {
        dim: WeightDim,
        size: usize,
        fsdp: usize,
    },
    /// The context axis, which fsdp (or `shard_weights_over_context`) splits the weights
    /// over, does not divide a weight dim (`shards`: the devices on the mesh's context axis).
    FsdpContextDim {
        dim: WeightDim,
        size: usize,
        fsdp: usize,
        shards: usize,
        context: usize,
    },
    /// The checkpoint is already at the last step.
    ResumeAtEnd {
        path: String,
        step: usize,
        steps: usize,
    },
    /// A checkpoint of another model.
    CheckpointModel {
        path: String,
        saved: String,
        model: String,
    },
    /// A checkpoint of another seed: the data would not continue where it stopped.
    CheckpointSeed { path: String, saved: u64, seed: u64 },
    /// A checkpoint saved with another learning-rate schedule (`setting`: steps, warmup
    /// steps, learning rate or final fraction; values as written in the checkpoint).
    CheckpointSchedule {
        path: String,
        setting: Setting,
        saved: String,
        run: String,
    },
    /// The step to stop at is not in `1..=steps`.
    StopAt { stop_at: usize, steps: usize },
    /// A warmup longer than the run: the learning rate would never reach its peak, and the
    /// cosine after it would have no steps.
    WarmupPastRun { warmup: usize, steps: usize },
    /// The checkpoint resumed from is already at or past the step to stop at.
    ResumePastStop {
        path: String,
        step: usize,
        stop_at: usize,
    },
    /// The step does not fit in memory (`needed` = `state` + `activations`, bytes of
    /// `devices` devices together; `place` holds `available` bytes).
    Memory {
        needed: f64,
        state: f64,
        activations: f64,
        devices: usize,
        available: f64,
        place: String,
        per_device_batch_size: f64,
        seq_len: usize,
    },
    /// Not a TPU slice the step-time model knows.
    NotASlice { text: String },
    /// The mesh's devices are not the slice's chips.
    SliceChips {
        fsdp: usize,
        context: usize,
        chip: String,
        chips: usize,
    },
    /// `per_device_batch_size x context` is not a positive whole number of sequences: the
    /// context axis splits one sequence, but each of the `batch_shards` data (or fsdp) shards
    /// needs whole sequences.
    PartialSequences {
        per_device: f64,
        context: usize,
        batch_shards: usize,
    },
    /// fsdp x context is not whole axes of the torus.
    MeshNotOnTorus {
        fsdp: usize,
        context: usize,
        chip: String,
        torus: Vec<usize>,
    },
    /// The all-gather matmul asked for without fsdp: there is no gathered weight to
    /// replace.
    CollectiveMatmulWithoutFsdp { fsdp: usize },
    /// The all-gather matmul's Mosaic kernel (TPU) copies weight shards in whole 128-lane
    /// tiles: a weight dim `size` split over `shards` devices (its rows over fsdp, `shards`
    /// 1 for its columns) that leaves a device no multiple of 128.
    CollectiveMatmulTiles {
        dim: WeightDim,
        size: usize,
        shards: usize,
    },
    /// The Ulysses and ring degrees of a strategy that runs both (USP) are not whole axes of
    /// the torus (the ring takes the last axes, Ulysses the ones before them).
    UlyssesRingNotOnTorus {
        strategy: Strategy,
        ulysses: usize,
        ring: usize,
        chip: String,
        torus: Vec<usize>,
    },
    /// splash's block tables refused the blocks the step-time model counts.
    Blocks {
        block_q: usize,
        block_kv: usize,
        q_len: usize,
        kv_len: usize,
        source: Box<SplashError>,
    },
}

impl SettingError {
    /// The message with the settings named as `names` names them (a command line's flags);
    /// [`Display`](fmt::Display) uses the library's words.
    pub fn describe(&self, names: &dyn Names) -> String {
        let t = |s: Setting| s.term();
        match self {
            SettingError::UnknownModel { name } => format!(
                "{} is not a preset; use tiny, small, llama2-7b or llama3.1-8b (and {} to \
                 change its dims)",
                t(Setting::Model).value(names, name),
                [
                    Setting::DModel,
                    Setting::Layers,
                    Setting::Heads,
                    Setting::KvHeads,
                    Setting::HeadDim,
                    Setting::MlpDim,
                    Setting::Vocab,
                ]
                .map(|s| t(s).name(names))
                .join(", ")
            ),
            SettingError::Zero { setting } => {
                format!("{}; it must be at least 1", t(*setting).is(names, 0))
            }
            SettingError::NotPositive { setting, value } => format!(
                "{} is not a positive number",
                t(*setting).value(names, value)
            ),
            SettingError::LayersPerIteration { per, layers } => format!(
                "{per} layers per loop iteration do not divide the {layers} layers; use a \
                 divisor of the layers"
            ),
            SettingError::ComputeDtype { dtype } => format!(
                "{} is not a compute dtype of the train step; use f32 or bf16",
                t(Setting::Dtype).value(names, dtype)
            ),
            SettingError::GqaHeads { heads, kv_heads } => format!(
                "{} are not a multiple of {}; grouped-query attention shares each KV head \
                 among an equal number of query heads",
                t(Setting::Heads).value(names, heads),
                t(Setting::KvHeads).value(names, kv_heads)
            ),
            SettingError::OddHeadDim { head_dim } => format!(
                "{} is odd; RoPE rotates pairs of dims, use an even head dim",
                t(Setting::HeadDim).value(names, head_dim)
            ),
            SettingError::BatchAxes { data, fsdp } => format!(
                "{} and {} both split the batch, but the mesh has one batch axis; set one of \
                 them to 1 (fsdp also shards the parameters and optimizer state, data \
                 replicates them)",
                t(Setting::DataParallelism).value(names, data),
                t(Setting::FsdpParallelism).value(names, fsdp)
            ),
            SettingError::WeightsOverContextWithData { data } => format!(
                "{} splits the weights over the context axis, but {} replicates them over the \
                 batch axis, a layout the step does not build; shard over the batch axis too \
                 ({} instead), or turn {} off",
                t(Setting::ShardWeightsOverContext).name(names),
                t(Setting::DataParallelism).value(names, data),
                t(Setting::FsdpParallelism).value(names, data),
                t(Setting::ShardWeightsOverContext).name(names)
            ),
            SettingError::RingWeightDim { dim, size, ring } => format!(
                "{} splits the parameters' {} dim ({size}) over USP's ring of {ring} devices, \
                 which does not divide it; use a ring degree that divides {size}, or turn {} \
                 off",
                t(Setting::ShardWeightsOverContext).name(names),
                dim.name(names),
                t(Setting::ShardWeightsOverContext).name(names)
            ),
            SettingError::FsdpDim { dim, size, fsdp } => format!(
                "{} shards the parameters' {} dim ({size}) over {fsdp} devices, which does not \
                 divide it; use an fsdp degree that divides {size}, or {}",
                t(Setting::FsdpParallelism).value(names, fsdp),
                dim.name(names),
                t(Setting::DataParallelism).value(names, fsdp)
            ),
            SettingError::FsdpContextDim {
                dim,
                size,
                fsdp,
                shards,
                context,
            } if *fsdp > 1 => format!(
                "{} also shards the parameters' {} dim ({size}) over the {shards} context \
                 devices ({}), which does not divide it; use a context degree that divides \
                 {size}, or {}",
                t(Setting::FsdpParallelism).value(names, fsdp),
                dim.name(names),
                t(Setting::ContextParallelism).value(names, context),
                t(Setting::DataParallelism).value(names, fsdp)
            ),
            SettingError::FsdpContextDim {
                dim,
                size,
                shards,
                context,
                ..
            } => format!(
                "{} shards the parameters' {} dim ({size}) over the {shards} context devices \
                 ({}), which does not divide it; use a context degree that divides {size}, or \
                 turn {} off",
                t(Setting::ShardWeightsOverContext).name(names),
                dim.name(names),
                t(Setting::ContextParallelism).value(names, context),
                t(Setting::ShardWeightsOverContext).name(names)
            ),
            SettingError::ResumeAtEnd { path, step, steps } => format!(
                "{} is at step {step}, and {}; ask for more steps",
                t(Setting::Resume).value(names, path),
                t(Setting::Steps).is(names, steps)
            ),
            SettingError::CheckpointModel { path, saved, model } => format!(
                "checkpoint {path}: it holds the model `{saved}`, this run trains `{model}`; \
                 resume with the {} and dims it was saved with",
                t(Setting::Model).name(names)
            ),
            SettingError::CheckpointSeed { path, saved, seed } => format!(
                "checkpoint {path}: it was saved with {}, this run has {}; the data would not \
                 continue where it stopped, resume with {}",
                t(Setting::Seed).value(names, saved),
                t(Setting::Seed).value(names, seed),
                t(Setting::Seed).value(names, saved)
            ),
            SettingError::CheckpointSchedule {
                path,
                setting,
                saved,
                run,
            } => format!(
                "checkpoint {path}: it was saved with {}, this run has {}; the learning-rate \
                 schedule would change mid-run, resume with {}",
                t(*setting).value(names, saved),
                t(*setting).value(names, run),
                t(*setting).value(names, saved)
            ),
            SettingError::StopAt { stop_at, steps } => format!(
                "{} is outside 1..={steps} ({}); stop at a step the run has",
                t(Setting::StopAt).value(names, stop_at),
                t(Setting::Steps).value(names, steps)
            ),
            SettingError::WarmupPastRun { warmup, steps } => format!(
                "{} is longer than the run ({}): the learning rate would never reach its \
                 peak, and the cosine after it would have no steps; use {} {steps} or less, or \
                 more {}",
                t(Setting::WarmupSteps).value(names, warmup),
                t(Setting::Steps).value(names, steps),
                t(Setting::WarmupSteps).name(names),
                t(Setting::Steps).name(names)
            ),
            SettingError::ResumePastStop {
                path,
                step,
                stop_at,
            } => format!(
                "{} is at step {step}, at or past {}; nothing would be trained, stop at a \
                 later step",
                t(Setting::Resume).value(names, path),
                t(Setting::StopAt).value(names, stop_at)
            ),
            SettingError::Memory {
                needed,
                state,
                activations,
                devices,
                available,
                place,
                per_device_batch_size,
                seq_len,
            } => {
                let gib = |b: &f64| match b / (1u64 << 30) as f64 {
                    g if g < 1e6 => format!("{g:.1} GiB"),
                    g => format!("{g:.1e} GiB"),
                };
                format!(
                    "the train step needs about {} on {devices} device{} (state {} + \
                     activations {} for {per_device_batch_size} x {seq_len} tokens a device), \
                     but {place} has {}; lower {} or {}, or the model's dims",
                    gib(needed),
                    if *devices == 1 { "" } else { "s" },
                    gib(state),
                    gib(activations),
                    gib(available),
                    t(Setting::PerDeviceBatchSize).name(names),
                    t(Setting::SeqLen).name(names)
                )
            }
            SettingError::NotASlice { text } => format!(
                "`{text}` is not a TPU slice; use v5p:AxBxC (e.g. v5p:4x4x4) or v5e:AxB (e.g. \
                 v5e:16x16)"
            ),
            SettingError::SliceChips {
                fsdp,
                context,
                chip,
                chips,
            } => format!(
                "{} x {} = {} devices, but {chip} has {chips} chips; make their product the \
                 slice's chip count",
                t(Setting::FsdpParallelism).value(names, fsdp),
                t(Setting::ContextParallelism).value(names, context),
                fsdp * context
            ),
            SettingError::PartialSequences {
                per_device,
                context,
                batch_shards,
            } => format!(
                "{} x {} gives each of the {batch_shards} batch shards {} sequences; the \
                 context devices split one sequence, but a batch shard needs whole sequences: \
                 use a multiple of {} (1 / the context degree)",
                t(Setting::PerDeviceBatchSize).value(names, per_device),
                t(Setting::ContextParallelism).value(names, context),
                short(per_device * *context as f64),
                short(1.0 / *context as f64),
            ),
            SettingError::MeshNotOnTorus {
                fsdp,
                context,
                chip,
                torus,
            } => format!(
                "{} x {} does not map onto whole axes of the {chip} torus {torus:?}; use a \
                 context degree that is the product of its last axes and an fsdp degree that \
                 is the product of the rest",
                t(Setting::FsdpParallelism).value(names, fsdp),
                t(Setting::ContextParallelism).value(names, context),
            ),
            SettingError::CollectiveMatmulWithoutFsdp { fsdp } => format!(
                "{} replaces the matmuls of fsdp's all-gathered weights, but {}; leave it out, \
                 or shard the weights ({} above 1)",
                t(Setting::CollectiveMatmul).name(names),
                t(Setting::FsdpParallelism).is(names, fsdp),
                t(Setting::FsdpParallelism).name(names),
            ),
            SettingError::CollectiveMatmulTiles { dim, size, shards } => {
                let part = if *shards == 1 {
                    format!(
                        "the {} columns ({size}) are not a multiple of 128",
                        dim.name(names)
                    )
                } else {
                    format!(
                        "the {} rows ({size}) over {shards} fsdp devices are {} a device, not \
                         a multiple of 128",
                        dim.name(names),
                        size / shards
                    )
                };
                format!(
                    "{} on TPU copies the weight shards in whole 128-lane tiles, but {part}; use \
                     dims whose shards are multiples of 128, or leave it out",
                    t(Setting::CollectiveMatmul).name(names)
                )
            }
            SettingError::UlyssesRingNotOnTorus {
                strategy,
                ulysses,
                ring,
                chip,
                torus,
            } => format!(
                "{} (Ulysses degree {ulysses} x ring degree {ring}) does not map onto whole axes \
                 of the {chip} torus {torus:?} \
                 (the ring takes its last axes, Ulysses the ones before them); use a ring \
                 degree that is the product of its last axes and a Ulysses degree that is the \
                 product of the axes before them",
                names.strategy(&strategy.label())
            ),
            SettingError::Blocks {
                block_q,
                block_kv,
                q_len,
                kv_len,
                source,
            } => format!(
                "splash blocks {block_q}x{block_kv} for {q_len} queries x {kv_len} keys: \
                 {source}"
            ),
        }
    }
}

/// A number with at most 6 decimals, trailing zeros dropped (`0.4`, not
/// `0.30000000000000004` or `0.400000`).
fn short(x: f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.to_string()
    }
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(&tessera_parallel::LibraryNames))
    }
}

impl std::error::Error for SettingError {}

/// Why training could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting or a combination of settings that cannot run (boxed: it is the largest).
    #[error(transparent)]
    Setting(Box<SettingError>),
    /// The attention's context-parallel configuration (its strategy's rules), or running it.
    #[error(transparent)]
    ContextParallel(#[from] CpError),
    #[error(transparent)]
    Collective(#[from] tessera_collectives::CollectiveError),
    /// (The message includes the cause.)
    #[error("XLA runtime: {0}")]
    Runtime(tessera_runtime::Error),
    /// The platform's devices could not be had (none on this machine, too few, ...).
    #[error(transparent)]
    Devices(tessera_runtime::Error),
    /// Text data, its tokenizer, or a checkpoint's tokenizer that cannot be used.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// A checkpoint that cannot be written or read, or does not fit this run.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: String, reason: String },
    /// A step gave a loss or gradient norm that is not a finite number; training stops (the
    /// state after it is not worth keeping).
    #[error(
        "step {step} gave a non-finite {what} ({value}), so training stops there; lower the \
         learning rate, or resume from an earlier checkpoint"
    )]
    NonFinite {
        step: usize,
        what: &'static str,
        value: f64,
    },
}

impl From<SettingError> for TrainError {
    fn from(e: SettingError) -> Self {
        TrainError::Setting(Box::new(e))
    }
}

impl From<tessera_runtime::Error> for TrainError {
    fn from(e: tessera_runtime::Error) -> Self {
        TrainError::Runtime(e)
    }
}

impl From<tessera_parallel::ConfigError> for TrainError {
    fn from(e: tessera_parallel::ConfigError) -> Self {
        TrainError::ContextParallel(e.into())
    }
}

impl TrainError {
    /// The message with the settings named as `names` names them (a command line's flags).
    pub fn describe(&self, names: &dyn Names) -> String {
        match self {
            TrainError::Setting(e) => e.describe(names),
            TrainError::ContextParallel(e) => e.describe(names),
            TrainError::Data(e) => e.describe(names),
            other => other.to_string(),
        }
    }
}
