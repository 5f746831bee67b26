//! Ring attention (MaxText's `context_parallel_strategy = "ring"`).
//!
//! Device `r` keeps its query shard; the K/V shards travel around the ring (a collective
//! permute to `r + 1` after every step), so at step `t` device `r` holds the keys of device
//! `r - t` and attends its queries to them with the mask's tables for that pair of offsets
//! (under a causal mask, the shards of later devices are empty and skipped block by block).
//! Each step's normalised output and logsumexp merge into the running result by logsumexp.
//!
//! The whole ring is one custom-VJP unit ([`RingAttention::forward`]) whose backward is a
//! second ring: K/V travel around again, each step's splash backward kernels read the final
//! `out` and `lse`, dQ adds up locally, and each shard's dK/dV accumulate in a buffer that
//! travels with the shard and one more step brings home. No all-to-all, no all-gather.
//!
//! The ring is written over any mesh axis, so the Ulysses x ring hybrid reuses it.

use tessera_collectives::axes::Context;
use tessera_collectives::{CollectiveError, DTensor, Program, Replicated, Spmd};

use super::ops::{RingAttention, WholeSegmentIds};
use super::{
    forward_backward_args, gather_segments, output_gradients, ContextMesh, ContextParallel,
    CpError, OutLse, SeqSharded, SeqSharded3,
};

/// The forward on the sequence-sharded `q, k, v`: `out` in the input dtype and `lse`.
fn attend<'p>(
    cp: &ContextParallel,
    ring: &RingAttention<Context>,
    p: &'p Spmd<'_, ContextMesh>,
    [q, k, v]: [&DTensor<'p, ContextMesh, SeqSharded>; 3],
    seg: Option<&DTensor<'p, ContextMesh, WholeSegmentIds<Replicated>>>,
) -> Result<OutLse<'p, ContextMesh, SeqSharded, SeqSharded3>, CollectiveError> {
    let shard = p.axis_index::<Context>()?;
    let partial = ring.forward(p, &shard, q, k, v, seg)?;
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
