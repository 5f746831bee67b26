//! Ring attention (MaxText's `context_parallel_strategy = "ring"`).
//!
//! Device `r` keeps its query shard; the K/V shards travel around the ring (a collective
//! permute to `r + 1` after every step), so at step `t` device `r` holds the keys of device
//! `r - t` and attends its queries to them with the mask's tables for that pair of offsets
//! (under a causal mask, the shards of later devices are empty and skipped block by block).
//! Each step's normalised output and logsumexp merge into the running result by logsumexp.
//!
//! The backward walks the ring once more: with the forward's (global) logsumexp and
//! `rowsum(out * dout)`, every step's dQ contribution adds up locally, and the dK/dV
//! contributions add into accumulators that travel with their K/V shard; after the last step
//! one more permute brings every accumulator home. No all-to-all, no all-gather.
//!
//! The steps are written over any mesh axis, so the Ulysses x ring hybrid reuses them.

use std::collections::HashMap;

use tessera_collectives::axes::Context;
use tessera_collectives::{
    CollectiveError, DTensor, HasAxis, Invariant, Layout, MeshAxis, MeshShape, PermuteDimOf,
    Program, Spmd,
};
use tessera_dsl::DType;
use tessera_hlo::{FuncBuilder, Value};
use tessera_splash::{SeqOffsets, Stage, Tensor};

use super::{
    chunk_of, features, gather_segments, lower_plan, lse_from_kernel, lse_to_kernel, part_start,
    seq_concat, seq_part, BackwardArgs, ContextMesh, ContextParallel, CpError, Segments,
    SeqSharded, SeqSharded3,
};

/// The splash plans of every ring step: at step `t` shard `r` attends its queries to the
/// keys of shard `r - t`. With load balancing each shard is two chunks (zigzag), and every
/// pair of a query chunk and a key chunk is its own attention, at its own offsets (pairs that
/// see nothing under the mask are skipped block by block).
pub(super) struct RingPlans {
    /// Parts per shard: 1, or 2 with load balancing.
    pub parts: usize,
    /// `forward[t][q_part][kv_part]`.
    pub forward: Vec<Vec<Vec<Vec<Stage>>>>,
    /// The backward preprocessing (`rowsum(out * dout)`) of one part.
    pub prep: Vec<Stage>,
    /// `backward[t][q_part][kv_part]`: the backward kernels after the preprocessing.
    pub backward: Vec<Vec<Vec<Vec<Stage>>>>,
}

impl RingPlans {
    pub fn new(
        cp: &ContextParallel,
        ring: usize,
        backward: bool,
        segmented: bool,
    ) -> Result<Self, CpError> {
        let parts = cp.parts();
        let len = cp.dims.q_len / (ring * parts);
        let mut plans = RingPlans {
            parts,
            forward: Vec::new(),
            prep: Vec::new(),
            backward: Vec::new(),
        };
        for t in 0..ring {
            let mut step = Vec::with_capacity(parts);
            for hq in 0..parts {
                let mut row = Vec::with_capacity(parts);
                for hk in 0..parts {
                    let splash = cp.sharded_splash(&step_offsets(ring, len, t, (hq, hk)))?;
                    row.push(if backward {
                        let mut stages = splash.backward_plan(features(segmented))?;
                        let rest = stages.split_off(1);
                        plans.prep = stages;
                        rest
                    } else {
                        splash.forward_plan(features(segmented))?
                    });
                }
                step.push(row);
            }
            if backward {
                plans.backward.push(step);
            } else {
                plans.forward.push(step);
            }
        }
        Ok(plans)
    }
}

/// Where every shard attends at step `t` of a ring of `ring` shards cut into chunks of `len`:
/// its query part `hq` to key part `hk` of shard `r - t`.
fn step_offsets(ring: usize, len: usize, t: usize, (hq, hk): (usize, usize)) -> Vec<SeqOffsets> {
    (0..ring)
        .map(|r| SeqOffsets {
            q: chunk_of(r, hq, ring) * len,
            kv: chunk_of((r + ring - t) % ring, hk, ring) * len,
        })
        .collect()
}

/// Every forward attention call of a ring of `ring` shards: the offsets of each shard.
pub(super) fn all_offsets(cp: &ContextParallel, ring: usize) -> Vec<Vec<SeqOffsets>> {
    let parts = cp.parts();
    let len = cp.dims.q_len / (ring * parts);
    let mut calls = Vec::new();
    for t in 0..ring {
        for hq in 0..parts {
            for hk in 0..parts {
                calls.push(step_offsets(ring, len, t, (hq, hk)));
            }
        }
    }
    calls
}

/// Segment ids (natural order) on a ring of `ring` shards of `parts` chunks of `len`
/// positions: at step `t` shard `r` attends its own queries to the keys of shard `r - t`.
#[derive(Debug, Clone, Copy)]
pub(super) struct RingSegments {
    pub seg: Segments,
    pub len: usize,
    pub ring: usize,
}

impl RingSegments {
    fn add_to(
        &self,
        f: &mut FuncBuilder<'_>,
        env: &mut HashMap<Tensor, Value>,
        shard: Value,
        step: usize,
        (q_part, kv_part): (usize, usize),
    ) -> Result<(), CollectiveError> {
        let (ring, len) = (self.ring, self.len);
        let q = part_start(f, shard, 0, ring, q_part, len)?;
        let kv = part_start(f, shard, ring - step, ring, kv_part, len)?;
        self.seg.add_to(f, env, (Some(q), len), (Some(kv), len))
    }
}

/// Runs the forward steps: `q, k, v` are this device's shards (`k`, `v` typed, so they can
/// travel), `shard` its position on the ring. Returns `out` (f32) and the kernel-shaped
/// `lse [B, H, n, 1]`.
pub(super) fn forward_steps<'p, M, A, S>(
    p: &'p Spmd<'_, M>,
    q: Value,
    mut k: DTensor<'p, M, S, Invariant>,
    mut v: DTensor<'p, M, S, Invariant>,
    shard: Value,
    segments: Option<RingSegments>,
    plans: &RingPlans,
) -> Result<[Value; 2], CollectiveError>
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    S: PermuteDimOf<A, 2> + Layout<M>,
{
    let parts = plans.parts;
    // Per query part: the merged `out` (f32) and `lse` so far.
    let mut acc: Vec<Option<[Value; 2]>> = vec![None; parts];
    for (t, step) in plans.forward.iter().enumerate() {
        let merged = p.local_values(&[&k, &v], |f, x| {
            let mut merged = Vec::with_capacity(2 * parts);
            for (hq, row) in step.iter().enumerate() {
                let mut part_acc = acc[hq];
                for (hk, plan) in row.iter().enumerate() {
                    let mut env = HashMap::from([
                        (Tensor::Q, seq_part(f, q, hq, parts)?),
                        (Tensor::K, seq_part(f, x[0], hk, parts)?),
                        (Tensor::V, seq_part(f, x[1], hk, parts)?),
                    ]);
                    if let Some(s) = segments {
                        s.add_to(f, &mut env, shard, t, (hq, hk))?;
                    }
                    lower_plan(f, plan, &mut env, Some(shard))?;
                    let part = [f.convert(env[&Tensor::Out], DType::F32)?, env[&Tensor::Lse]];
                    part_acc = Some(match part_acc {
                        None => part,
                        Some(a) => merge_partials(f, a, part)?,
                    });
                }
                merged.extend(part_acc.expect("every query part meets a key part"));
            }
            Ok(merged)
        })?;
        for (hq, pair) in merged.chunks(2).enumerate() {
            acc[hq] = Some([pair[0], pair[1]]);
        }
        if t + 1 < plans.forward.len() {
            k = k.ring_shift::<A, 2>(1)?;
            v = v.ring_shift::<A, 2>(1)?;
        }
    }
    let acc: Vec<[Value; 2]> = acc
        .into_iter()
        .map(|a| a.expect("a ring has at least one step"))
        .collect();
    p.with_builder(|f| {
        let outs: Vec<Value> = acc.iter().map(|a| a[0]).collect();
        let lses: Vec<Value> = acc.iter().map(|a| a[1]).collect();
        Ok([seq_concat(f, &outs)?, seq_concat(f, &lses)?])
    })
}

/// The local inputs of the backward steps (this device's shards, kernel-shaped `lse`).
pub(super) struct BackwardInputs {
    pub q: Value,
    pub out: Value,
    pub lse: Value,
    pub dout: Value,
    pub shard: Value,
    pub segments: Option<RingSegments>,
}

/// Runs the backward steps; returns `dq` and this device's `dk`, `dv` (all f32), the latter
/// back home after travelling the ring with their K/V.
pub(super) fn backward_steps<'p, M, A, S>(
    p: &'p Spmd<'_, M>,
    x: &BackwardInputs,
    mut k: DTensor<'p, M, S, Invariant>,
    mut v: DTensor<'p, M, S, Invariant>,
    plans: &RingPlans,
) -> Result<[Value; 3], CollectiveError>
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    S: PermuteDimOf<A, 2> + Layout<M>,
{
    let parts = plans.parts;
    // Per query part: its q, lse, dout and rowsum(out * dout).
    let residuals = p.with_builder(|f| {
        let mut residuals = Vec::with_capacity(parts);
        for h in 0..parts {
            let mut env = HashMap::from([
                (Tensor::Q, seq_part(f, x.q, h, parts)?),
                (Tensor::Out, seq_part(f, x.out, h, parts)?),
                (Tensor::DOut, seq_part(f, x.dout, h, parts)?),
                (Tensor::Lse, seq_part(f, x.lse, h, parts)?),
            ]);
            lower_plan(f, &plans.prep, &mut env, None)?;
            env.remove(&Tensor::Out);
            env.remove(&Tensor::DSinks);
            residuals.push(env);
        }
        Ok(residuals)
    })?;
    let mut dq: Vec<Option<Value>> = vec![None; parts];
    let mut dkv: Option<[DTensor<'p, M, S, Invariant>; 2]> = None;
    for (t, step) in plans.backward.iter().enumerate() {
        let mut inputs: Vec<&dyn tessera_collectives::LocalValue<M>> = vec![&k, &v];
        if let Some([dk, dv]) = &dkv {
            inputs.extend([dk as &dyn tessera_collectives::LocalValue<M>, dv]);
        }
        let grads = p.local_values(&inputs, |f, y| {
            // dK/dV per key part: the accumulators that arrived with K/V, or nothing yet.
            let mut dk: Vec<Option<Value>> = Vec::with_capacity(parts);
            let mut dv: Vec<Option<Value>> = Vec::with_capacity(parts);
            for h in 0..parts {
                dk.push(y.get(2).map(|&a| seq_part(f, a, h, parts)).transpose()?);
                dv.push(y.get(3).map(|&a| seq_part(f, a, h, parts)).transpose()?);
            }
            let mut dq_step = dq.clone();
            for (hq, row) in step.iter().enumerate() {
                for (hk, plan) in row.iter().enumerate() {
                    let mut env = residuals[hq].clone();
                    env.insert(Tensor::K, seq_part(f, y[0], hk, parts)?);
                    env.insert(Tensor::V, seq_part(f, y[1], hk, parts)?);
                    if let Some(s) = x.segments {
                        s.add_to(f, &mut env, x.shard, t, (hq, hk))?;
                    }
                    lower_plan(f, plan, &mut env, Some(x.shard))?;
                    for (acc, g) in [
                        (&mut dq_step[hq], Tensor::Dq),
                        (&mut dk[hk], Tensor::Dk),
                        (&mut dv[hk], Tensor::Dv),
                    ] {
                        let g = f.convert(env[&g], DType::F32)?;
                        *acc = Some(match *acc {
                            Some(a) => f.add(a, g)?,
                            None => g,
                        });
                    }
                }
            }
            let mut out: Vec<Value> = dq_step
                .into_iter()
                .map(|g| g.expect("every part"))
                .collect();
            for acc in [dk, dv] {
                let acc: Vec<Value> = acc.into_iter().map(|g| g.expect("every part")).collect();
                out.push(seq_concat(f, &acc)?);
            }
            Ok(out)
        })?;
        for (h, &g) in grads[..parts].iter().enumerate() {
            dq[h] = Some(g);
        }
        let dk: DTensor<'p, M, S, Invariant> = p.declare(grads[parts])?;
        let dv: DTensor<'p, M, S, Invariant> = p.declare(grads[parts + 1])?;
        // The accumulators follow their K/V shard; after the last step this permute brings
        // each home.
        dkv = Some([dk.ring_shift::<A, 2>(1)?, dv.ring_shift::<A, 2>(1)?]);
        if t + 1 < plans.backward.len() {
            k = k.ring_shift::<A, 2>(1)?;
            v = v.ring_shift::<A, 2>(1)?;
        }
    }
    let [dk, dv] = dkv.expect("a ring has at least one step");
    let dq: Vec<Value> = dq
        .into_iter()
        .map(|g| g.expect("a ring has at least one step"))
        .collect();
    let dq = p.with_builder(|f| seq_concat(f, &dq))?;
    Ok([dq, dk.value(), dv.value()])
}

/// Merges two attentions of the same queries over disjoint keys, each normalised with its
/// own logsumexp: `lse = log(e^a + e^b)`, `out = out_a e^(a - lse) + out_b e^(b - lse)`.
/// A part that saw no key has `lse = -inf` and `out = 0` and drops out; when both did, the
/// result is `-inf` and 0 again.
fn merge_partials(
    f: &mut FuncBuilder<'_>,
    [out_a, lse_a]: [Value; 2],
    [out_b, lse_b]: [Value; 2],
) -> Result<[Value; 2], CollectiveError> {
    let lse_type = f.value_type(lse_a)?.clone();
    let out_type = f.value_type(out_a)?.clone();
    let zero = f.splat(0.0, lse_type.clone())?;
    let one = f.splat(1.0, lse_type)?;
    let m = f.max(lse_a, lse_b)?;
    let finite = f.is_finite(m)?;
    let m = f.select(finite, m, zero)?;
    let da = f.sub(lse_a, m)?;
    let wa = f.exp(da)?;
    let db = f.sub(lse_b, m)?;
    let wb = f.exp(db)?;
    let total = f.add(wa, wb)?;
    let log_total = f.log(total)?;
    let lse = f.add(m, log_total)?;
    let empty = f.eq(total, zero)?;
    let total = f.select(empty, one, total)?;
    let mut scaled = Vec::with_capacity(2);
    for (o, w) in [(out_a, wa), (out_b, wb)] {
        let w = f.div(w, total)?;
        let rank = out_type.dims.len() as i64;
        let w = f.broadcast_in_dim(w, &out_type.dims, &(0..rank).collect::<Vec<_>>())?;
        scaled.push(f.mul(o, w)?);
    }
    Ok([f.add(scaled[0], scaled[1])?, lse])
}

/// The segment ids of a ring over the context axis.
fn ring_segments(cp: &ContextParallel, full: Value) -> RingSegments {
    RingSegments {
        seg: Segments { full },
        len: cp.dims.q_len / (cp.devices * cp.parts()),
        ring: cp.devices,
    }
}

pub(super) fn forward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let plans = RingPlans::new(cp, cp.devices, false, segmented)?;
    let g = cp.global_dims();
    Ok(Program::build("ring_fwd", &cp.context_mesh()?, |p| {
        let q = p.arg::<SeqSharded>(g.q, cp.dtype)?;
        let k = p.arg::<SeqSharded>(g.k, cp.dtype)?;
        let v = p.arg::<SeqSharded>(g.v, cp.dtype)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let shard = p.axis_index::<Context>()?;
        let [out, lse] = forward_steps::<_, Context, _>(
            p,
            q.value(),
            k,
            v,
            shard.value(),
            seg.map(|full| ring_segments(cp, full)),
            &plans,
        )?;
        let (out, lse) =
            p.with_builder(|f| Ok((f.convert(out, cp.dtype)?, lse_from_kernel(f, lse)?)))?;
        p.declare::<SeqSharded, Invariant>(out)?
            .output::<SeqSharded>()?;
        p.declare::<SeqSharded3, Invariant>(lse)?
            .output::<SeqSharded3>()
    })?)
}

pub(super) fn backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<ContextMesh>, CpError> {
    let plans = RingPlans::new(cp, cp.devices, true, segmented)?;
    Ok(Program::build("ring_bwd", &cp.context_mesh()?, |p| {
        let BackwardArgs {
            q,
            k,
            v,
            out,
            lse,
            dout,
        } = BackwardArgs::declare(cp, p)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let shard = p.axis_index::<Context>()?;
        let lse = p.with_builder(|f| lse_to_kernel(f, lse.value()))?;
        let x = BackwardInputs {
            q: q.value(),
            out: out.value(),
            lse,
            dout: dout.value(),
            shard: shard.value(),
            segments: seg.map(|full| ring_segments(cp, full)),
        };
        let grads = backward_steps::<_, Context, _>(p, &x, k, v, &plans)?;
        for g in grads {
            let g = p.with_builder(|f| Ok(f.convert(g, cp.dtype)?))?;
            p.declare::<SeqSharded, Invariant>(g)?
                .output::<SeqSharded>()?;
        }
        Ok(())
    })?)
}
