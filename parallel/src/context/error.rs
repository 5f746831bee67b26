//! Why a context-parallel configuration or call cannot run.
//!
//! A [`ConfigError`] carries its quantities as fields (which dim, which degree, what divides
//! what) and is written in the library's words: `block_q = 128`, `the context degree 4`, `the
//! 6 query heads`. A command line renders the same error with its own flags through
//! [`Names`] ([`ConfigError::describe`]), e.g. `--sa-block-q 128` or `the 6 query heads
//! (--heads)`.

use std::fmt;

use tessera_collectives::CollectiveError;
use tessera_splash::SplashError;

/// How messages name a strategy: the configuration's strategy as the CLI writes it (`name`,
/// its `Display`) and as MaxText writes it (`maxtext`), e.g. `all-gather` / `all_gather`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StrategyName {
    pub name: String,
    pub maxtext: String,
}

impl fmt::Display for StrategyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// One block size of [`BlockSizes`](tessera_splash::BlockSizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Block {
    Q,
    Kv,
    QDkv,
    KvDkv,
    QDq,
    KvDq,
}

impl Block {
    /// Whether the block tiles the queries (else the keys).
    pub fn is_query(self) -> bool {
        matches!(self, Block::Q | Block::QDkv | Block::QDq)
    }

    /// Its field name in `BlockSizes`.
    pub fn key(self) -> &'static str {
        match self {
            Block::Q => "block_q",
            Block::Kv => "block_kv",
            Block::QDkv => "block_q_dkv",
            Block::KvDkv => "block_kv_dkv",
            Block::QDq => "block_q_dq",
            Block::KvDq => "block_kv_dq",
        }
    }
}

/// A quantity of a context-parallel configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantity {
    /// `Dims::batch`.
    Batch,
    /// `Dims::heads`: query heads.
    Heads,
    /// `Dims::kv_heads`.
    KvHeads,
    /// `Dims::q_len`: the sequence length.
    SeqLen,
    /// `Dims::kv_len`.
    KvLen,
    /// `Dims::head_dim`.
    HeadDim,
    /// `Dims::head_dim_v`.
    HeadDimV,
    /// `ContextParallel::devices`: devices on the context axis.
    ContextDegree,
    /// The data shards of an [`AttentionLayer`](crate::AttentionLayer).
    DataDegree,
    /// A block size.
    Block(Block),
    /// `ContextParallel::strategy`.
    Strategy,
    /// `ContextParallel::load_balance`.
    LoadBalance,
}

impl Quantity {
    /// How messages name it.
    pub fn term(self) -> Term {
        let (key, words, kind) = match self {
            Quantity::Batch => ("batch", "batch", TermKind::Setting),
            Quantity::Heads => ("heads", "query heads", TermKind::Count),
            Quantity::KvHeads => ("kv_heads", "KV heads", TermKind::Count),
            Quantity::SeqLen => ("seq_len", "sequence length", TermKind::Named),
            Quantity::KvLen => ("kv_len", "kv_len", TermKind::Setting),
            Quantity::HeadDim => ("head_dim", "head_dim", TermKind::Setting),
            Quantity::HeadDimV => ("head_dim_v", "head_dim_v", TermKind::Setting),
            Quantity::ContextDegree => ("context", "context degree", TermKind::Named),
            Quantity::DataDegree => ("data", "data degree", TermKind::Named),
            Quantity::Block(b) => (b.key(), b.key(), TermKind::Setting),
            Quantity::Strategy => ("strategy", "strategy", TermKind::Named),
            Quantity::LoadBalance => (
                "load_balance",
                "load balancing (load_balance)",
                TermKind::Named,
            ),
        };
        Term { key, words, kind }
    }
}

/// How a term reads with its value in the library's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermKind {
    /// A count of things: `the 6 query heads`.
    Count,
    /// A setting known by its field name: `block_q = 128`.
    Setting,
    /// A setting known by its words: `the context degree 4`.
    Named,
}

/// How messages name one quantity: its `key` (what [`Names`] maps to a flag) and the
/// library's words for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    /// The key a command line maps to its flag, e.g. `block_q`, `context`, `seq_len`.
    pub key: &'static str,
    /// The library's words: `query heads`, `block_q`, `context degree`.
    pub words: &'static str,
    pub kind: TermKind,
}

impl Term {
    /// The term with its value: `block_q = 128` / `--sa-block-q 128`, `the context degree 4` /
    /// `--devices 4`, `the 6 query heads` / `the 6 query heads (--heads)`.
    pub fn value(&self, names: &dyn Names, value: impl fmt::Display) -> String {
        match (names.flag(self.key), self.kind) {
            (Some(flag), TermKind::Count) => format!("the {value} {} ({flag})", self.words),
            (Some(flag), _) => format!("{flag} {value}"),
            (None, TermKind::Count) => format!("the {value} {}", self.words),
            (None, TermKind::Setting) => format!("{} = {value}", self.words),
            (None, TermKind::Named) => format!("the {} {value}", self.words),
        }
    }

    /// The term alone: `block_q` / `--sa-block-q`, `context degree` / `--devices`.
    pub fn name(&self, names: &dyn Names) -> String {
        names
            .flag(self.key)
            .map_or_else(|| self.words.to_string(), str::to_string)
    }

    /// `the context degree is 8` / `--ici-context-parallelism is 8`, `the number of query
    /// heads is 8`.
    pub fn is(&self, names: &dyn Names, value: impl fmt::Display) -> String {
        match (names.flag(self.key), self.kind) {
            (Some(flag), _) => format!("{flag} is {value}"),
            (None, TermKind::Count) => format!("the number of {} is {value}", self.words),
            (None, TermKind::Setting) => format!("{} is {value}", self.words),
            (None, _) => format!("the {} is {value}", self.words),
        }
    }
}

/// How a reader knows the quantities of a message: by default the library's words; a command
/// line maps each [`Term::key`] to its flag (`block_q` to `--block-q` or `--sa-block-q`).
pub trait Names {
    /// The flag that sets the quantity `key`, if the reader has one.
    fn flag(&self, key: &str) -> Option<&str>;

    /// How the reader spells a strategy (`all-gather`, or MaxText's `all_gather`).
    fn strategy(&self, strategy: &StrategyName) -> String {
        strategy.name.clone()
    }
}

/// The library's own words for every quantity.
#[derive(Debug, Clone, Copy, Default)]
pub struct LibraryNames;

impl Names for LibraryNames {
    fn flag(&self, _key: &str) -> Option<&str> {
        None
    }
}

/// A context-parallel configuration that cannot run, with the quantities at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A size or degree is 0.
    Zero { quantity: Quantity },
    /// `text` names no strategy; `expected` spells the ones there are.
    UnknownStrategy {
        text: String,
        expected: Vec<&'static str>,
    },
    /// A strategy's degrees are malformed (`usp:2`, `usp:0x4`): `form` is how they are
    /// written (`usp:UxR`), `example` one that parses.
    BadDegrees {
        text: String,
        form: &'static str,
        example: &'static str,
    },
    /// The strategy's own degrees fix the context devices, and they are not `devices`.
    DevicesFixed {
        strategy: StrategyName,
        fixed: usize,
        devices: usize,
    },
    /// Queries and keys of different lengths: context parallelism is self-attention.
    NotSelfAttention {
        strategy: StrategyName,
        q_len: usize,
        kv_len: usize,
    },
    /// Load balancing on a strategy that does not balance; `balanced` are those that do.
    LoadBalanceUnsupported {
        strategy: StrategyName,
        balanced: Vec<StrategyName>,
    },
    /// The sequence does not cut into `devices x parts` equal shards (`parts`: 2 with load
    /// balancing).
    SequenceNotDivisible {
        strategy: StrategyName,
        seq: usize,
        devices: usize,
        parts: usize,
    },
    /// The Ulysses all-to-all splits the query heads `ulysses` ways, which does not divide
    /// them; `context_degree`: whether that degree is the context degree (else a degree of
    /// the strategy's own).
    HeadsNotDivisible {
        strategy: StrategyName,
        heads: usize,
        ulysses: usize,
        context_degree: bool,
    },
    /// The Ulysses degree neither divides the KV heads nor is a multiple of them (so they can
    /// be neither split nor replicated evenly).
    KvHeadsNotDivisible {
        strategy: StrategyName,
        kv_heads: usize,
        ulysses: usize,
    },
    /// A block does not divide the `local` queries or keys each kernel call holds, of a
    /// sequence of `seq`.
    BlockNotDividing {
        strategy: StrategyName,
        block: Block,
        size: usize,
        local: usize,
        seq: usize,
    },
    /// A setting the strategy's own kernels do not take (`what`), and how to run anyway
    /// (`fix`).
    StrategyLimit {
        strategy: StrategyName,
        what: String,
        fix: String,
    },
    /// A typed splash op built from a configuration whose kernel calls hold `holds` queries
    /// and keys (per head), where the op attends `needs`: the configuration of a strategy
    /// that exchanges keys and values another way.
    OpDoesNotFit {
        op: &'static str,
        strategy: StrategyName,
        holds: (usize, usize),
        needs: (usize, usize),
    },
}

impl ConfigError {
    /// The message with the quantities named as `names` names them (a command line's
    /// flags); [`Display`](fmt::Display) uses [`LibraryNames`].
    pub fn describe(&self, names: &dyn Names) -> String {
        let q = |q: Quantity| q.term();
        let s = |s: &StrategyName| names.strategy(s);
        match self {
            ConfigError::Zero { quantity } => {
                format!("{}; it must be at least 1", q(*quantity).is(names, 0))
            }
            ConfigError::UnknownStrategy { text, expected } => format!(
                "unknown strategy `{text}`{}; expected {}",
                names
                    .flag("strategy")
                    .map(|f| format!(" ({f})"))
                    .unwrap_or_default(),
                or_list(expected)
            ),
            ConfigError::BadDegrees {
                text,
                form,
                example,
            } => format!(
                "`{text}`{}: expected {form} with positive degrees, e.g. {example}",
                names
                    .flag("strategy")
                    .map(|f| format!(" ({f})"))
                    .unwrap_or_default(),
            ),
            ConfigError::DevicesFixed {
                strategy,
                fixed,
                devices,
            } => format!(
                "{} runs on {fixed} devices (the product of its degrees), but {}; set it to \
                 {fixed}, or pick degrees that multiply to {devices}",
                s(strategy),
                q(Quantity::ContextDegree).is(names, devices),
            ),
            ConfigError::NotSelfAttention {
                strategy,
                q_len,
                kv_len,
            } => format!(
                "{}: q and kv lengths differ ({q_len} and {kv_len}); context parallelism is \
                 for self-attention",
                s(strategy)
            ),
            ConfigError::LoadBalanceUnsupported { strategy, balanced } => {
                let balanced: Vec<String> = balanced.iter().map(s).collect();
                format!(
                    "{} balances the {} strategies, not {}; leave it off",
                    q(Quantity::LoadBalance).name(names),
                    and_list(&balanced),
                    s(strategy)
                )
            }
            ConfigError::SequenceNotDivisible {
                strategy,
                seq,
                devices,
                parts,
            } => {
                let shards = devices * parts;
                format!(
                    "{}: {} is not divisible by the {shards} sequence shards ({}{}); use a \
                     multiple of {shards}",
                    s(strategy),
                    q(Quantity::SeqLen).value(names, seq),
                    q(Quantity::ContextDegree).value(names, devices),
                    if *parts > 1 {
                        format!(" x {parts} for {}", q(Quantity::LoadBalance).name(names))
                    } else {
                        String::new()
                    }
                )
            }
            ConfigError::HeadsNotDivisible {
                strategy,
                heads,
                ulysses,
                context_degree,
            } => format!(
                "{}: {} are not divisible by the Ulysses degree {ulysses}; use {} that divides \
                 them, or a strategy that does not split the heads",
                s(strategy),
                q(Quantity::Heads).value(names, heads),
                if *context_degree {
                    format!("a {}", q(Quantity::ContextDegree).name(names))
                } else {
                    "a Ulysses degree".to_string()
                }
            ),
            ConfigError::KvHeadsNotDivisible {
                strategy,
                kv_heads,
                ulysses,
            } => format!(
                "{}: the Ulysses degree {ulysses} neither divides {} nor is a multiple of them, \
                 so they can be neither split nor replicated evenly; use a degree that divides \
                 the KV heads or is a multiple of them",
                s(strategy),
                q(Quantity::KvHeads).value(names, kv_heads),
            ),
            ConfigError::BlockNotDividing {
                strategy,
                block,
                size,
                local,
                seq,
            } => {
                let per = seq / local.max(&1);
                let b = q(Quantity::Block(*block));
                format!(
                    "{}: {} does not divide the {local} {} each attention call holds ({}{}); \
                     use a {} that divides {local}, or a {} that is a multiple of {}",
                    s(strategy),
                    b.value(names, size),
                    if block.is_query() { "queries" } else { "keys" },
                    q(Quantity::SeqLen).value(names, seq),
                    if per > 1 {
                        format!(" / {per} sequence shards")
                    } else {
                        String::new()
                    },
                    b.name(names),
                    q(Quantity::SeqLen).name(names),
                    per * size
                )
            }
            ConfigError::StrategyLimit {
                strategy,
                what,
                fix,
            } => {
                format!("{}: {what}; {fix}", s(strategy))
            }
            ConfigError::OpDoesNotFit {
                op,
                strategy,
                holds,
                needs,
            } => format!(
                "{}: the {op} op attends {} queries against {} keys per kernel call, but this \
                 configuration's calls hold {} against {}; build the op its strategy composes \
                 (`ContextStrategy::exchange` says which)",
                s(strategy),
                needs.0,
                needs.1,
                holds.0,
                holds.1
            ),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(&LibraryNames))
    }
}

impl std::error::Error for ConfigError {}

/// `a, b or c`.
pub(crate) fn or_list(items: &[&str]) -> String {
    join_last(items, "or")
}

/// `a, b and c`.
fn and_list(items: &[String]) -> String {
    let items: Vec<&str> = items.iter().map(String::as_str).collect();
    join_last(&items, "and")
}

fn join_last(items: &[&str], last: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., end] => format!("{} {last} {end}", init.join(", ")),
    }
}

/// Why a context-parallel call could not run.
#[derive(Debug, thiserror::Error)]
pub enum CpError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Splash(#[from] SplashError),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    #[error(transparent)]
    Kernel(#[from] tessera_dsl::KernelError),
    /// (The message includes the cause, so it is not also a `source`: a chain printer would
    /// repeat it.)
    #[error("XLA runtime: {0}")]
    Runtime(tessera_runtime::Error),
    /// The platform's devices could not be had (none on this machine, too few, ...).
    #[error(transparent)]
    Devices(tessera_runtime::Error),
    /// A program with Mosaic kernels compiled for a platform that does not run them.
    #[error(
        "the program's kernels ({}) are Mosaic custom calls, which only TPU devices run; \
         build it for {platform} with tessera_parallel::kernel_lowering",
        kernels.join(", ")
    )]
    MosaicOffTpu {
        /// The platform it was compiled for.
        platform: tessera_runtime::Platform,
        /// Its Mosaic kernels.
        kernels: Vec<String>,
    },
    /// A program returned another number of results than it was built with.
    #[error("the {program} program returned {got} results; it was built to return {expected}")]
    Results {
        program: &'static str,
        got: usize,
        expected: usize,
    },
}

impl From<tessera_runtime::Error> for CpError {
    fn from(e: tessera_runtime::Error) -> Self {
        CpError::Runtime(e)
    }
}

impl CpError {
    /// The message with a configuration error's quantities named as `names` names them.
    pub fn describe(&self, names: &dyn Names) -> String {
        match self {
            CpError::Config(e) => e.describe(names),
            other => other.to_string(),
        }
    }
}
