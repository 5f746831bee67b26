//! Ring attention (MaxText's `context_parallel_strategy = "ring"`).
//!
//! Device `r` keeps its query shard; the K/V shards travel around the ring (a collective
//! permute to `r + 1` after every step), so at step `t` device `r` holds the keys of device
//! `r - t` and attends its queries to them with the mask's tables for that pair of offsets
//! (under a causal mask, the shards of later devices are empty and skipped block by block).
//! Each step's normalised output and logsumexp merge into the running result by logsumexp
//! ([`RingAttention::forward_step`]).
//!
//! The backward is the forward's gradient: the forward runs again, then the steps in reverse:
//! each step's splash backward kernels take the cotangents the logsumexp merge passes to that
//! step's `out` and `lse`; dQ adds up locally, and each shard's dK/dV travel back around the
//! ring through the permutes' transposes (the reverse shift), adding up on the way. No
//! all-to-all, no all-gather.
//!
//! The steps are written over any mesh axis, so the Ulysses x ring hybrid reuses them.

use tessera_collectives::axes::Context;
use tessera_collectives::{
    CollectiveError, DTensor, DimSharding, HasAxis, MeshAxis, MeshShape, Program, Replicated, Spmd,
};

use super::ops::{AxisIndex, BySequence, RingAttention, RingPartial, WholeSegmentIds};
use super::{
    forward_backward_args, gather_segments, output_gradients, ContextMesh, ContextParallel,
    CpError, OutLse, SeqSharded, SeqSharded3,
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

/// The forward on the sequence-sharded `q, k, v`: `out` in the input dtype and `lse`.
fn attend<'p>(
    cp: &ContextParallel,
    ring: &RingAttention<Context>,
    p: &'p Spmd<'_, ContextMesh>,
    [q, k, v]: [&DTensor<'p, ContextMesh, SeqSharded>; 3],
    seg: Option<&DTensor<'p, ContextMesh, WholeSegmentIds<Replicated>>>,
) -> Result<OutLse<'p, ContextMesh, SeqSharded, SeqSharded3>, CollectiveError> {
    let shard = p.axis_index::<Context>()?;
    let partial = forward_steps(p, ring, &shard, q, k.clone(), v.clone(), seg)?;
    Ok((partial.out.convert(cp.dtype)?, partial.lse))
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
        let (out, lse) = attend(cp, &ring, p, [&q, &k, &v], seg.as_ref())?;
        out.output::<SeqSharded>()?;
        lse.output::<SeqSharded3>()
    })?)
}

/// The forward + backward program: global `q, k, v, dout` in, `out`, `lse` and `dq, dk, dv`
/// out. The cotangents of K and V travel back around the ring (the permutes' transposes).
pub(super) fn forward_backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let ring = RingAttention::<Context>::new(cp)?;
    Ok(Program::build("ring_fwdbwd", &cp.context_mesh()?, |p| {
        let [q, k, v, dout] = forward_backward_args(cp, p)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let (out, lse) = attend(cp, &ring, p, [&q, &k, &v], seg.as_ref())?;
        out.output::<SeqSharded>()?;
        lse.output::<SeqSharded3>()?;
        output_gradients(p, &out, &dout, [&q, &k, &v])
    })?)
}
