//! Ulysses (DeepSpeed-Ulysses, MaxText's `context_parallel_strategy = "ulysses"`).
//!
//! Per device the sequence is sharded, `[B, H, S/U, D]`; an all-to-all (split heads,
//! concatenate sequence) gives each device the whole sequence for `H/U` heads,
//! `[B, H/U, S, D]`; the local splash kernels run ([`UlyssesAttention`], whose signature
//! requires exactly that layout); the inverse all-to-all brings the result back to
//! `[B, H, S/U, D]`. The backward is the transpose: the cotangent goes through the inverse's
//! transpose (the forward all-to-all), the splash dq/dkv kernels run locally, and the
//! gradients go back through the forward all-to-alls' transposes (the inverse all-to-all).
//!
//! GQA: with `KVH` divisible by U the KV heads go through the same all-to-all; with
//! `KVH < U` (which MaxText rejects) each KV head is first replicated `U / KVH` times so
//! every device holds the one KV head its query heads use; its gradient is summed back over
//! the replicas.

use tessera_collectives::axes::Context;
use tessera_collectives::{CollectiveError, DTensor, Program, Replicated, Spmd};
use tessera_dsl::DType;

use super::ops::{ByHeads, ByHeadsRows, UlyssesAttention};
use super::{
    gather_segments, replicate_heads, sum_replicated_heads, ContextMesh, ContextParallel, CpError,
    SeqSharded, SeqSharded3,
};

/// `[B, H/U, S, D]`: the heads split over `context`, the whole sequence on every device.
type HeadSharded = ByHeads<Replicated, Context>;
/// `[B, H/U, S]`.
type HeadSharded3 = ByHeadsRows<Replicated, Context>;

/// Declares the global `q, k, v` arguments (sequence-sharded) and re-shards them to heads,
/// replicating the KV heads first when there are fewer than devices.
fn qkv_by_heads<'p>(
    cp: &ContextParallel,
    p: &'p Spmd<'_, ContextMesh>,
) -> Result<[DTensor<'p, ContextMesh, HeadSharded>; 3], CollectiveError> {
    let g = cp.global_dims();
    let rep = cp.kv_replication();
    let q = p.arg::<SeqSharded>(g.q, cp.dtype)?;
    let k = p.arg::<SeqSharded>(g.k, cp.dtype)?;
    let v = p.arg::<SeqSharded>(g.v, cp.dtype)?;
    let (k, v) = (replicate_heads(&k, rep)?, replicate_heads(&v, rep)?);
    Ok([
        q.all_to_all::<Context, 1, 2>()?,
        k.all_to_all::<Context, 1, 2>()?,
        v.all_to_all::<Context, 1, 2>()?,
    ])
}

/// The forward program: global `q, k, v` in, `out` and `lse` out.
pub(super) fn forward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let attention = UlyssesAttention::<Context>::new(cp)?;
    Ok(Program::build("ulysses_fwd", &cp.context_mesh()?, |p| {
        let [q, k, v] = qkv_by_heads(cp, p)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let (out, lse) = attention.forward(p, &q, &k, &v, seg.as_ref())?;
        out.all_to_all::<Context, 2, 1>()?.output::<SeqSharded>()?;
        lse.all_to_all::<Context, 2, 1>()?.output::<SeqSharded3>()
    })?)
}

/// The backward program: global `q, k, v, out, lse, dout` in, `dq, dk, dv` out.
pub(super) fn backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let attention = UlyssesAttention::<Context>::new(cp)?;
    let g = cp.global_dims();
    let rep = cp.kv_replication();
    Ok(Program::build("ulysses_bwd", &cp.context_mesh()?, |p| {
        let [q, k, v] = qkv_by_heads(cp, p)?;
        let out = p.arg::<SeqSharded>(g.out, cp.dtype)?;
        let lse = p.arg::<SeqSharded3>(g.lse, DType::F32)?;
        let dout = p.arg::<SeqSharded>(g.out, cp.dtype)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        // The transpose of the forward's output all-to-all (split 2, concat 1) is the
        // all-to-all (split 1, concat 2): the same re-sharding the inputs take.
        let out: DTensor<'_, ContextMesh, HeadSharded> = out.all_to_all::<Context, 1, 2>()?;
        let lse: DTensor<'_, ContextMesh, HeadSharded3> = lse.all_to_all::<Context, 1, 2>()?;
        let dout: DTensor<'_, ContextMesh, HeadSharded> = dout.all_to_all::<Context, 1, 2>()?;
        let (dq, dk, dv) = attention.backward(p, &q, &k, &v, &out, &lse, &dout, seg.as_ref())?;
        dq.all_to_all::<Context, 2, 1>()?.output::<SeqSharded>()?;
        sum_replicated_heads(&dk.all_to_all::<Context, 2, 1>()?, rep)?.output::<SeqSharded>()?;
        sum_replicated_heads(&dv.all_to_all::<Context, 2, 1>()?, rep)?.output::<SeqSharded>()
    })?)
}
