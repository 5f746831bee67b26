//! The context-parallel strategies, one unit each, and their list.
//!
//! A strategy is a type implementing [`ContextStrategy`]. It owns its rules: its degrees
//! (the Ulysses degree, the sizes of the mesh axes it uses), the queries and keys each kernel
//! call of a device holds, where every kernel call's queries and keys start on every device
//! (zigzag load balancing included), how its devices exchange keys and values
//! ([`Exchange`]), and its one composition of collectives around the typed splash ops
//! ([`Composition`]), on any program of a [`ModelMesh`](crate::ModelMesh)
//! (`data x context x ring`). Everything else asks it: [`ContextParallel`](crate::ContextParallel)
//! (validation, stats, the standalone programs), [`AttentionLayer`](crate::AttentionLayer)
//! (the model's layer), `tessera-train` (its validation and step-time model) and the CLI
//! (its help, demo and bench read [`Strategy::listed`]). The rules every strategy shares
//! (KV head replication, load balancing's chunk order, block sizes that divide the local
//! lengths) are written once in [`ContextParallel`](crate::ContextParallel); the contract
//! itself lives beside it (`context/config/contract.rs`), since the two name each other.
//!
//! Adding a strategy: a new file in this folder with a type implementing [`ContextStrategy`]
//! and a `LISTING`, and its entry in the `strategies!` list below (beside its `mod` line).

use std::sync::Arc;

use super::error::{or_list, ConfigError};

pub use super::config::contract::{
    Composition, ContextStrategy, Exchange, Fixed, KernelCalls, Listing, Shards, Strategy,
};

mod all_gather;
mod ring;
mod ulysses;
mod ulysses_fused;
mod usp;

/// Lists the strategies: re-exports each type and puts its [`Listing`] in [`LISTED`], the
/// order in which [`Strategy::parse`] tries them and messages name them.
macro_rules! strategies {
    ($($module:ident :: $ty:ident),* $(,)?) => {
        $(pub use $module::$ty;)*
        const LISTED: &[Listing] = &[$($module::LISTING),*];
    };
}

strategies!(
    ulysses::Ulysses,
    ulysses_fused::UlyssesFused,
    all_gather::AllGather,
    ring::Ring,
    usp::Usp,
);

impl Strategy {
    /// Parses a strategy as the CLI writes it: `ulysses`, `ulysses_fused`, `all-gather` (or
    /// MaxText's `all_gather`), `ring`, `usp:UxR`, or `usp` alone (the most square split of
    /// `devices`).
    pub fn parse(text: &str, devices: usize) -> Result<Strategy, ConfigError> {
        LISTED
            .iter()
            .find_map(|l| (l.parse)(text, devices))
            .unwrap_or_else(|| {
                Err(ConfigError::UnknownStrategy {
                    text: text.to_string(),
                    expected: LISTED.iter().map(|l| l.spellings).collect(),
                })
            })
    }

    /// Every listed strategy, in list order, as its base spelling parses on `devices`
    /// context devices (`usp`: the most square split of them).
    pub fn listed(devices: usize) -> Vec<Strategy> {
        LISTED
            .iter()
            .filter_map(|l| (l.parse)(l.name, devices)?.ok())
            .collect()
    }

    /// The base spellings of the listed strategies, in list order (`ulysses`, `all-gather`,
    /// ...): what a command line's default lists are made of.
    pub fn names() -> Vec<&'static str> {
        LISTED.iter().map(|l| l.name).collect()
    }

    /// Every spelling of the listed strategies for help and messages: `ulysses, all-gather
    /// (all_gather), ring or usp (usp:UxR: ...)`.
    pub fn spellings() -> String {
        let all: Vec<&str> = LISTED.iter().map(|l| l.spellings).collect();
        or_list(&all)
    }

    /// The listed strategies that balance causal load, as their base spelling parses.
    pub fn load_balancing(devices: usize) -> Vec<Strategy> {
        Strategy::listed(devices)
            .into_iter()
            .filter(|s| s.load_balances())
            .collect()
    }
}

/// Every strategy value is one of the list's.
impl<T: ContextStrategy> From<T> for Strategy {
    fn from(s: T) -> Self {
        Strategy::new(Arc::new(s), LISTED)
    }
}
