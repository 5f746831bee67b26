//! All-gather (MaxText's `context_parallel_strategy = "all_gather"`): K and V are gathered
//! along the sequence, so every device holds all keys; device `r` attends its query shard
//! (global positions `r S/U ..`) against them, with the mask's tables for that offset
//! ([`AllGatherAttention`]). The backward computes dQ locally and partial dK/dV over the
//! whole sequence on every device (typed `Varying<Context>`), which the all-gather's
//! transpose, a reduce-scatter, sums and re-shards.
//!
//! With load balancing the shard of device `r` is chunks `r` and `2U - 1 - r` of `2U`
//! (zigzag order): the gathered K/V are put back in natural order, each chunk of queries
//! attends them separately at its own offset, and dK/dV go back to zigzag order before the
//! reduce-scatter.

use tessera_collectives::axes::Context;
use tessera_collectives::Program;

use super::ops::AllGatherAttention;
use super::{
    gather_segments, BackwardArgs, ContextMesh, ContextParallel, CpError, SeqSharded, SeqSharded3,
};

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
            let k = k.all_gather::<Context, 2>()?;
            let v = v.all_gather::<Context, 2>()?;
            let shard = p.axis_index::<Context>()?;
            let (out, lse) = attention.forward(p, &shard, &q, &k, &v, seg.as_ref())?;
            out.output::<SeqSharded>()?;
            lse.output::<SeqSharded3>()
        },
    )?)
}

pub(super) fn backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let attention = AllGatherAttention::<Context>::new(cp)?;
    Ok(Program::build(
        "all_gather_bwd",
        &cp.context_mesh()?,
        |p| {
            let BackwardArgs {
                q,
                k,
                v,
                out,
                lse,
                dout,
            } = BackwardArgs::new(cp, p)?;
            let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
            let k = k.all_gather::<Context, 2>()?;
            let v = v.all_gather::<Context, 2>()?;
            let shard = p.axis_index::<Context>()?;
            let (dq, dk, dv) =
                attention.backward(p, &shard, &q, &k, &v, &out, &lse, &dout, seg.as_ref())?;
            dq.output::<SeqSharded>()?;
            // Each device's dK/dV covers every key but only its queries' contribution: a
            // partial sum over the context axis, which the reduce-scatter completes and
            // re-shards along the sequence.
            dk.reduce_scatter::<Context, 2>()?.output::<SeqSharded>()?;
            dv.reduce_scatter::<Context, 2>()?.output::<SeqSharded>()
        },
    )?)
}
