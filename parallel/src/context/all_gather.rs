//! All-gather (MaxText's `context_parallel_strategy = "all_gather"`): K and V are gathered
//! along the sequence, so every device holds all keys; device `r` attends its query shard
//! (global positions `r S/U ..`) against them, with the mask's tables for that offset
//! ([`AllGatherAttention`]). The backward, the forward's gradient, computes dQ locally and
//! partial dK/dV over the whole sequence on every device, which the all-gather's transpose, a
//! reduce-scatter, sums and re-shards.
//!
//! With load balancing the shard of device `r` is chunks `r` and `2U - 1 - r` of `2U`
//! (zigzag order): the gathered K/V are put back in natural order, each chunk of queries
//! attends them separately at its own offset, and dK/dV go back to zigzag order before the
//! reduce-scatter.

use tessera_collectives::axes::Context;
use tessera_collectives::{CollectiveError, DTensor, Program, Replicated, Spmd};

use super::ops::{AllGatherAttention, WholeSegmentIds};
use super::{
    forward_backward_args, gather_segments, output_gradients, ContextMesh, ContextParallel,
    CpError, OutLse, SeqSharded, SeqSharded3,
};

/// The forward on the sequence-sharded `q, k, v`: gathers K and V, attends this device's
/// queries.
fn attend<'p>(
    attention: &AllGatherAttention<Context>,
    p: &'p Spmd<'_, ContextMesh>,
    [q, k, v]: [&DTensor<'p, ContextMesh, SeqSharded>; 3],
    seg: Option<&DTensor<'p, ContextMesh, WholeSegmentIds<Replicated>>>,
) -> Result<OutLse<'p, ContextMesh, SeqSharded, SeqSharded3>, CollectiveError> {
    let k = k.all_gather::<Context, 2>()?;
    let v = v.all_gather::<Context, 2>()?;
    let shard = p.axis_index::<Context>()?;
    attention.forward(p, &shard, q, &k, &v, seg)
}

pub(super) fn forward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let attention = AllGatherAttention::<Context>::new(cp)?;
    let g = cp.global_dims();
    Ok(Program::build(
        "all_gather_fwd",
        &cp.context_mesh()?,
        |p| {
            let q = p.arg::<SeqSharded>(g.q, cp.dtype)?;
            let k = p.arg::<SeqSharded>(g.k, cp.dtype)?;
            let v = p.arg::<SeqSharded>(g.v, cp.dtype)?;
            let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
            let (out, lse) = attend(&attention, p, [&q, &k, &v], seg.as_ref())?;
            out.output::<SeqSharded>()?;
            lse.output::<SeqSharded3>()
        },
    )?)
}

/// The forward + backward program: global `q, k, v, dout` in, `out`, `lse` and `dq, dk, dv`
/// out. The all-gathers' transposes reduce-scatter dK and dV.
pub(super) fn forward_backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let attention = AllGatherAttention::<Context>::new(cp)?;
    Ok(Program::build(
        "all_gather_fwdbwd",
        &cp.context_mesh()?,
        |p| {
            let [q, k, v, dout] = forward_backward_args(cp, p)?;
            let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
            let (out, lse) = attend(&attention, p, [&q, &k, &v], seg.as_ref())?;
            out.output::<SeqSharded>()?;
            lse.output::<SeqSharded3>()?;
            output_gradients(p, &out, &dout, [&q, &k, &v])
        },
    )?)
}
