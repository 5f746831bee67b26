//! The contract of a strategy ([`ContextStrategy`], [`Composition`]), the [`Strategy`] a
//! [`ContextParallel`] holds, and the facts a strategy states ([`Exchange`], [`Shards`],
//! [`KernelCalls`], its [`Listing`]). The configuration and the contract name each other (a
//! configuration holds a strategy, a strategy composes for a configuration), so they live in
//! one module; the strategies themselves and their list are in `strategy/`, above.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::rc::Rc;
use std::sync::Arc;

use tessera_collectives::{CollectiveError, Spmd};
use tessera_splash::SeqOffsets;

use super::ContextParallel;
use crate::context::error::{ConfigError, CpError, StrategyName};
use crate::context::layout::{ModelMesh, SeqLseTensor, SeqTensor, WholeSegments};

/// How [`Strategy::parse`] finds a strategy.
#[derive(Debug, Clone, Copy)]
pub struct Listing {
    /// Its base spelling, which parses without degrees (`all-gather`, `usp`).
    pub name: &'static str,
    /// Its spellings for messages, e.g. `all-gather (all_gather)`, `usp (usp:UxR: ...)`.
    pub spellings: &'static str,
    /// Parses `text` if it names this strategy (`devices`: the context devices, for forms
    /// that derive their degrees from them); `None` if it names another.
    pub parse: fn(text: &str, devices: usize) -> Option<Result<Strategy, ConfigError>>,
}

impl Listing {
    /// The listing of a strategy without degrees of its own, spelled as
    /// [`Fixed::SPELLINGS`] says (`spellings`: how messages list them).
    pub const fn fixed<T: Fixed>(spellings: &'static str) -> Listing {
        Listing {
            name: T::SPELLINGS[0],
            spellings,
            parse: parse_fixed::<T>,
        }
    }
}

/// A strategy without degrees of its own: one value, whatever the devices.
pub trait Fixed: ContextStrategy + Default {
    /// The texts that name it, its name first (`all-gather`, `all_gather`).
    const SPELLINGS: &'static [&'static str];
}

fn parse_fixed<T: Fixed>(text: &str, _devices: usize) -> Option<Result<Strategy, ConfigError>> {
    T::SPELLINGS
        .contains(&text)
        .then(|| Ok(T::default().into()))
}

/// How a strategy's devices come to hold the keys and values they attend, per layer: what
/// the step-time model (`tessera-train`'s `predict_step`) prices, asked of the strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// All-to-alls over the context devices re-shard q, k, v (and the output back) between
    /// the sequence and the heads: each device attends its heads over the whole sequence.
    Heads,
    /// As [`Exchange::Heads`], but inside the attention kernels: each head's rows arrive by
    /// remote copies while the head before is attended, and each finished chunk of the
    /// output (of the gradients) goes back while the next is computed. Q, K and V move for
    /// every query head (GQA's KV heads repeated).
    HeadsInKernel,
    /// K and V all-gathered over the context devices (dK and dV reduce-scattered in the
    /// backward): each device attends its queries against every key.
    AllKeys,
    /// K/V shards passed round a ring of `ring` devices (collective permutes), each device
    /// attending its queries to the shard in hand, after all-to-alls between sequence and
    /// heads over `ulysses` devices (1: none).
    Ring { ulysses: usize, ring: usize },
}

/// How a sequence of `seq` positions is cut over the context devices: `devices` shards,
/// each of `parts` chunks attended separately (2 with load balancing, else 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shards {
    pub seq: usize,
    pub devices: usize,
    pub parts: usize,
}

impl Shards {
    /// `seq` positions over `devices` devices, each shard two chunks with load balancing.
    pub fn of(seq: usize, devices: usize, load_balance: bool) -> Self {
        Shards {
            seq,
            devices,
            parts: if load_balance { 2 } else { 1 },
        }
    }

    /// The length of one chunk when the sequence is cut into `shards x parts` chunks.
    pub fn chunk(&self, shards: usize) -> usize {
        self.seq / (shards.max(1) * self.parts.max(1))
    }
}

/// The forward kernel calls of a strategy: `steps[t][call][shard]` is where the queries and
/// keys of call `call` of step `t` start on shard `shard` (a position on the axis whose
/// devices hold different blocks; one shard when all devices run the same call). Devices
/// run the calls of a step independently and meet between steps (a ring's permutes).
pub type KernelCalls = Vec<Vec<Vec<SeqOffsets>>>;

/// One context-parallel strategy: its rules and its composition.
pub trait ContextStrategy: fmt::Debug + Send + Sync + 'static {
    /// The strategy as the CLI writes it (`ulysses`, `all-gather`, `ring`, `usp:2x2`); its
    /// `Display`.
    fn name(&self) -> String;

    /// As MaxText's `context_parallel_strategy` writes it (`all_gather`).
    fn maxtext_name(&self) -> String {
        self.name()
    }

    /// The sizes of [`ModelMesh`]'s `context` and `ring` axes on `devices` context devices.
    fn mesh_axes(&self, devices: usize) -> [usize; 2] {
        [devices, 1]
    }

    /// The context devices the strategy's own degrees fix (USP's `U x R`), if any.
    fn fixed_devices(&self) -> Option<usize> {
        None
    }

    /// The ways an all-to-all splits the heads over the devices (the Ulysses degree; 1:
    /// the heads stay whole).
    fn ulysses_degree(&self, _devices: usize) -> usize {
        1
    }

    /// Whether its kernels take one KV head per query head (GQA's KV heads repeated before
    /// the exchange).
    fn repeats_kv_heads(&self) -> bool {
        false
    }

    /// Whether causal load balancing (each shard two zigzag chunks) applies.
    fn load_balances(&self) -> bool {
        false
    }

    /// The queries and keys (per head) each kernel call of a device holds.
    fn local_lengths(&self, shards: Shards) -> (usize, usize);

    /// The queries and keys (per head) its splash blocks must divide: what a kernel call
    /// holds, unless its kernels take blocks of something smaller.
    fn block_lengths(&self, shards: Shards) -> (usize, usize) {
        self.local_lengths(shards)
    }

    /// Every forward kernel call and where its queries and keys start on every shard.
    fn kernel_calls(&self, shards: Shards) -> KernelCalls;

    /// How its devices exchange keys and values on `devices` context devices.
    fn exchange(&self, devices: usize) -> Exchange;

    /// What its kernels cannot do with `cp` beyond the rules every strategy shares (a mask,
    /// a soft cap, block sizes), refused by [`ContextParallel::check`] before anything is
    /// built.
    fn check(&self, _cp: &ContextParallel) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Builds the kernels of the (validated) configuration `cp`, composed with the
    /// strategy's collectives.
    fn compose(&self, cp: &ContextParallel) -> Result<Rc<dyn Composition>, CpError>;
}

/// A strategy's kernels built for one configuration, and its collectives around them.
pub trait Composition: fmt::Debug {
    /// The attention of every device's local `q [b, H, s, D]`, `k`, `v [b, KVH, s, D]` (`b`
    /// the batch of a data shard, `s` the positions of the device's block of the sequence in
    /// the order [`ContextParallel::sequence_order`] gives): `out [b, H, s, Dv]` in the
    /// configuration's dtype and `lse [b, H, s]` (f32). `segment_ids`: the whole `[b, S]` on
    /// every device, in natural order.
    fn attend<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        qkv: [&SeqTensor<'p>; 3],
        segment_ids: Option<&WholeSegments<'p>>,
    ) -> Result<(SeqTensor<'p>, SeqLseTensor<'p>), CollectiveError>;
}

/// A context-parallel strategy: [`Ulysses`](crate::strategy::Ulysses),
/// [`AllGather`](crate::strategy::AllGather), [`Ring`](crate::strategy::Ring),
/// [`Usp`](crate::strategy::Usp) or any other [`ContextStrategy`] (`Strategy::from(Ring)`,
/// `Ring.into()`), with the list it was chosen from (what messages offer in its place). Equal
/// when their names are.
#[derive(Clone)]
pub struct Strategy {
    unit: Arc<dyn ContextStrategy>,
    listed: &'static [Listing],
}

impl Strategy {
    /// `unit` as one of the `listed` strategies (`strategy`'s list builds every `Strategy`).
    pub(crate) fn new(unit: Arc<dyn ContextStrategy>, listed: &'static [Listing]) -> Self {
        Strategy { unit, listed }
    }

    /// How messages name it.
    pub fn label(&self) -> StrategyName {
        StrategyName {
            name: self.name(),
            maxtext: self.maxtext_name(),
        }
    }

    /// The strategies of its list that balance causal load, as their base spelling parses on
    /// `devices` devices.
    pub(crate) fn balancing_peers(&self, devices: usize) -> Vec<Strategy> {
        self.listed
            .iter()
            .filter_map(|l| (l.parse)(l.name, devices)?.ok())
            .filter(|s| s.load_balances())
            .collect()
    }
}

impl Deref for Strategy {
    type Target = dyn ContextStrategy;

    fn deref(&self) -> &Self::Target {
        self.unit.as_ref()
    }
}

impl fmt::Debug for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.unit.fmt(f)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl PartialEq for Strategy {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Strategy {}

impl Hash for Strategy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state)
    }
}
