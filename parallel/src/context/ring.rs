//! Ring attention (MaxText's `context_parallel_strategy = "ring"`).
//!
//! Device `r` keeps its query shard; the K/V shards travel around the ring (a collective
//! permute to `r + 1` after every step), so at step `t` device `r` holds the keys of device
//! `r - t` and attends its queries to them with the mask's tables for that pair of offsets
//! (under a causal mask, the shards of later devices are empty and skipped block by block).
//! Each step's normalised output and logsumexp merge into the running result by logsumexp
//! ([`RingAttention::forward_step`]).
//!
//! The backward walks the ring once more: with the forward's (global) logsumexp and
//! `rowsum(out * dout)`, every step's dQ contribution adds up locally, and the dK/dV
//! contributions add into accumulators that travel with their K/V shard; after the last step
//! one more permute brings every accumulator home. No all-to-all, no all-gather.
//!
//! The steps are written over any mesh axis, so the Ulysses x ring hybrid reuses them.

use tessera_collectives::axes::Context;
use tessera_collectives::{
    CollectiveError, DTensor, DimSharding, HasAxis, MeshAxis, MeshShape, Program, Spmd,
};

use super::ops::{
    AxisIndex, BySequence, RingAttention, RingGrads, RingPartial, RingResiduals, WholeSegmentIds,
};
use super::{
    gather_segments, BackwardArgs, ContextMesh, ContextParallel, CpError, SeqSharded, SeqSharded3,
};

/// The K/V shards of one device, rotating around the ring.
type Shard<'p, M, B, H, A> = DTensor<'p, M, BySequence<B, H, A>>;

/// The forward over every ring step: this device's queries `q` against each K/V shard in
/// turn, starting with its own (`k`, `v`), rotated over `A` between the steps.
#[allow(clippy::too_many_arguments)] // the ring, the offset, q, K/V and segments
pub(super) fn forward_steps<'p, M, A, B, H>(
    p: &'p Spmd<'_, M>,
    ring: &RingAttention<A>,
    shard: &AxisIndex<'p, M, A>,
    q: &Shard<'p, M, B, H, A>,
    mut k: Shard<'p, M, B, H, A>,
    mut v: Shard<'p, M, B, H, A>,
    segment_ids: Option<&DTensor<'p, M, WholeSegmentIds<B>>>,
) -> Result<RingPartial<'p, M, B, H, A>, CollectiveError>
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    B: DimSharding<M>,
    H: DimSharding<M>,
{
    let mut partial = None;
    for t in 0..ring.steps() {
        partial = Some(ring.forward_step(p, t, shard, q, &k, &v, segment_ids, partial)?);
        if t + 1 < ring.steps() {
            k = k.ring_shift::<A, 2>(1)?;
            v = v.ring_shift::<A, 2>(1)?;
        }
    }
    partial.ok_or_else(|| CollectiveError::local("a ring has at least one step"))
}

/// The backward over every ring step: the gradients of this device's queries against each
/// K/V shard in turn; dK/dV travel with their shard and come home after the last step.
pub(super) fn backward_steps<'p, M, A, B, H>(
    p: &'p Spmd<'_, M>,
    ring: &RingAttention<A>,
    shard: &AxisIndex<'p, M, A>,
    residuals: &RingResiduals<'p, M, B, H, A>,
    mut k: Shard<'p, M, B, H, A>,
    mut v: Shard<'p, M, B, H, A>,
    segment_ids: Option<&DTensor<'p, M, WholeSegmentIds<B>>>,
) -> Result<RingGrads<'p, M, B, H, A>, CollectiveError>
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    B: DimSharding<M>,
    H: DimSharding<M>,
{
    let mut grads = None;
    for t in 0..ring.steps() {
        let g = ring.backward_step(p, t, shard, residuals, &k, &v, segment_ids, grads)?;
        // The accumulators follow their K/V shard; after the last step this permute brings
        // each home.
        grads = Some(RingGrads {
            dq: g.dq,
            dk: g.dk.ring_shift::<A, 2>(1)?,
            dv: g.dv.ring_shift::<A, 2>(1)?,
        });
        if t + 1 < ring.steps() {
            k = k.ring_shift::<A, 2>(1)?;
            v = v.ring_shift::<A, 2>(1)?;
        }
    }
    grads.ok_or_else(|| CollectiveError::local("a ring has at least one step"))
}

pub(super) fn forward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let ring = RingAttention::<Context>::new(cp)?;
    let g = cp.global_dims();
    Ok(Program::build("ring_fwd", &cp.context_mesh()?, |p| {
        let q = p.arg::<SeqSharded>(g.q, cp.dtype)?;
        let k = p.arg::<SeqSharded>(g.k, cp.dtype)?;
        let v = p.arg::<SeqSharded>(g.v, cp.dtype)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let shard = p.axis_index::<Context>()?;
        let partial = forward_steps(p, &ring, &shard, &q, k, v, seg.as_ref())?;
        partial.out.convert(cp.dtype)?.output::<SeqSharded>()?;
        partial.lse.output::<SeqSharded3>()
    })?)
}

pub(super) fn backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let ring = RingAttention::<Context>::new(cp)?;
    Ok(Program::build("ring_bwd", &cp.context_mesh()?, |p| {
        let BackwardArgs {
            q,
            k,
            v,
            out,
            lse,
            dout,
        } = BackwardArgs::new(cp, p)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let shard = p.axis_index::<Context>()?;
        let residuals = ring.backward_residuals(p, &q, &out, &lse, &dout)?;
        let grads = backward_steps(p, &ring, &shard, &residuals, k, v, seg.as_ref())?;
        for g in [grads.dq, grads.dk, grads.dv] {
            g.convert(cp.dtype)?.output::<SeqSharded>()?;
        }
        Ok(())
    })?)
}
