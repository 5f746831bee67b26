//! All-gather (MaxText's `context_parallel_strategy = "all_gather"`): K and V are gathered
//! along the sequence, so every device holds all keys; device `r` attends its query shard
//! (global positions `r S/U ..`) against them, with the mask's tables for that offset. The
//! backward computes dQ locally and partial dK/dV over the whole sequence on every device,
//! which the all-gather's transpose, a reduce-scatter, sums and re-shards.

use std::collections::HashMap;

use tessera_collectives::axes::Context;
use tessera_collectives::{DTensor, Invariant, Program, Replicated, Varying};
use tessera_splash::{SeqOffsets, ShardedSplash, Tensor};

use super::{
    backward_env, features, gather_segments, lower_plan, lse_from_kernel, shard_start,
    BackwardArgs, ContextMesh, ContextParallel, CpError, Segments, SeqSharded, SeqSharded3,
};

/// `[B, KVH, S, D]` whole on every device.
type Whole = (Replicated, Replicated, Replicated, Replicated);

/// Device `r` attends queries `r S/U ..` to all keys.
fn splash(cp: &ContextParallel) -> Result<ShardedSplash, CpError> {
    let n = cp.dims.q_len / cp.devices;
    let offsets: Vec<_> = (0..cp.devices)
        .map(|r| SeqOffsets { q: r * n, kv: 0 })
        .collect();
    cp.sharded_splash(&offsets)
}

/// Adds this device's query segment ids and every key's to `env`.
fn add_segments(
    cp: &ContextParallel,
    f: &mut tessera_hlo::FuncBuilder<'_>,
    env: &mut HashMap<Tensor, tessera_hlo::Value>,
    seg: Option<tessera_hlo::Value>,
    shard: tessera_hlo::Value,
) -> Result<(), tessera_collectives::CollectiveError> {
    let Some(full) = seg else {
        return Ok(());
    };
    let (s, u) = (cp.dims.q_len, cp.devices);
    let q_start = shard_start(f, shard, 0, u, s / u)?;
    Segments { full }.add_to(f, env, (Some(q_start), s / u), (None, s))
}

pub(super) fn forward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let plan = splash(cp)?.forward_plan(features(segmented))?;
    let g = cp.global_dims();
    Ok(Program::build(
        "all_gather_fwd",
        &cp.context_mesh()?,
        |p| {
            let q = p.arg::<SeqSharded>(g.q, cp.dtype)?;
            let k = p.arg::<SeqSharded>(g.k, cp.dtype)?;
            let v = p.arg::<SeqSharded>(g.v, cp.dtype)?;
            let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
            let k: DTensor<'_, ContextMesh, Whole> = k.all_gather::<Context, 2>()?;
            let v: DTensor<'_, ContextMesh, Whole> = v.all_gather::<Context, 2>()?;
            let shard = p.axis_index::<Context>()?;
            let outs = p.local_values(&[&q, &k, &v, &shard], |f, x| {
                let mut env =
                    HashMap::from([(Tensor::Q, x[0]), (Tensor::K, x[1]), (Tensor::V, x[2])]);
                add_segments(cp, f, &mut env, seg, x[3])?;
                lower_plan(f, &plan, &mut env, Some(x[3]))?;
                Ok(vec![
                    env[&Tensor::Out],
                    lse_from_kernel(f, env[&Tensor::Lse])?,
                ])
            })?;
            p.declare::<SeqSharded, Invariant>(outs[0])?
                .output::<SeqSharded>()?;
            p.declare::<SeqSharded3, Invariant>(outs[1])?
                .output::<SeqSharded3>()
        },
    )?)
}

pub(super) fn backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let plan = splash(cp)?.backward_plan(features(segmented))?;
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
            } = BackwardArgs::declare(cp, p)?;
            let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
            let k: DTensor<'_, ContextMesh, Whole> = k.all_gather::<Context, 2>()?;
            let v: DTensor<'_, ContextMesh, Whole> = v.all_gather::<Context, 2>()?;
            let shard = p.axis_index::<Context>()?;
            let grads = p.local_values(&[&q, &k, &v, &out, &lse, &dout, &shard], |f, x| {
                let mut env = backward_env(f, x)?;
                add_segments(cp, f, &mut env, seg, x[6])?;
                lower_plan(f, &plan, &mut env, Some(x[6]))?;
                Ok(vec![env[&Tensor::Dq], env[&Tensor::Dk], env[&Tensor::Dv]])
            })?;
            p.declare::<SeqSharded, Invariant>(grads[0])?
                .output::<SeqSharded>()?;
            // Each device's dK/dV covers every key but only its queries' contribution: a
            // partial sum over the context axis, which the reduce-scatter completes and
            // re-shards along the sequence.
            for g in &grads[1..] {
                p.declare::<Whole, Varying<Context>>(*g)?
                    .reduce_scatter::<Context, 2>()?
                    .output::<SeqSharded>()?;
            }
            Ok(())
        },
    )?)
}
