//! Ulysses (DeepSpeed-Ulysses, MaxText's `context_parallel_strategy = "ulysses"`).
//!
//! Per device the sequence is sharded, `[B, H, S/U, D]`; an all-to-all (split heads,
//! concatenate sequence) gives each device the whole sequence for `H/U` heads,
//! `[B, H/U, S, D]`; the local splash kernels run ([`UlyssesAttention`], whose signature
//! requires exactly that layout); the inverse all-to-all brings the result back to
//! `[B, H, S/U, D]`. The backward is the forward's gradient: the cotangent goes through the
//! inverse all-to-all's transpose (the forward all-to-all), the splash dq/dkv kernels run
//! locally, and the gradients go back through the forward all-to-alls' transposes (the
//! inverse all-to-all): only all-to-alls.
//!
//! GQA: with `KVH` divisible by U the KV heads go through the same all-to-all; with
//! `KVH < U` (which MaxText rejects) each KV head is first replicated `U / KVH` times so
//! every device holds the one KV head its query heads use; its gradient is summed back over
//! the replicas.

use tessera_collectives::axes::Context;
use tessera_collectives::{CollectiveError, DTensor, Program, Replicated, Spmd};

use super::ops::{ByHeads, UlyssesAttention, WholeSegmentIds};
use super::{
    forward_backward_args, gather_segments, output_gradients, replicate_heads, ContextMesh,
    ContextParallel, CpError, OutLse, SeqSharded, SeqSharded3,
};

/// `[B, H/U, S, D]`: the heads split over `context`, the whole sequence on every device.
type HeadSharded = ByHeads<Replicated, Context>;

/// The forward on the sequence-sharded `q, k, v`: re-shards them to heads (replicating the KV
/// heads first when there are fewer than devices), attends, and re-shards `out` and `lse`
/// back to the sequence.
fn attend<'p>(
    cp: &ContextParallel,
    attention: &UlyssesAttention<Context>,
    p: &'p Spmd<'_, ContextMesh>,
    [q, k, v]: [&DTensor<'p, ContextMesh, SeqSharded>; 3],
    seg: Option<&DTensor<'p, ContextMesh, WholeSegmentIds<Replicated>>>,
) -> Result<OutLse<'p, ContextMesh, SeqSharded, SeqSharded3>, CollectiveError> {
    let rep = cp.kv_replication();
    let (k, v) = (replicate_heads(k, rep)?, replicate_heads(v, rep)?);
    let q: DTensor<'_, ContextMesh, HeadSharded> = q.all_to_all::<Context, 1, 2>()?;
    let k: DTensor<'_, ContextMesh, HeadSharded> = k.all_to_all::<Context, 1, 2>()?;
    let v: DTensor<'_, ContextMesh, HeadSharded> = v.all_to_all::<Context, 1, 2>()?;
    let (out, lse) = attention.forward(p, &q, &k, &v, seg)?;
    Ok((
        out.all_to_all::<Context, 2, 1>()?,
        lse.all_to_all::<Context, 2, 1>()?,
    ))
}

/// The forward program: global `q, k, v` in, `out` and `lse` out.
pub(super) fn forward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let attention = UlyssesAttention::<Context>::new(cp)?;
    let g = cp.global_dims();
    Ok(Program::build("ulysses_fwd", &cp.context_mesh()?, |p| {
        let q = p.arg::<SeqSharded>(g.q, cp.dtype)?;
        let k = p.arg::<SeqSharded>(g.k, cp.dtype)?;
        let v = p.arg::<SeqSharded>(g.v, cp.dtype)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let (out, lse) = attend(cp, &attention, p, [&q, &k, &v], seg.as_ref())?;
        out.output::<SeqSharded>()?;
        lse.output::<SeqSharded3>()
    })?)
}

/// The forward + backward program: global `q, k, v, dout` in, `out`, `lse` and `dq, dk, dv`
/// out (the gradient of the forward). The KV heads' replication is a broadcast whose
/// transpose sums each KV head's replicas.
pub(super) fn forward_backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let attention = UlyssesAttention::<Context>::new(cp)?;
    Ok(Program::build(
        "ulysses_fwdbwd",
        &cp.context_mesh()?,
        |p| {
            let [q, k, v, dout] = forward_backward_args(cp, p)?;
            let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
            let (out, lse) = attend(cp, &attention, p, [&q, &k, &v], seg.as_ref())?;
            out.output::<SeqSharded>()?;
            lse.output::<SeqSharded3>()?;
            output_gradients(p, &out, &dout, [&q, &k, &v])
        },
    )?)
}
