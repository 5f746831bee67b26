//! The ring attention op: one step, this device's queries against the K/V shard in hand.

use std::collections::HashMap;
use std::marker::PhantomData;

use tessera_collectives::{
    CollectiveError, DTensor, DimSharding, HasAxis, MeshAxis, MeshShape, Spmd,
};
use tessera_dsl::DType;
use tessera_hlo::{FuncBuilder, Value};
use tessera_splash::{SeqOffsets, ShardedSplash, SplashError, Tensor};

use super::super::{
    chunk_of, lower_forward, lse_from_kernel, lse_to_kernel, part_start, seq_concat, seq_part,
    ContextParallel, CpError, Segments, Strategy,
};
use super::{
    expect_strategy, features, local_error, AxisIndex, BySequence, BySequenceRows, Inputs,
    KeyShard, LocalShapes, Plans, QueryShard, WholeSegmentIds,
};

const OP: &str = "ring attention";

/// One step of ring attention over the ring axis `A` (MaxText's ring strategy; the ring of a
/// Ulysses x ring hybrid): at step `t` the device at position `r` holds the K/V shard of
/// position `r - t` and attends its own queries to it, with the mask's tables for that pair
/// of offsets. With load balancing every shard is two chunks (zigzag), and each pair of a
/// query chunk and a key chunk is its own attention.
///
/// The steps' partial results merge by logsumexp as they come ([`RingPartial`]). Each kernel
/// call is a custom-VJP unit, so [`Spmd::vjp`] differentiates the steps with splash's
/// backward kernels (the merge passes a cotangent to every step's `lse` as well as its
/// `out`), and the K/V cotangents travel back around the ring through the permutes'
/// transposes.
#[derive(Debug, Clone)]
pub struct RingAttention<A> {
    /// `splash[t][q_part][kv_part]`.
    splash: Vec<Vec<Vec<ShardedSplash>>>,
    shapes: LocalShapes,
    /// Devices on the ring.
    ring: usize,
    /// The length of a chunk (a shard, or half of one with load balancing).
    len: usize,
    _axis: PhantomData<fn() -> A>,
}

/// The attention of this device's queries to the K/V shards seen so far, merged by
/// logsumexp: `out [B, H, S/R, Dv]` (f32, normalised) and `lse [B, H, S/R]` (f32).
#[derive(Debug, Clone)]
pub struct RingPartial<'p, M, B, H, A> {
    /// The normalised output so far (f32).
    pub out: DTensor<'p, M, BySequence<B, H, A>>,
    /// The logsumexp so far (f32; `-inf` where no key was visible yet).
    pub lse: DTensor<'p, M, BySequenceRows<B, H, A>>,
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

/// The devices on the ring of `cp` (the context degree, or a USP's ring degree).
fn ring_degree(cp: &ContextParallel) -> Option<usize> {
    match cp.strategy {
        Strategy::Ring => Some(cp.devices),
        Strategy::Usp { ring, .. } => Some(ring),
        Strategy::Ulysses | Strategy::AllGather => None,
    }
}

/// Every forward attention call of `cp`'s ring: the offsets of each shard.
pub(in crate::context) fn all_offsets(cp: &ContextParallel, ring: usize) -> Vec<Vec<SeqOffsets>> {
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

impl<A: MeshAxis> RingAttention<A> {
    /// The kernels of every step of a ring (or USP) configuration.
    pub fn new(cp: &ContextParallel) -> Result<Self, CpError> {
        let ring = ring_degree(cp);
        expect_strategy(cp, ring.is_some(), "the ring attention op")?;
        cp.validate()?;
        let ring = ring.unwrap_or(1);
        let parts = cp.parts();
        let len = cp.dims.q_len / (ring * parts);
        let mut splash = Vec::with_capacity(ring);
        for t in 0..ring {
            let mut step = Vec::with_capacity(parts);
            for hq in 0..parts {
                let row = (0..parts)
                    .map(|hk| cp.sharded_splash(&step_offsets(ring, len, t, (hq, hk))))
                    .collect::<Result<Vec<_>, _>>()?;
                step.push(row);
            }
            splash.push(step);
        }
        Ok(RingAttention {
            splash,
            shapes: LocalShapes::of(cp, parts, parts),
            ring,
            len,
            _axis: PhantomData,
        })
    }

    /// The number of steps: the devices on the ring.
    pub fn steps(&self) -> usize {
        self.ring
    }

    /// Chunks per shard: 1, or 2 with load balancing.
    fn parts(&self) -> usize {
        self.splash.first().map_or(1, Vec::len)
    }

    /// The kernels of step `t`, `[q_part][kv_part]`.
    fn step(&self, t: usize) -> Result<&[Vec<ShardedSplash>], CollectiveError> {
        self.splash.get(t).map(Vec::as_slice).ok_or_else(|| {
            CollectiveError::local(format!(
                "{OP}: step {t} of a ring of {} steps; steps count from 0",
                self.ring
            ))
        })
    }

    /// The forward and backward plans of step `t`, `[q_part][kv_part]`.
    fn plans(&self, t: usize, segmented: bool) -> Result<Vec<Vec<Plans>>, CollectiveError> {
        let feats = features(segmented);
        self.step(t)?
            .iter()
            .map(|row| {
                row.iter()
                    .map(|s| Ok((s.forward_plan(feats)?, s.backward_plan(feats)?)))
                    .collect::<Result<Vec<_>, SplashError>>()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(local_error)
    }

    /// Adds the query and key segment ids of the pair `(q_part, kv_part)` at step `t` (the
    /// segment ids at input `at`, whole and in natural order).
    #[allow(clippy::too_many_arguments)] // a builder, an environment and the pair's position
    fn add_segments(
        &self,
        f: &mut FuncBuilder<'_>,
        env: &mut HashMap<Tensor, Value>,
        x: &[Value],
        at: Option<usize>,
        shard: Value,
        t: usize,
        (q_part, kv_part): (usize, usize),
    ) -> Result<(), CollectiveError> {
        let Some(at) = at else {
            return Ok(());
        };
        let (ring, len) = (self.ring, self.len);
        let q = part_start(f, shard, 0, ring, q_part, len)?;
        let kv = part_start(f, shard, ring - t, ring, kv_part, len)?;
        Segments { full: x[at] }.add_to(f, env, (Some(q), len), (Some(kv), len))
    }

    /// Step `t` of the forward: attends this device's queries `q` to the K/V shard in hand
    /// (`k`, `v`: the shard of position `r - t`, [`KeyShard`]) and merges the result into
    /// `partial` (the steps before; `None` at step 0). `shard` is the device's position on
    /// the ring (`axis_index::<A>()`).
    #[allow(clippy::too_many_arguments)] // the step, three tensors, the offset, segments, state
    pub fn forward_step<'p, M, B, H, Q, K, V>(
        &self,
        p: &'p Spmd<'_, M>,
        t: usize,
        shard: &AxisIndex<'p, M, A>,
        q: &DTensor<'p, M, Q>,
        k: &DTensor<'p, M, K>,
        v: &DTensor<'p, M, V>,
        segment_ids: Option<&DTensor<'p, M, WholeSegmentIds<B>>>,
        partial: Option<RingPartial<'p, M, B, H, A>>,
    ) -> Result<RingPartial<'p, M, B, H, A>, CollectiveError>
    where
        M: MeshShape + HasAxis<A>,
        B: DimSharding<M>,
        H: DimSharding<M>,
        Q: QueryShard<A, Batch = B, Heads = H>,
        K: KeyShard<A, Batch = B, Heads = H>,
        V: KeyShard<A, Batch = B, Heads = H>,
    {
        self.shapes.check_qkv(OP, q, k, v)?;
        let plans = self.plans(t, segment_ids.is_some())?;
        let parts = self.parts();
        let mut inputs = Inputs::new(&[q, k, v, shard]);
        let seg = inputs.optional(segment_ids.map(|x| x as _));
        let acc = inputs.optional(partial.as_ref().map(|a| &a.out as _));
        inputs.optional(partial.as_ref().map(|a| &a.lse as _));
        let (out, lse) = p.local_results(&inputs.values, |f, x| {
            let (mut outs, mut lses) = (Vec::with_capacity(parts), Vec::with_capacity(parts));
            for (hq, row) in plans.into_iter().enumerate() {
                // This query part's result so far, if any.
                let mut merged = match acc {
                    Some(i) => {
                        let out = seq_part(f, x[i], hq, parts)?;
                        let lse = seq_part(f, x[i + 1], hq, parts)?;
                        Some([out, lse_to_kernel(f, lse)?])
                    }
                    None => None,
                };
                for (hk, (forward, backward)) in row.into_iter().enumerate() {
                    let mut env = HashMap::from([
                        (Tensor::Q, seq_part(f, x[0], hq, parts)?),
                        (Tensor::K, seq_part(f, x[1], hk, parts)?),
                        (Tensor::V, seq_part(f, x[2], hk, parts)?),
                    ]);
                    self.add_segments(f, &mut env, x, seg, x[3], t, (hq, hk))?;
                    lower_forward(f, &forward, backward, &mut env, Some(x[3]))?;
                    let part = [f.convert(env[&Tensor::Out], DType::F32)?, env[&Tensor::Lse]];
                    merged = Some(match merged {
                        None => part,
                        Some(a) => merge_partials(f, a, part)?,
                    });
                }
                let [out, lse] = merged.ok_or_else(|| CollectiveError::local("no key part"))?;
                outs.push(out);
                lses.push(lse);
            }
            let lse = seq_concat(f, &lses)?;
            Ok(vec![seq_concat(f, &outs)?, lse_from_kernel(f, lse)?])
        })?;
        Ok(RingPartial { out, lse })
    }
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
