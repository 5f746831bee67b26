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
    features, gather_segments, lower_plan, lse_from_kernel, lse_to_kernel, shard_start,
    BackwardArgs, ContextMesh, ContextParallel, CpError, Segments, SeqSharded, SeqSharded3,
};

/// The splash plans of every ring step: at step `t` shard `r` (of `ring` shards of `n`
/// positions) attends its queries to the keys of shard `r - t`.
pub(super) struct RingPlans {
    pub forward: Vec<Vec<Stage>>,
    /// The backward preprocessing (`rowsum(out * dout)`), the same on every step.
    pub prep: Vec<Stage>,
    /// Every step's backward kernels after the preprocessing.
    pub backward: Vec<Vec<Stage>>,
}

impl RingPlans {
    pub fn new(
        cp: &ContextParallel,
        ring: usize,
        backward: bool,
        segmented: bool,
    ) -> Result<Self, CpError> {
        let n = cp.dims.q_len / ring;
        let mut plans = RingPlans {
            forward: Vec::new(),
            prep: Vec::new(),
            backward: Vec::new(),
        };
        for t in 0..ring {
            let offsets: Vec<_> = (0..ring)
                .map(|r| SeqOffsets {
                    q: r * n,
                    kv: (r + ring - t) % ring * n,
                })
                .collect();
            let splash = cp.sharded_splash(&offsets)?;
            if backward {
                let mut stages = splash.backward_plan(features(segmented))?;
                let rest = stages.split_off(1);
                plans.prep = stages;
                plans.backward.push(rest);
            } else {
                plans
                    .forward
                    .push(splash.forward_plan(features(segmented))?);
            }
        }
        Ok(plans)
    }
}

/// Segment ids on a ring of `ring` shards of `n` positions: at step `t` shard `r` attends
/// its own queries to the keys of shard `r - t`.
#[derive(Debug, Clone, Copy)]
pub(super) struct RingSegments {
    pub seg: Segments,
    pub n: usize,
    pub ring: usize,
}

impl RingSegments {
    fn add_to(
        &self,
        f: &mut FuncBuilder<'_>,
        env: &mut HashMap<Tensor, Value>,
        shard: Value,
        step: usize,
    ) -> Result<(), CollectiveError> {
        let q = shard_start(f, shard, 0, self.ring, self.n)?;
        let kv = shard_start(f, shard, self.ring - step, self.ring, self.n)?;
        self.seg
            .add_to(f, env, (Some(q), self.n), (Some(kv), self.n))
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
    plans: &[Vec<Stage>],
) -> Result<[Value; 2], CollectiveError>
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    S: PermuteDimOf<A, 2> + Layout<M>,
{
    let mut acc: Option<[Value; 2]> = None;
    for (t, plan) in plans.iter().enumerate() {
        let step = p.local_values(&[&k, &v], |f, x| {
            let mut env = HashMap::from([(Tensor::Q, q), (Tensor::K, x[0]), (Tensor::V, x[1])]);
            if let Some(s) = segments {
                s.add_to(f, &mut env, shard, t)?;
            }
            lower_plan(f, plan, &mut env, Some(shard))?;
            let part = [f.convert(env[&Tensor::Out], DType::F32)?, env[&Tensor::Lse]];
            Ok(match acc {
                None => part.to_vec(),
                Some(acc) => merge_partials(f, acc, part)?.to_vec(),
            })
        })?;
        acc = Some([step[0], step[1]]);
        if t + 1 < plans.len() {
            k = k.ring_shift::<A, 2>(1)?;
            v = v.ring_shift::<A, 2>(1)?;
        }
    }
    Ok(acc.expect("a ring has at least one step"))
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
    let di = p.with_builder(|f| {
        let mut env = HashMap::from([
            (Tensor::Out, x.out),
            (Tensor::DOut, x.dout),
            (Tensor::Lse, x.lse),
        ]);
        lower_plan(f, &plans.prep, &mut env, None)?;
        Ok(env[&Tensor::Di])
    })?;
    let mut dq: Option<Value> = None;
    let mut dkv: Option<[DTensor<'p, M, S, Invariant>; 2]> = None;
    for (t, plan) in plans.backward.iter().enumerate() {
        let mut inputs: Vec<&dyn tessera_collectives::LocalValue<M>> = vec![&k, &v];
        if let Some([dk, dv]) = &dkv {
            inputs.extend([dk as &dyn tessera_collectives::LocalValue<M>, dv]);
        }
        let step = p.local_values(&inputs, |f, y| {
            let mut env = HashMap::from([
                (Tensor::Q, x.q),
                (Tensor::K, y[0]),
                (Tensor::V, y[1]),
                (Tensor::Lse, x.lse),
                (Tensor::DOut, x.dout),
                (Tensor::Di, di),
            ]);
            if let Some(s) = x.segments {
                s.add_to(f, &mut env, x.shard, t)?;
            }
            lower_plan(f, plan, &mut env, Some(x.shard))?;
            let mut grads = Vec::with_capacity(3);
            for (i, t) in [Tensor::Dq, Tensor::Dk, Tensor::Dv].into_iter().enumerate() {
                let g = f.convert(env[&t], DType::F32)?;
                // dQ accumulates here; dK/dV into the accumulators that arrived with K/V.
                let acc = match i {
                    0 => dq,
                    _ => y.get(i + 1).copied(),
                };
                grads.push(match acc {
                    Some(a) => f.add(a, g)?,
                    None => g,
                });
            }
            Ok(grads)
        })?;
        dq = Some(step[0]);
        let dk: DTensor<'p, M, S, Invariant> = p.declare(step[1])?;
        let dv: DTensor<'p, M, S, Invariant> = p.declare(step[2])?;
        // The accumulators follow their K/V shard; after the last step this permute brings
        // each home.
        dkv = Some([dk.ring_shift::<A, 2>(1)?, dv.ring_shift::<A, 2>(1)?]);
        if t + 1 < plans.backward.len() {
            k = k.ring_shift::<A, 2>(1)?;
            v = v.ring_shift::<A, 2>(1)?;
        }
    }
    let [dk, dv] = dkv.expect("a ring has at least one step");
    Ok([
        dq.expect("a ring has at least one step"),
        dk.value(),
        dv.value(),
    ])
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
        n: cp.dims.q_len / cp.devices,
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
            &plans.forward,
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
