//! Context-parallel splash attention: the sequence sharded over the devices of a `context`
//! mesh axis, forward and backward, with MaxText's strategies
//! (`context_parallel_strategy = ulysses | all_gather | ring`) and the Ulysses x ring hybrid.
//!
//! Every strategy takes the global `q [B, H, S, D]`, `k`, `v [B, KVH, S, D]` sequence-sharded
//! (device `r` holds positions `r S/U .. (r + 1) S/U`, in zigzag chunks with load balancing)
//! and returns `out` and `lse` sharded the same way; the forward + backward program also
//! takes `dout` and returns `dq, dk, dv` beside `out` and `lse`.
//!
//! - [`Ulysses`](strategy::Ulysses) (DeepSpeed-Ulysses): an all-to-all re-shards q, k, v from
//!   sequence to heads, every device attends `H/U` heads over the whole sequence, the
//!   inverse all-to-all brings the output back. K/V per device: `1/U` of the heads.
//! - [`AllGather`](strategy::AllGather): K and V are all-gathered along the sequence; every
//!   device attends its query shard against every key at its causal offset. The backward
//!   reduce-scatters dK/dV (the all-gather's transpose).
//! - [`Ring`](strategy::Ring): K/V shards travel around the ring (collective permutes);
//!   every step attends the local queries to the shard in hand and merges by logsumexp. The
//!   backward is a second ring: K/V go around again with their dK/dV accumulators.
//! - [`Usp`](strategy::Usp): Ulysses over the context axis, ring over a ring axis.
//!
//! The files, one job each:
//!
//! - [`strategy`]: the strategies, one unit (one file) each, and the list `Strategy::parse`
//!   reads: every rule of a strategy and its one composition of collectives and splash calls;
//! - `config`: [`ContextParallel`], its validation and the rules every strategy shares
//!   (KV head replication, local dims, load balancing's chunk order);
//! - `error`: [`CpError`] and [`ConfigError`], with the quantities at fault as fields, and
//!   [`Names`], how a command line names them;
//! - `stats`: [`CpStats`];
//! - `program`: the standalone programs, their compilation and the host-side permutations;
//! - [`layer`]: [`AttentionLayer`](layer::AttentionLayer), the strategy inside a model's program;
//! - `layout`: [`ModelMesh`], the mesh every strategy composes on, and its layouts;
//! - [`local_splash`]: the typed splash calls per device, whose signatures state what each
//!   device must hold;
//! - `spmd`: the glue emitted around the kernels inside a program.
//!
//! The programs are SPMD StableHLO built with the typed collectives (the sharding of every
//! tensor is in its type) with the splash kernels inlined (or, for TPU, as Mosaic custom
//! calls); devices whose blocks differ (the all-gather and ring strategies) share one kernel
//! through [`ShardedSplash`](tessera_splash::ShardedSplash), which selects each device's block
//! tables by its mesh coordinate. They run on the devices of any
//! [`Platform`](tessera_runtime::Platform) (the CPU plugin's virtual devices here).
//!
//! Each forward + backward program is the forward and its reverse-mode gradient
//! ([`Spmd::vjp`](tessera_collectives::Spmd::vjp)) in one program, as a training step runs
//! them: every splash call is a custom-VJP unit whose rule runs splash's backward kernels
//! ([`tessera_splash::lower_forward_on_shard`]) on the forward's residuals, every collective
//! is differentiated by its transpose, and the local glue (re-layouts) by tessera-hlo's op
//! rules. A ring (ring, USP's ring axis) is one custom-VJP unit whose rule is the backward
//! ring ([`local_splash::RingAttention::forward`]).

mod config;
mod error;
pub mod layer;
mod layout;
pub mod local_splash;
mod program;
mod spmd;
mod stats;
pub mod strategy;

pub use config::{chunk_of, ContextParallel};
pub use error::{
    Block, ConfigError, CpError, LibraryNames, Names, Quantity, StrategyName, Term, TermKind,
};
pub use layout::{
    kernel_devices, ContextMesh, ModelMesh, Pieces, PiecesLse, RingAxis, Seq, SeqLse, SeqLseTensor,
    SeqTensor, TokenLayout, WholeSegments,
};
pub use program::{CpExecutable, CpForwardBackward, CpInputs, CpProgram};
pub use stats::{CollectiveStat, CpStats};
pub use strategy::Strategy;
