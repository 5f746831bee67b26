//! Typed splash calls per device: the splash kernels one device runs in a context-parallel
//! program, with what each device must hold in their signatures.
//!
//! The collectives re-shard; these ops are where the re-sharded tensors meet the kernel. Each
//! op takes [`DTensor`]s whose sharding types must fit the strategy and returns its results
//! already typed, so a program that skips or swaps a re-sharding does not compile:
//!
//! - [`UlyssesAttention`]: q, k, v with the heads (dim 1) split over the axis and the whole
//!   sequence (dim 2) on every device ([`UlyssesOperand`]); `out` and `lse` come back the
//!   same way ([`ByHeads`]).
//! - [`AllGatherAttention`]: this device's block of queries (dim 2 split over the axis,
//!   [`QueryShard`]) against the whole K/V ([`WholeKeys`]), at the device's offset (its
//!   `axis_index`).
//! - [`RingAttention`]: this device's queries against the K/V shard in hand (dim 2 split over
//!   the ring axis, [`KeyShard`]), one step at that step's offsets or the whole ring; the
//!   partial results ([`RingPartial`]) merge step by step.
//!
//! Every kernel call is a custom-VJP unit whose rule runs splash's backward kernels
//! ([`tessera_splash::lower_forward_on_shard`]), so the backward of a program built from
//! these ops is its gradient, [`Spmd::vjp`](tessera_collectives::Spmd::vjp): e.g. the
//! all-gather op's dK/dV come out as this device's partial sums, which the gather's
//! transpose (a reduce-scatter) adds up. The whole ring ([`RingAttention::forward`]) is one
//! unit, its rule a backward ring.
//!
//! Every op is built from a [`ContextParallel`] configuration whose devices hold what the op
//! attends (it checks the queries and keys each kernel call holds): its mask,
//! dims, block sizes, and the offsets of every kernel call the strategy lists
//! ([`ContextStrategy::kernel_calls`](crate::strategy::ContextStrategy::kernel_calls)); it
//! checks at build time that each operand holds the per-device shape its kernels were built
//! for. Segment ids, when given, are the whole `[B, S]` on every device
//! ([`WholeSegmentIds`]), in natural order.
//!
//! ```
//! use tessera_collectives::axes::Context;
//! use tessera_collectives::{CollectiveError, DTensor, Mesh, Program, Replicated, Split};
//! use tessera_dsl::DType;
//! use tessera_parallel::local_splash::UlyssesAttention;
//! use tessera_parallel::strategy::Ulysses;
//! use tessera_parallel::{ContextMesh, ContextParallel};
//! use tessera_splash::{BlockSizes, Dims, Mask};
//! use tessera_dsl::Lowering;
//!
//! /// `[B, H, S/U, D]`: the sequence split over `context`.
//! type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);
//!
//! let dims = Dims { batch: 1, heads: 4, kv_heads: 4, q_len: 256, kv_len: 256, head_dim: 64,
//!                   head_dim_v: 64 };
//! let cp = ContextParallel {
//!     dims,
//!     dtype: DType::F32,
//!     mask: Mask::causal(),
//!     block_sizes: BlockSizes::uniform(128, 128),
//!     options: Default::default(),
//!     strategy: Ulysses.into(),
//!     devices: 2,
//!     load_balance: false,
//!     lowering: Lowering::portable(),
//! };
//! let attention = UlyssesAttention::<Context>::new(&cp)?;
//! let mesh = Mesh::<ContextMesh>::new([2])?;
//! let program = Program::build("ulysses", &mesh, |p| {
//!     let [q, k, v] = [p.arg::<SeqSharded>([1, 4, 256, 64], DType::F32)?,
//!                      p.arg::<SeqSharded>([1, 4, 256, 64], DType::F32)?,
//!                      p.arg::<SeqSharded>([1, 4, 256, 64], DType::F32)?];
//!     // Sequence to heads: without these, `forward` does not compile.
//!     let q = q.all_to_all::<Context, 1, 2>()?;
//!     let k = k.all_to_all::<Context, 1, 2>()?;
//!     let v = v.all_to_all::<Context, 1, 2>()?;
//!     let (out, lse) = attention.forward(p, &q, &k, &v, None)?;
//!     out.all_to_all::<Context, 2, 1>()?.output::<SeqSharded>()?;
//!     lse.all_to_all::<Context, 2, 1>()?.output::<(Replicated, Replicated, Split<Context>)>()
//! })?;
//! assert_eq!(program.to_mlir().matches("\"stablehlo.all_to_all\"").count(), 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod heads;
mod ring_steps;
mod whole_keys;

use std::collections::HashMap;

use tessera_collectives::{
    CollectiveError, DTensor, LocalValue, MeshShape, Replicated, Split, Varying,
};
use tessera_hlo::{FuncBuilder, Value};
use tessera_splash::{Features, Stage, Tensor};

use super::error::ConfigError;
use super::spmd::Segments;
use super::{ContextParallel, CpError};

pub use heads::UlyssesAttention;
pub use ring_steps::{RingAttention, RingPartial};
pub use whole_keys::AllGatherAttention;

/// The layouts the ops' signatures name (defined with the other layouts, re-exported here
/// beside the ops).
pub use super::layout::{
    ByHeads, ByHeadsLse, BySequence, BySequenceLse, WholeSegmentIds, WholeSequence,
};

/// An operand of [`UlyssesAttention`]: `[B, H, S, D]` (or a logsumexp `[B, H, S]`) with the
/// heads split over `A` and the whole sequence on every device.
#[diagnostic::on_unimplemented(
    message = "Ulysses attention over `{A}` needs the heads (dim 1) split over `{A}` and the \
               whole sequence (dim 2) on every device",
    label = "this operand is not split by heads over `{A}`",
    note = "re-shard from the sequence to the heads first: `all_to_all::<{A}, 1, 2>()` splits \
            dim 1 and gathers dim 2"
)]
pub trait UlyssesOperand<A> {
    /// The batch dim's sharding.
    type Batch;
}

#[diagnostic::do_not_recommend]
impl<A, B> UlyssesOperand<A> for (B, Split<A>, Replicated, Replicated) {
    type Batch = B;
}

#[diagnostic::do_not_recommend]
impl<A, B> UlyssesOperand<A> for (B, Split<A>, Replicated) {
    type Batch = B;
}

/// The query side (q, out, lse, dout) of [`AllGatherAttention`] and [`RingAttention`]:
/// `[B, H, S, D]` (or `[B, H, S]`) with the sequence split over `A`.
#[diagnostic::on_unimplemented(
    message = "context-parallel attention over `{A}` attends this device's block of queries, \
               so q, out, lse and dout need the sequence (dim 2) split over `{A}`",
    label = "dim 2 is not split over `{A}`",
    note = "pass the queries (and their residuals) as the program takes them, split over `{A}`"
)]
pub trait QueryShard<A> {
    /// The batch dim's sharding.
    type Batch;
    /// The heads dim's sharding.
    type Heads;
}

#[diagnostic::do_not_recommend]
impl<A, B, H> QueryShard<A> for (B, H, Split<A>, Replicated) {
    type Batch = B;
    type Heads = H;
}

#[diagnostic::do_not_recommend]
impl<A, B, H> QueryShard<A> for (B, H, Split<A>) {
    type Batch = B;
    type Heads = H;
}

/// K or V of [`AllGatherAttention`]: `[B, H, S, D]` with the whole sequence on every device.
#[diagnostic::on_unimplemented(
    message = "all-gather attention over `{A}` attends to every key, so k and v need the whole \
               sequence (dim 2) on every device",
    label = "dim 2 is split",
    note = "gather the keys and values first: `all_gather::<{A}, 2>()`"
)]
pub trait WholeKeys<A> {
    /// The batch dim's sharding.
    type Batch;
    /// The heads dim's sharding.
    type Heads;
}

#[diagnostic::do_not_recommend]
impl<A, B, H> WholeKeys<A> for (B, H, Replicated, Replicated) {
    type Batch = B;
    type Heads = H;
}

/// K or V of one [`RingAttention`] step: `[B, H, S, D]` with the sequence split over the
/// ring axis `A` (the shard in hand).
#[diagnostic::on_unimplemented(
    message = "ring attention over `{A}` attends to one K/V shard per step, so k and v need \
               the sequence (dim 2) split over `{A}`",
    label = "dim 2 is not split over `{A}`",
    note = "pass the K/V shard each device holds, and rotate it between steps with \
            `ring_shift::<{A}, 2>(1)`"
)]
pub trait KeyShard<A> {
    /// The batch dim's sharding.
    type Batch;
    /// The heads dim's sharding.
    type Heads;
}

#[diagnostic::do_not_recommend]
impl<A, B, H> KeyShard<A> for (B, H, Split<A>, Replicated) {
    type Batch = B;
    type Heads = H;
}

/// A device's position on the axis `A` (from `Spmd::axis_index`): where its block of the
/// sequence starts.
pub type AxisIndex<'p, M, A> = DTensor<'p, M, (), Varying<A>>;

/// The per-device shapes an op's kernels were built for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LocalShapes {
    q: [i64; 4],
    k: [i64; 4],
    v: [i64; 4],
    out: [i64; 4],
    lse: [i64; 3],
}

impl LocalShapes {
    /// The shapes of `cp`'s kernel calls, with `q_parts` query and `kv_parts` key chunks per
    /// device (2 each with load balancing, where a device's shard is two chunks).
    fn of(cp: &ContextParallel, q_parts: usize, kv_parts: usize) -> Self {
        let d = cp.local_dims();
        let i = |x: usize| x as i64;
        let (b, sq, skv) = (i(d.batch), i(d.q_len * q_parts), i(d.kv_len * kv_parts));
        LocalShapes {
            q: [b, i(d.heads), sq, i(d.head_dim)],
            k: [b, i(d.kv_heads), skv, i(d.head_dim)],
            v: [b, i(d.kv_heads), skv, i(d.head_dim_v)],
            out: [b, i(d.heads), sq, i(d.head_dim_v)],
            lse: [b, i(d.heads), sq],
        }
    }
}

impl LocalShapes {
    /// Checks `q`, `k` and `v` (see [`check_local`]).
    fn check_qkv<M: MeshShape, Q, K, V>(
        &self,
        op: &str,
        q: &DTensor<'_, M, Q>,
        k: &DTensor<'_, M, K>,
        v: &DTensor<'_, M, V>,
    ) -> Result<(), CollectiveError> {
        check_local(op, "q", q, &self.q)?;
        self.check_kv(op, k, v)
    }

    /// Checks `k` and `v`.
    fn check_kv<M: MeshShape, K, V>(
        &self,
        op: &str,
        k: &DTensor<'_, M, K>,
        v: &DTensor<'_, M, V>,
    ) -> Result<(), CollectiveError> {
        check_local(op, "k", k, &self.k)?;
        check_local(op, "v", v, &self.v)
    }
}

/// Fails unless each device holds `want` of `x` (what `op`'s kernels were built for).
fn check_local<M: MeshShape, S, V>(
    op: &str,
    name: &str,
    x: &DTensor<'_, M, S, V>,
    want: &[i64],
) -> Result<(), CollectiveError> {
    let got = x.local_type()?.dims;
    if got == want {
        return Ok(());
    }
    Err(CollectiveError::Operand {
        context: format!("{op}: {name}"),
        reason: format!(
            "each device holds {got:?}, but the kernels were built for {want:?}; build the op \
             from the configuration this program runs (its dims, devices and mesh)"
        ),
    })
}

/// Fails unless each kernel call of the (validated) `cp` holds `needs` (queries, keys per
/// head): the layout `op`'s kernels attend. The op checks what the configuration's devices
/// hold, whichever strategy built it.
fn expect_lengths(
    cp: &ContextParallel,
    op: &'static str,
    needs: (usize, usize),
) -> Result<(), CpError> {
    let holds = cp.local_lengths();
    if holds == needs {
        return Ok(());
    }
    Err(ConfigError::OpDoesNotFit {
        op,
        strategy: cp.strategy.label(),
        holds,
        needs,
    }
    .into())
}

/// A kernel call's forward and backward plans.
type Plans = (Vec<Stage>, Vec<Stage>);

/// The splash features of a call with or without segment ids.
fn features(segmented: bool) -> Features {
    Features {
        segmented,
        sinks: false,
    }
}

/// A splash error as the error of a local op.
fn local_error(e: tessera_splash::SplashError) -> CollectiveError {
    CollectiveError::local(e)
}

/// The inputs of one local op: typed operands first, then the optional ones, whose
/// positions it remembers.
struct Inputs<'a, M> {
    values: Vec<&'a dyn LocalValue<M>>,
}

impl<'a, M> Inputs<'a, M> {
    fn new(required: &[&'a dyn LocalValue<M>]) -> Self {
        Inputs {
            values: required.to_vec(),
        }
    }

    /// Adds `x` if present; returns its position among the inputs.
    fn optional(&mut self, x: Option<&'a dyn LocalValue<M>>) -> Option<usize> {
        x.map(|x| {
            self.values.push(x);
            self.values.len() - 1
        })
    }
}

/// The query and key segment ids of a call, if the call has segment ids at input `at`.
fn add_segments(
    f: &mut FuncBuilder<'_>,
    env: &mut HashMap<Tensor, Value>,
    x: &[Value],
    at: Option<usize>,
    q: (Option<Value>, usize),
    kv: (Option<Value>, usize),
) -> Result<(), CollectiveError> {
    match at {
        Some(i) => Segments { full: x[i] }.add_to(f, env, q, kv),
        None => Ok(()),
    }
}
