//! The flags that shape a train step (model, sequence, batch, mesh, context-parallel
//! strategy, splash blocks), MaxText's names, shared by `tessera compile train` and
//! `examples/train.rs` (which includes this file by path), and how the library's errors name
//! them ([`MaxTextFlags`]).

use clap::Args;
use tessera::dsl::DType;
use tessera::parallel::strategy::{Fixed, Ulysses};
use tessera::parallel::{Names, Strategy, StrategyName};
use tessera_train::{ModelConfig, RematPolicy, TrainConfig, TrainError};

/// Help text that names the listed strategies (`tessera::parallel::strategy`'s one list; the
/// CLI and the train example share it): `before`, a colon, every spelling
/// ([`Strategy::spellings`]), then `after`.
pub fn strategies_help(before: &str, after: &str) -> String {
    format!("{before}: {}{after}", Strategy::spellings())
}

/// Help text for a load-balancing flag: `before`, the listed strategies that balance
/// ([`Strategy::load_balancing`]), then `after`.
pub fn load_balance_help(before: &str, after: &str) -> String {
    let names: Vec<String> = Strategy::load_balancing(4)
        .iter()
        .map(|s| s.to_string())
        .collect();
    let listed = match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.concat(),
    };
    format!("{before} {listed}{after}")
}

/// The model: a preset and the dims that override it.
#[derive(Args, Debug, Clone)]
pub struct ModelFlags {
    /// Model preset: tiny, small, llama2-7b or llama3.1-8b (the dim flags below override
    /// its dims).
    #[arg(long, default_value = "tiny")]
    pub model: String,
    #[arg(long)]
    pub vocab: Option<usize>,
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Decoder layers (default: the preset's), e.g. to compile a few layers of a deep model.
    #[arg(long, alias = "num-layers")]
    pub layers: Option<usize>,
    #[arg(long)]
    pub heads: Option<usize>,
    #[arg(long)]
    pub kv_heads: Option<usize>,
    #[arg(long)]
    pub head_dim: Option<usize>,
    #[arg(long)]
    pub mlp_dim: Option<usize>,
}

impl ModelFlags {
    /// The preset with the dims these flags set.
    pub fn model(&self) -> Result<ModelConfig, String> {
        let mut model = ModelConfig::preset(&self.model).map_err(|e| flag_error(&e))?;
        let dims = [
            (&mut model.vocab, self.vocab),
            (&mut model.d_model, self.d_model),
            (&mut model.layers, self.layers),
            (&mut model.heads, self.heads),
            (&mut model.kv_heads, self.kv_heads),
            (&mut model.head_dim, self.head_dim),
            (&mut model.mlp_dim, self.mlp_dim),
        ];
        for (dim, flag) in dims {
            if let Some(v) = flag {
                *dim = v;
            }
        }
        Ok(model)
    }
}

/// Sequence, batch, mesh (data or fsdp x context), strategy and splash blocks of a train
/// step.
#[derive(Args, Debug, Clone)]
pub struct StepFlags {
    /// Tokens per sequence (default: the preset's, 256 for tiny).
    #[arg(long)]
    pub max_target_length: Option<usize>,
    /// Sequences per device; the global batch is this times the devices. May be a fraction,
    /// as MaxText's (0.015625: one sequence on 64 chips), when the context axis covers it:
    /// this times --ici-context-parallelism must be a whole number of sequences.
    #[arg(long, default_value_t = 1.0)]
    pub per_device_batch_size: f64,
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
    #[arg(long, default_value = <Ulysses as Fixed>::SPELLINGS[0], help = strategies_help(
        "The context-parallel strategy",
        "",
    ))]
    pub context_parallel_strategy: String,
    #[arg(
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        help = load_balance_help(
            "Causal load balancing (zigzag) for",
            ": `--context-parallel-load-balance` (or `=true`) turns it on, `=false` off. \
             Default: `tessera compile --target tpu:.. train` balances as MaxText does (on for \
             the strategies that balance); the train example does not",
        )
    )]
    pub context_parallel_load_balance: Option<bool>,
    /// Splash block sizes, or `auto` (default: what each attention call holds up to 512,
    /// else its largest divisor up to 512 that tiles on a TPU). `auto` asks `tessera tune`'s
    /// search for a TPU target (libtpu's cycles of each candidate), splash's default rule
    /// elsewhere.
    #[arg(long)]
    pub sa_block_q: Option<BlockFlag>,
    #[arg(long)]
    pub sa_block_kv: Option<BlockFlag>,
    #[arg(long)]
    pub sa_block_q_dkv: Option<BlockFlag>,
    #[arg(long)]
    pub sa_block_kv_dkv: Option<BlockFlag>,
    /// Splash's backward as one fused kernel per key block (dK, dV, and dQ into 3 partials
    /// summed after it, MaxText's `dq_reduction_steps=3`) instead of separate dK/dV and dQ
    /// kernels (MaxText's `sa_use_fused_bwd_kernel`). `--sa-use-fused-bwd-kernel` (or
    /// `=true`) on, `=false` off. Default: off for `tessera compile --target tpu:.. train`
    /// (MaxText's); on for the train example (faster on CPU).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub sa_use_fused_bwd_kernel: Option<bool>,
    /// Compute dtype (MaxText's `dtype`): f32, or bf16 for the matmuls, activations, weight
    /// gathers and attention (parameters and AdamW moments stay f32; norms, softmax and the
    /// loss in f32). Default: bf16 for `tessera compile --target tpu:.. train` (MaxText's),
    /// f32 for the train example.
    #[arg(long)]
    pub dtype: Option<String>,
    /// With fsdp: run each layer's weight matmuls (q/k/v/o projections and the MLP) as an
    /// all-gather matmul kernel, whose remote copy of the next weight shard overlaps the
    /// matmul of the current one, instead of all-gathering the weight before a dot.
    #[arg(long)]
    pub collective_matmul: bool,
    /// Parameters, gradients and AdamW moments split over the context axis when the batch
    /// axis is one device (no data or fsdp parallelism), gathered layer by layer as fsdp's
    /// are (MaxText's `embed` rule shards them over context whatever the fsdp degree; with
    /// fsdp they are split over context anyway). `--shard-weights-over-context` (or `=true`)
    /// on, `=false` off. Default: on for `tessera compile --target tpu:.. train` (MaxText's);
    /// off for the train example. Refused with --ici-data-parallelism above 1.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub shard_weights_over_context: Option<bool>,
    /// What the layer loop's backward recomputes (MaxText's `remat_policy`): full (each
    /// layer's whole forward, re-run from its input) or save_attention (all but the
    /// attention: each layer's q, k, v after the strategy's exchange, the attention's output
    /// and logsumexp are saved in the forward, so the backward runs no q/k/v projection, no
    /// exchange and no attention forward again; more memory per layer).
    #[arg(long, value_enum, default_value = "full")]
    pub remat_policy: RematPolicyFlag,
    /// Whether the backward re-runs the last layer too, as it re-runs every other one
    /// (MaxText's scanned layers do). `=false`: the last layer runs after the layer loop and
    /// its backward reads the activations its forward computed (one layer's forward less to
    /// recompute; its activations are held through the loss). `--remat-last-layer` (or
    /// `=true`) on. Default: on for `tessera compile --target tpu:.. train` (MaxText's); off
    /// for the train example (faster on CPU).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub remat_last_layer: Option<bool>,
}

/// `--remat-policy`'s values (`full` is MaxText's name and default).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RematPolicyFlag {
    /// Re-run each layer's whole forward in the backward (MaxText's default).
    Full,
    /// Save the attention's residuals and output; re-run the rest of the layer.
    #[value(name = "save_attention")]
    SaveAttention,
}

impl From<RematPolicyFlag> for RematPolicy {
    fn from(flag: RematPolicyFlag) -> Self {
        match flag {
            RematPolicyFlag::Full => RematPolicy::Full,
            RematPolicyFlag::SaveAttention => RematPolicy::SaveAttention,
        }
    }
}

/// Where a run's data comes from (MaxText's `dataset_type`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // used by examples/train.rs, which includes this file
pub enum DatasetType {
    /// A seeded Markov chain with structure to learn (no files).
    Synthetic,
    /// Local files in the formats Hugging Face datasets stores and reads with its `text`,
    /// `json` and `parquet` builders (MaxText's `hf` pipeline loads a dataset through HF
    /// datasets; here its files are read directly, nothing downloaded): `hf` is the MaxText
    /// value for those formats, the others (grain, tfds) read formats this does not.
    Hf,
}

/// The data a run trains on, MaxText's names: `--dataset-type`, `--dataset-path`,
/// `--train-data-columns`, `--tokenizer-path`, `--packing`.
#[derive(Args, Debug, Clone)]
#[allow(dead_code)] // used by examples/train.rs, which includes this file
pub struct DataFlags {
    /// synthetic (default: a seeded Markov chain) or hf: the text of --dataset-path.
    #[arg(long, value_enum, default_value = "synthetic")]
    pub dataset_type: DatasetType,
    /// With --dataset-type hf: a file or a directory of files: .txt (one document per
    /// blank-line-separated paragraph), .jsonl/.json (one JSON object per line, the text under
    /// --train-data-columns) or .parquet (that column, uncompressed or snappy).
    #[arg(long)]
    pub dataset_path: Option<std::path::PathBuf>,
    /// The JSON or Parquet column holding the text (MaxText's `train_data_columns`, one
    /// column; `--text-field` is another spelling).
    #[arg(long, default_value = "text", alias = "text-field")]
    pub train_data_columns: String,
    /// A Hugging Face tokenizer.json (its vocabulary size must be --vocab, and it needs an
    /// end-of-text token). Default: a byte-level BPE of --vocab tokens trained on the data.
    #[arg(long)]
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// Documents packed several to a row, kept apart by segment ids (MaxText's `packing`):
    /// `--packing` (or `=true`, the default) on, `--packing=false` one document a row.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub packing: Option<bool>,
}

impl DataFlags {
    /// The text `model` trains on with a sequence of `seq` tokens, or `None` for synthetic
    /// data; refuses text flags without `--dataset-type hf` and `hf` without a path.
    #[allow(dead_code)] // used by examples/train.rs, which includes this file
    pub fn text_options(
        &self,
        model: &ModelConfig,
        seq: usize,
    ) -> Result<Option<tessera_train::data::TextOptions>, String> {
        match self.dataset_type {
            DatasetType::Synthetic => {
                let given = [
                    ("--dataset-path", self.dataset_path.is_some()),
                    ("--tokenizer-path", self.tokenizer_path.is_some()),
                    ("--packing", self.packing.is_some()),
                ];
                match given.iter().find(|(_, set)| *set) {
                    Some((flag, _)) => Err(format!(
                        "{flag} is for text, but --dataset-type is synthetic; add \
                         --dataset-type hf"
                    )),
                    None => Ok(None),
                }
            }
            DatasetType::Hf => {
                let path = self.dataset_path.clone().ok_or_else(|| {
                    "--dataset-type hf reads local files; name them with --dataset-path (a \
                     file or a directory)"
                        .to_string()
                })?;
                Ok(Some(tessera_train::data::TextOptions {
                    path,
                    column: self.train_data_columns.clone(),
                    tokenizer: self.tokenizer_path.clone(),
                    vocab: model.vocab,
                    seq,
                    packing: self.packing.unwrap_or(true),
                }))
            }
        }
    }
}

/// A splash block flag: a size, or `auto` (chosen by a search, see [`StepFlags::config_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFlag {
    Auto,
    Size(usize),
}

impl std::str::FromStr for BlockFlag {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(BlockFlag::Auto);
        }
        s.parse()
            .map(BlockFlag::Size)
            .map_err(|_| format!("`{s}` is not a block size; use a number of rows, or auto"))
    }
}

/// The defaults of the settings that depend on who runs the step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepDefaults {
    /// The compute dtype without `--dtype`.
    pub dtype: DType,
    /// Whether a strategy that load-balances does so without
    /// `--context-parallel-load-balance`.
    pub load_balance: bool,
    /// Whether the weights are split over the context axis without
    /// `--shard-weights-over-context`, where the batch axis is one device.
    pub shard_weights_over_context: bool,
    /// Whether splash's backward is its fused kernel without `--sa-use-fused-bwd-kernel`.
    pub sa_use_fused_bwd_kernel: bool,
    /// Whether the backward re-runs the last layer without `--remat-last-layer`.
    pub remat_last_layer: bool,
}

impl StepDefaults {
    /// The train example on this machine's devices: f32, no load balancing, splash's fused
    /// backward and the last layer not re-run (each measured faster on CPU: docs/training.md).
    #[allow(dead_code)] // used by examples/train.rs, which includes this file
    pub const EXAMPLE: StepDefaults = StepDefaults {
        dtype: DType::F32,
        load_balance: false,
        shard_weights_over_context: false,
        sa_use_fused_bwd_kernel: true,
        remat_last_layer: false,
    };
    /// MaxText's (`dtype: bfloat16`, `context_parallel_load_balance: True`, the `embed`
    /// rule's weights over context, `sa_use_fused_bwd_kernel: False`, every scanned layer
    /// re-run), what a TPU compile of the step uses.
    #[allow(dead_code)] // used by the tessera binary, not by examples/train.rs
    pub const MAXTEXT: StepDefaults = StepDefaults {
        dtype: DType::BF16,
        load_balance: true,
        shard_weights_over_context: true,
        sa_use_fused_bwd_kernel: false,
        remat_last_layer: true,
    };
}

/// The four splash blocks, `[q, kv, q_dkv, kv_dkv]`, a search chose for a config.
pub type AutoBlocks<'a> = &'a mut dyn FnMut(&TrainConfig) -> Result<[usize; 4], String>;

impl StepFlags {
    /// Whether a block flag is `auto`.
    #[allow(dead_code)] // used by the tessera binary, not by examples/train.rs
    pub fn has_auto_blocks(&self) -> bool {
        [
            self.sa_block_q,
            self.sa_block_kv,
            self.sa_block_q_dkv,
            self.sa_block_kv_dkv,
        ]
        .contains(&Some(BlockFlag::Auto))
    }

    /// `model` trained as these flags say (the other settings at the train example's
    /// defaults, [`StepDefaults::EXAMPLE`]; `auto` blocks at splash's default rule), not yet
    /// validated.
    #[allow(dead_code)] // used by examples/train.rs, which includes this file
    pub fn config(&self, model: ModelConfig) -> Result<TrainConfig, String> {
        self.config_with(model, StepDefaults::EXAMPLE, None)
    }

    /// [`StepFlags::config`] with `defaults` for the unset flags, and the `auto` blocks
    /// asked of `auto` (once, with the config whose other blocks are splash's defaults);
    /// without it they keep splash's default rule.
    pub fn config_with(
        &self,
        model: ModelConfig,
        defaults: StepDefaults,
        auto: Option<AutoBlocks<'_>>,
    ) -> Result<TrainConfig, String> {
        let cp = self.ici_context_parallelism;
        let strategy = Strategy::parse(&self.context_parallel_strategy, cp)
            .map_err(|e| e.describe(&MaxTextFlags))?;
        let dtype = match &self.dtype {
            None => defaults.dtype,
            Some(name) => DType::compute_from_name(name).ok_or_else(|| {
                format!("--dtype {name} is not a compute dtype of the train step; use f32 or bf16")
            })?,
        };
        let load_balance = self
            .context_parallel_load_balance
            .unwrap_or(defaults.load_balance && strategy.load_balances());
        let mut cfg = TrainConfig::new(model);
        cfg.dtype = dtype;
        cfg.max_target_length = self.max_target_length.unwrap_or(model.default_seq());
        cfg.per_device_batch_size = self.per_device_batch_size;
        cfg.ici_context_parallelism = cp;
        cfg.ici_data_parallelism = self.ici_data_parallelism;
        cfg.ici_fsdp_parallelism = self.ici_fsdp_parallelism;
        cfg.strategy = strategy;
        cfg.load_balance = load_balance;
        cfg.collective_matmul = self.collective_matmul;
        cfg.remat_policy = self.remat_policy.into();
        cfg.remat_last_layer = self.remat_last_layer.unwrap_or(defaults.remat_last_layer);
        cfg.sa_use_fused_bwd_kernel = self
            .sa_use_fused_bwd_kernel
            .unwrap_or(defaults.sa_use_fused_bwd_kernel);
        // By default only where it applies: a data-parallel batch axis keeps them replicated.
        cfg.shard_weights_over_context = self.shard_weights_over_context.unwrap_or(
            defaults.shard_weights_over_context
                && self.ici_data_parallelism == 1
                && self.ici_fsdp_parallelism == 1,
        );
        let mut cfg = cfg.with_default_blocks();
        let flags = [
            self.sa_block_q,
            self.sa_block_kv,
            self.sa_block_q_dkv,
            self.sa_block_kv_dkv,
        ];
        let picked = match auto {
            Some(search) if flags.contains(&Some(BlockFlag::Auto)) => Some(search(&cfg)?),
            _ => None,
        };
        let blocks = [
            &mut cfg.sa_block_q,
            &mut cfg.sa_block_kv,
            &mut cfg.sa_block_q_dkv,
            &mut cfg.sa_block_kv_dkv,
        ];
        for (i, (block, flag)) in blocks.into_iter().zip(flags).enumerate() {
            match (flag, picked) {
                (Some(BlockFlag::Size(b)), _) => *block = b,
                (Some(BlockFlag::Auto), Some(p)) => *block = p[i],
                _ => {}
            }
        }
        Ok(cfg)
    }
}

/// The library's quantities as the train flags name them (MaxText's), and strategies as
/// MaxText spells them (`all_gather`).
#[derive(Debug, Clone, Copy)]
pub struct MaxTextFlags;

impl Names for MaxTextFlags {
    fn flag(&self, key: &str) -> Option<&str> {
        Some(match key {
            "model" => "--model",
            "vocab" => "--vocab",
            "d_model" => "--d-model",
            "layers" => "--layers",
            "heads" => "--heads",
            "kv_heads" => "--kv-heads",
            "head_dim" => "--head-dim",
            "mlp_dim" => "--mlp-dim",
            "seq_len" => "--max-target-length",
            "per_device_batch_size" => "--per-device-batch-size",
            "context" => "--ici-context-parallelism",
            "data" => "--ici-data-parallelism",
            "fsdp" => "--ici-fsdp-parallelism",
            "strategy" => "--context-parallel-strategy",
            "load_balance" => "--context-parallel-load-balance",
            "block_q" => "--sa-block-q",
            "block_kv" => "--sa-block-kv",
            // The backward's dq blocks follow the dkv ones.
            "block_q_dkv" | "block_q_dq" => "--sa-block-q-dkv",
            "block_kv_dkv" | "block_kv_dq" => "--sa-block-kv-dkv",
            "steps" => "--steps",
            "learning_rate" => "--learning-rate",
            "warmup_steps" => "--warmup-steps",
            "stop_at" => "--stop-at",
            "dtype" => "--dtype",
            "seed" => "--seed",
            "resume" => "--resume",
            "collective_matmul" => "--collective-matmul",
            "shard_weights_over_context" => "--shard-weights-over-context",
            "remat_policy" => "--remat-policy",
            "dataset_path" => "--dataset-path",
            "train_data_columns" => "--train-data-columns",
            "tokenizer_path" => "--tokenizer-path",
            _ => return None,
        })
    }

    fn strategy(&self, strategy: &StrategyName) -> String {
        strategy.maxtext.clone()
    }
}

/// A train error as the train flags name its settings.
pub fn flag_error(e: &TrainError) -> String {
    e.describe(&MaxTextFlags)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use tessera::dsl::DType;
    use tessera::parallel::strategy::Usp;
    use tessera_train::{ModelConfig, RematPolicy, TrainConfig};

    use super::{flag_error, BlockFlag, StepDefaults, StepFlags};

    /// The step flags alone, parsed as a command line.
    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        step: StepFlags,
    }

    fn parse(args: &[&str]) -> Result<StepFlags, String> {
        let mut all = vec!["tessera"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all)
            .map(|c| c.step)
            .map_err(|e| e.to_string())
    }

    /// MaxText's fractional batch sizes parse (they were refused as "invalid digit"), and a
    /// word does not.
    #[test]
    fn fractional_batch_sizes_parse() {
        for (text, value) in [("0.015625", 0.015625), ("0.25", 0.25), ("2", 2.0)] {
            let flags = parse(&["--per-device-batch-size", text]).unwrap();
            assert_eq!(flags.per_device_batch_size, value);
        }
        let e = parse(&["--per-device-batch-size", "half"]).unwrap_err();
        assert!(e.contains("--per-device-batch-size"), "{e}");
        // One sequence on 64 chips: llama3-8b's USP configuration, context 64 over every chip.
        let flags = parse(&[
            "--per-device-batch-size",
            "0.015625",
            "--ici-context-parallelism",
            "64",
            "--context-parallel-strategy",
            "usp:16x4",
            "--max-target-length",
            "65536",
        ])
        .unwrap();
        let cfg = flags.config(ModelConfig::llama3_1_8b()).unwrap();
        cfg.validate().unwrap();
        assert_eq!((cfg.global_batch(), cfg.sequences_per_shard()), (1, 1));
    }

    /// Without --dtype and --context-parallel-load-balance, a TPU compile takes MaxText's
    /// defaults (bf16; balanced where the strategy balances), the example its own (f32, not
    /// balanced); `=false` turns balancing off.
    #[test]
    fn defaults_depend_on_who_runs_the_step() {
        let model = ModelConfig::tiny();
        let ring = parse(&["--context-parallel-strategy", "ring"]).unwrap();
        let maxtext = ring
            .config_with(model, StepDefaults::MAXTEXT, None)
            .unwrap();
        assert_eq!((maxtext.dtype, maxtext.load_balance), (DType::BF16, true));
        let example = ring.config(model).unwrap();
        assert_eq!((example.dtype, example.load_balance), (DType::F32, false));
        let ulysses = parse(&[]).unwrap();
        let cfg = ulysses
            .config_with(model, StepDefaults::MAXTEXT, None)
            .unwrap();
        assert!(!cfg.load_balance, "ulysses does not balance");
        let off = parse(&[
            "--context-parallel-strategy",
            "ring",
            "--context-parallel-load-balance=false",
            "--dtype",
            "f32",
        ])
        .unwrap();
        let cfg = off.config_with(model, StepDefaults::MAXTEXT, None).unwrap();
        assert_eq!((cfg.dtype, cfg.load_balance), (DType::F32, false));
        let on = parse(&[
            "--context-parallel-strategy",
            "ring",
            "--context-parallel-load-balance",
        ])
        .unwrap();
        assert!(on.config(model).unwrap().load_balance);
    }

    /// A TPU compile splits the weights over the context axis where the batch axis is one
    /// device (MaxText's `embed` rule), not on a data-parallel one; the example replicates
    /// them unless asked; `=false` turns it off.
    #[test]
    fn weights_over_context_by_default_only_for_a_tpu_compile_without_data_parallelism() {
        let model = ModelConfig::tiny();
        let sharded = |args: &[&str], defaults| {
            let cfg = parse(args)
                .unwrap()
                .config_with(model, defaults, None)
                .unwrap();
            (cfg.shard_weights_over_context, cfg.shards_weights())
        };
        assert_eq!(sharded(&[], StepDefaults::MAXTEXT), (true, true));
        assert_eq!(sharded(&[], StepDefaults::EXAMPLE), (false, false));
        let data = [
            "--ici-data-parallelism",
            "2",
            "--ici-context-parallelism",
            "2",
        ];
        assert_eq!(sharded(&data, StepDefaults::MAXTEXT), (false, false));
        let fsdp = [
            "--ici-fsdp-parallelism",
            "2",
            "--ici-context-parallelism",
            "2",
        ];
        assert_eq!(sharded(&fsdp, StepDefaults::EXAMPLE), (false, true));
        let asked = ["--shard-weights-over-context"];
        assert_eq!(sharded(&asked, StepDefaults::EXAMPLE), (true, true));
        let off = ["--shard-weights-over-context=false"];
        assert_eq!(sharded(&off, StepDefaults::MAXTEXT), (false, false));
    }

    /// `--remat-policy` takes `full` (MaxText's default, and ours) and `save_attention`.
    #[test]
    fn remat_policy_flag() {
        let model = ModelConfig::tiny();
        let policy = |args: &[&str]| parse(args).unwrap().config(model).unwrap().remat_policy;
        assert_eq!(policy(&[]), RematPolicy::Full);
        assert_eq!(policy(&["--remat-policy", "full"]), RematPolicy::Full);
        let saved = policy(&["--remat-policy", "save_attention"]);
        assert_eq!(saved, RematPolicy::SaveAttention);
        assert_eq!(saved.name(), "save_attention");
        assert!(parse(&["--remat-policy", "minimal"]).is_err());
    }

    /// `--sa-use-fused-bwd-kernel` (or `=true`) picks splash's fused backward, `=false` the
    /// separate kernels; without the flag the train example takes the fused one, a TPU
    /// compile MaxText's separate ones.
    #[test]
    fn fused_backward_flag() {
        let model = ModelConfig::tiny();
        let fused = |args: &[&str], defaults| {
            let cfg = parse(args)
                .unwrap()
                .config_with(model, defaults, None)
                .unwrap();
            assert_eq!(
                cfg.block_sizes().use_fused_bwd_kernel,
                cfg.sa_use_fused_bwd_kernel
            );
            cfg.sa_use_fused_bwd_kernel
        };
        for defaults in [StepDefaults::EXAMPLE, StepDefaults::MAXTEXT] {
            assert!(fused(&["--sa-use-fused-bwd-kernel"], defaults));
            assert!(fused(&["--sa-use-fused-bwd-kernel=true"], defaults));
            assert!(!fused(&["--sa-use-fused-bwd-kernel=false"], defaults));
        }
        assert!(fused(&[], StepDefaults::EXAMPLE));
        assert!(!fused(&[], StepDefaults::MAXTEXT));
        assert!(parse(&["--sa-use-fused-bwd-kernel=yes"]).is_err());
    }

    /// `--remat-last-layer` (or `=true`) re-runs the last layer in the backward, `=false`
    /// does not; without the flag the train example does not, a TPU compile does
    /// (MaxText's scanned layers).
    #[test]
    fn remat_last_layer_flag() {
        let model = ModelConfig::tiny();
        let remat = |args: &[&str], defaults| {
            parse(args)
                .unwrap()
                .config_with(model, defaults, None)
                .unwrap()
                .remat_last_layer
        };
        for defaults in [StepDefaults::EXAMPLE, StepDefaults::MAXTEXT] {
            assert!(remat(&["--remat-last-layer"], defaults));
            assert!(remat(&["--remat-last-layer=true"], defaults));
            assert!(!remat(&["--remat-last-layer=false"], defaults));
        }
        assert!(!remat(&[], StepDefaults::EXAMPLE));
        assert!(remat(&[], StepDefaults::MAXTEXT));
        assert!(parse(&["--remat-last-layer=no"]).is_err());
    }

    /// `auto` blocks are asked of the search once; explicit blocks keep their values; without
    /// a search `auto` keeps splash's default rule.
    #[test]
    fn auto_blocks_ask_the_search() {
        let flags = parse(&[
            "--sa-block-q",
            "auto",
            "--sa-block-kv",
            "auto",
            "--sa-block-q-dkv",
            "64",
        ])
        .unwrap();
        assert_eq!(flags.sa_block_q, Some(BlockFlag::Auto));
        assert!(flags.has_auto_blocks());
        let mut asked = 0;
        let mut search = |_: &TrainConfig| {
            asked += 1;
            Ok([32, 16, 8, 4])
        };
        let cfg = flags
            .config_with(
                ModelConfig::tiny(),
                StepDefaults::MAXTEXT,
                Some(&mut search),
            )
            .unwrap();
        assert_eq!(asked, 1);
        let default = parse(&[]).unwrap().config(ModelConfig::tiny()).unwrap();
        assert_eq!(
            [
                cfg.sa_block_q,
                cfg.sa_block_kv,
                cfg.sa_block_q_dkv,
                cfg.sa_block_kv_dkv
            ],
            [32, 16, 64, default.sa_block_kv_dkv]
        );
        let without = flags.config(ModelConfig::tiny()).unwrap();
        assert_eq!(without.sa_block_q, default.sa_block_q);
        let e = parse(&["--sa-block-q", "big"]).unwrap_err();
        assert!(
            e.contains("`big` is not a block size; use a number of rows, or auto"),
            "{e}"
        );
        let mut failing = |_: &TrainConfig| Err("no candidate".to_string());
        let e = flags
            .config_with(
                ModelConfig::tiny(),
                StepDefaults::MAXTEXT,
                Some(&mut failing),
            )
            .unwrap_err();
        assert_eq!(e, "no candidate");
    }

    /// The data flags: synthetic by default (text flags refused without `hf`), `hf` needs a
    /// path, packs by default, and takes the column as `--train-data-columns` or
    /// `--text-field`.
    #[test]
    fn data_flags_say_what_text_to_read() {
        #[derive(Parser, Debug)]
        struct DataCli {
            #[command(flatten)]
            data: super::DataFlags,
        }
        let parse = |args: &[&str]| {
            let mut all = vec!["tessera"];
            all.extend_from_slice(args);
            DataCli::try_parse_from(all).unwrap().data
        };
        let model = ModelConfig::tiny();
        assert_eq!(parse(&[]).text_options(&model, 64).unwrap(), None);
        let e = parse(&["--packing=false"])
            .text_options(&model, 64)
            .unwrap_err();
        assert!(e.starts_with("--packing is for text"), "{e}");
        let e = parse(&["--dataset-type", "hf"])
            .text_options(&model, 64)
            .unwrap_err();
        assert!(e.contains("name them with --dataset-path"), "{e}");
        let opts = parse(&[
            "--dataset-type",
            "hf",
            "--dataset-path",
            "d",
            "--text-field",
            "body",
        ])
        .text_options(&model, 64)
        .unwrap()
        .unwrap();
        assert_eq!(
            (opts.column.as_str(), opts.packing, opts.vocab, opts.seq),
            ("body", true, model.vocab, 64)
        );
        let opts = parse(&[
            "--dataset-type",
            "hf",
            "--dataset-path",
            "d",
            "--packing=false",
        ])
        .text_options(&model, 64)
        .unwrap()
        .unwrap();
        assert!(!opts.packing);
    }

    /// A valid configuration: 4 heads of 8 (2 KV heads), 64 tokens on 4 context devices,
    /// blocks 16.
    fn micro() -> TrainConfig {
        let model = ModelConfig {
            vocab: 32,
            d_model: 32,
            layers: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            mlp_dim: 64,
            rope_theta: 10_000.0,
            norm_eps: 1e-6,
        };
        let mut cfg = TrainConfig::new(model);
        cfg.max_target_length = 64;
        cfg.sa_block_q = 16;
        cfg.sa_block_kv = 16;
        cfg.sa_block_q_dkv = 16;
        cfg.sa_block_kv_dkv = 16;
        cfg
    }

    /// Every error a bad combination gets names the flags that set it (the library's own
    /// words are checked in train/tests/train.rs).
    #[test]
    fn bad_combinations_name_the_flags() {
        type Change = Box<dyn Fn(&mut TrainConfig)>;
        let cases: Vec<(Change, &str)> = vec![
            (
                Box::new(|c| c.ici_context_parallelism = 8),
                "ulysses: the 4 query heads (--heads) are not divisible by the Ulysses degree 8; \
                 use a --ici-context-parallelism that divides them",
            ),
            (
                Box::new(|c| c.max_target_length = 72),
                "ulysses: --sa-block-q 16 does not divide the 72 queries each attention call \
                 holds (--max-target-length 72); use a --sa-block-q that divides 72, or a \
                 --max-target-length that is a multiple of 16",
            ),
            (
                Box::new(|c| {
                    c.strategy = tessera::parallel::strategy::AllGather.into();
                    c.max_target_length = 72;
                }),
                "all_gather: --sa-block-q 16 does not divide the 18 queries each attention \
                 call holds (--max-target-length 72 / 4 sequence shards); use a --sa-block-q \
                 that divides 18, or a --max-target-length that is a multiple of 64",
            ),
            (
                Box::new(|c| c.max_target_length = 66),
                "--max-target-length 66 is not divisible by the 4 sequence shards \
                 (--ici-context-parallelism 4); use a multiple of 4",
            ),
            (
                Box::new(|c| c.load_balance = true),
                "--context-parallel-load-balance balances the all_gather and ring strategies, \
                 not ulysses",
            ),
            (
                Box::new(|c| {
                    c.strategy = Usp {
                        ulysses: 2,
                        ring: 4,
                    }
                    .into()
                }),
                "usp:2x4 runs on 8 devices (the product of its degrees), but \
                 --ici-context-parallelism is 4; set it to 8",
            ),
            (
                Box::new(|c| c.model.kv_heads = 3),
                "the 4 query heads (--heads) are not a multiple of the 3 KV heads (--kv-heads)",
            ),
            (
                Box::new(|c| c.ici_fsdp_parallelism = 3),
                "--ici-fsdp-parallelism 3 shards the parameters' --d-model dim (32) over 3 \
                 devices, which does not divide it; use an fsdp degree that divides 32, or \
                 --ici-data-parallelism 3",
            ),
            (
                Box::new(|c| {
                    c.ici_fsdp_parallelism = 2;
                    c.ici_context_parallelism = 2;
                    c.model.vocab = 33;
                }),
                "--ici-fsdp-parallelism 2 also shards the parameters' --vocab dim (33) over \
                 the 2 context devices (--ici-context-parallelism 2)",
            ),
            (
                Box::new(|c| {
                    c.ici_fsdp_parallelism = 2;
                    c.ici_data_parallelism = 2;
                }),
                "--ici-data-parallelism 2 and --ici-fsdp-parallelism 2 both split the batch",
            ),
            (
                Box::new(|c| c.collective_matmul = true),
                "--collective-matmul replaces the matmuls of fsdp's all-gathered weights, but \
                 --ici-fsdp-parallelism is 1; leave it out, or shard the weights \
                 (--ici-fsdp-parallelism above 1)",
            ),
            (
                Box::new(|c| c.sa_block_kv_dkv = 0),
                "--sa-block-kv-dkv is 0; it must be at least 1",
            ),
            (
                Box::new(|c| {
                    c.steps = 3;
                    c.warmup_steps = 100;
                }),
                "--warmup-steps 100 is longer than the run (--steps 3): the learning rate \
                 would never reach its peak, and the cosine after it would have no steps; use \
                 --warmup-steps 3 or less, or more --steps",
            ),
        ];
        for (change, expected) in cases {
            let mut cfg = micro();
            change(&mut cfg);
            let err = flag_error(&cfg.validate().unwrap_err());
            assert!(err.contains(expected), "{err}\n  expected: {expected}");
            assert!(!err.contains('\n'), "one sentence: {err}");
        }
    }
}
