//! All-gather (MaxText's `context_parallel_strategy = "all_gather"`): K and V are gathered
//! along the sequence, so every device holds all keys; device `r` attends its query shard
//! (global positions `r S/U ..`) against them, with the mask's tables for that offset. The
//! backward computes dQ locally and partial dK/dV over the whole sequence on every device,
//! which the all-gather's transpose, a reduce-scatter, sums and re-shards.
//!
//! With load balancing the shard of device `r` is chunks `r` and `2U - 1 - r` of `2U`
//! (zigzag order): the gathered K/V are put back in natural order, each chunk of queries
//! attends them separately at its own offset, and dK/dV go back to zigzag order before the
//! reduce-scatter.

use std::collections::HashMap;

use tessera_collectives::axes::Context;
use tessera_collectives::{CollectiveError, DTensor, Invariant, Program, Replicated, Varying};
use tessera_dsl::DType;
use tessera_hlo::{FuncBuilder, Value};
use tessera_splash::{SeqOffsets, Stage, Tensor};

use super::{
    backward_env, chunk_of, features, gather_segments, lower_plan, lse_from_kernel, part_start,
    reorder_chunks, seq_concat, seq_part, zigzag_inverse, zigzag_order, BackwardArgs, ContextMesh,
    ContextParallel, CpError, Segments, SeqSharded, SeqSharded3,
};

/// `[B, KVH, S, D]` whole on every device.
type Whole = (Replicated, Replicated, Replicated, Replicated);

/// Where every device's query part `part` attends: queries from chunk
/// [`chunk_of`]`(r, part)`, all keys.
pub(super) fn offsets(cp: &ContextParallel, part: usize) -> Vec<SeqOffsets> {
    let u = cp.devices;
    let len = cp.dims.q_len / (u * cp.parts());
    (0..u)
        .map(|r| SeqOffsets {
            q: chunk_of(r, part, u) * len,
            kv: 0,
        })
        .collect()
}

/// Per part of each device's queries, the plans of every device: part `h` of device `r`
/// attends queries from chunk [`chunk_of`]`(r, h)` to all keys.
fn plans(
    cp: &ContextParallel,
    segmented: bool,
    backward: bool,
) -> Result<Vec<Vec<Stage>>, CpError> {
    (0..cp.parts())
        .map(|h| {
            let splash = cp.sharded_splash(&offsets(cp, h))?;
            Ok(if backward {
                splash.backward_plan(features(segmented))?
            } else {
                splash.forward_plan(features(segmented))?
            })
        })
        .collect()
}

/// The gathered K or V in natural order (they arrive in the programs' order).
fn natural(
    cp: &ContextParallel,
    f: &mut FuncBuilder<'_>,
    x: Value,
) -> Result<Value, CollectiveError> {
    if cp.load_balance {
        reorder_chunks(f, x, 2, &zigzag_inverse(cp.devices))
    } else {
        Ok(x)
    }
}

/// Adds part `part` of this device's query segment ids and every key's to `env`.
fn add_segments(
    cp: &ContextParallel,
    f: &mut FuncBuilder<'_>,
    env: &mut HashMap<Tensor, Value>,
    seg: Option<Value>,
    shard: Value,
    part: usize,
) -> Result<(), CollectiveError> {
    let Some(full) = seg else {
        return Ok(());
    };
    let (s, u) = (cp.dims.q_len, cp.devices);
    let len = s / (u * cp.parts());
    let q_start = part_start(f, shard, 0, u, part, len)?;
    Segments { full }.add_to(f, env, (Some(q_start), len), (None, s))
}

pub(super) fn forward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let plans = plans(cp, segmented, false)?;
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
                let (k, v) = (natural(cp, f, x[1])?, natural(cp, f, x[2])?);
                let (mut outs, mut lses) = (Vec::new(), Vec::new());
                for (h, plan) in plans.iter().enumerate() {
                    let q = seq_part(f, x[0], h, plans.len())?;
                    let mut env = HashMap::from([(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)]);
                    add_segments(cp, f, &mut env, seg, x[3], h)?;
                    lower_plan(f, plan, &mut env, Some(x[3]))?;
                    outs.push(env[&Tensor::Out]);
                    lses.push(env[&Tensor::Lse]);
                }
                let (out, lse) = (seq_concat(f, &outs)?, seq_concat(f, &lses)?);
                Ok(vec![out, lse_from_kernel(f, lse)?])
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
    let plans = plans(cp, segmented, true)?;
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
                let (k, v) = (natural(cp, f, x[1])?, natural(cp, f, x[2])?);
                let parts = plans.len();
                let mut dq = Vec::new();
                let mut dkv: Option<[Value; 2]> = None;
                for (h, plan) in plans.iter().enumerate() {
                    // This part's queries and their residuals against all keys.
                    let local = [
                        seq_part(f, x[0], h, parts)?,
                        k,
                        v,
                        seq_part(f, x[3], h, parts)?,
                        seq_part(f, x[4], h, parts)?,
                        seq_part(f, x[5], h, parts)?,
                    ];
                    let mut env = backward_env(f, &local)?;
                    add_segments(cp, f, &mut env, seg, x[6], h)?;
                    lower_plan(f, plan, &mut env, Some(x[6]))?;
                    dq.push(env[&Tensor::Dq]);
                    let part = [env[&Tensor::Dk], env[&Tensor::Dv]];
                    dkv = Some(match dkv {
                        None => part,
                        Some(acc) => [
                            sum_in_f32(f, acc[0], part[0])?,
                            sum_in_f32(f, acc[1], part[1])?,
                        ],
                    });
                }
                let mut grads = vec![seq_concat(f, &dq)?];
                for g in dkv.expect("at least one part") {
                    // Back to the programs' order for the reduce-scatter.
                    grads.push(if cp.load_balance {
                        reorder_chunks(f, g, 2, &zigzag_order(cp.devices))?
                    } else {
                        g
                    });
                }
                Ok(grads)
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

/// `a + b` accumulated in f32, in their dtype.
fn sum_in_f32(f: &mut FuncBuilder<'_>, a: Value, b: Value) -> Result<Value, CollectiveError> {
    let dtype = f.value_type(a)?.dtype;
    let (a32, b32) = (f.convert(a, DType::F32)?, f.convert(b, DType::F32)?);
    let sum = f.add(a32, b32)?;
    Ok(f.convert(sum, dtype)?)
}
