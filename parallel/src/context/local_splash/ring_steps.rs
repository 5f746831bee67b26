//! The ring attention op: one step, this device's queries against the K/V shard in hand.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;

use tessera_collectives::{
    Collective, CollectiveError, CollectiveRecorder, DTensor, DimSharding, HasAxis, MeshAxis,
    MeshShape, Spmd,
};
use tessera_dsl::DType;
use tessera_hlo::autodiff::{backward_failed, VjpCall, VjpRule};
use tessera_hlo::{FuncBuilder, HloError, Value};
use tessera_splash::{lower_stages_on_shard, ShardedSplash, SplashError, Stage, Tensor};

use super::super::spmd::{
    lower_forward, lse_from_kernel, lse_to_kernel, part_start, seq_concat, seq_part, Segments,
};
use super::super::{ContextParallel, CpError};
use super::{
    expect_lengths, features, local_error, AxisIndex, BySequence, BySequenceLse, Inputs, KeyShard,
    LocalShapes, Plans, QueryShard, WholeSegmentIds,
};

const OP: &str = "ring attention";

/// One step of ring attention over the ring axis `A` (MaxText's ring strategy; the ring of a
/// Ulysses x ring hybrid): at step `t` the device at position `r` holds the K/V shard of
/// position `r - t` and attends its own queries to it, with the mask's tables for that pair
/// of offsets. With load balancing every shard is two chunks (zigzag), and each pair of a
/// query chunk and a key chunk is its own attention.
///
/// The steps' partial results merge by logsumexp as they come ([`RingPartial`]). Two ways to
/// run them:
///
/// - [`RingAttention::forward`], the whole ring as one custom-VJP unit: its backward runs the
///   ring again, K/V and their gradient accumulators travelling together, each step's
///   backward kernels reading the final `out` and `lse`. Only `q`, `k`, `v`, `out` and `lse`
///   outlive the forward, so a model that recomputes the layer in its backward holds one K/V
///   shard in flight, not one per step. This is what the strategies use.
/// - [`RingAttention::forward_step`], one step as a typed op whose kernel calls are custom-VJP
///   units: [`Spmd::vjp`] differentiates the steps and the merges (the merge passes a
///   cotangent to every step's `lse` as well as its `out`), the K/V cotangents travelling
///   back through the permutes' transposes; the backward keeps every step's shard and
///   partial results.
#[derive(Debug)]
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

// By hand: a derive would ask `A` (a marker type) to be `Clone`.
impl<A> Clone for RingAttention<A> {
    fn clone(&self) -> Self {
        RingAttention {
            splash: self.splash.clone(),
            shapes: self.shapes.clone(),
            ring: self.ring,
            len: self.len,
            _axis: PhantomData,
        }
    }
}

/// The attention of this device's queries to the K/V shards seen so far, merged by
/// logsumexp: `out [B, H, S/R, Dv]` (f32, normalised) and `lse [B, H, S/R]` (f32).
#[derive(Debug, Clone)]
pub struct RingPartial<'p, M, B, H, A> {
    /// The normalised output so far (f32).
    pub out: DTensor<'p, M, BySequence<B, H, A>>,
    /// The logsumexp so far (f32; `-inf` where no key was visible yet).
    pub lse: DTensor<'p, M, BySequenceLse<B, H, A>>,
}

impl<A: MeshAxis> RingAttention<A> {
    /// The kernels of every step of a configuration whose devices attend one ring chunk of
    /// queries against one of keys per call (ring, USP's ring axis), at the offsets of the
    /// strategy's calls:
    /// one step per device on the ring, each a call per pair of a query part and a key part.
    pub fn new(cp: &ContextParallel) -> Result<Self, CpError> {
        cp.validate()?;
        let parts = cp.parts();
        let calls = cp.kernel_calls();
        let ring = calls.len();
        let chunk = cp.dims.q_len / (ring * parts).max(1);
        expect_lengths(cp, OP, (chunk, chunk))?;
        let splash = calls
            .iter()
            .map(|step| {
                step.chunks(parts)
                    .map(|row| row.iter().map(|o| cp.sharded_splash(o)).collect())
                    .collect::<Result<Vec<Vec<_>>, _>>()
            })
            .collect::<Result<_, _>>()?;
        Ok(RingAttention {
            splash,
            shapes: LocalShapes::of(cp, parts, parts),
            ring,
            len: chunk,
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

    /// Adds the query and key segment ids of the pair `(q_part, kv_part)` at step `t` (from
    /// `segments`, the whole segment ids in natural order) to a plan's environment.
    #[allow(clippy::too_many_arguments)] // a builder, an environment and the pair's position
    fn add_segments(
        &self,
        f: &mut FuncBuilder<'_>,
        env: &mut HashMap<Tensor, Value>,
        segments: Option<Value>,
        shard: Value,
        t: usize,
        (q_part, kv_part): (usize, usize),
    ) -> Result<(), CollectiveError> {
        let Some(full) = segments else {
            return Ok(());
        };
        let (ring, len) = (self.ring, self.len);
        let q = part_start(f, shard, 0, ring, q_part, len)?;
        let kv = part_start(f, shard, ring - t, ring, kv_part, len)?;
        Segments { full }.add_to(f, env, (Some(q), len), (Some(kv), len))
    }

    /// Step `t` on local values: the query parts `q` against the K/V parts in hand (`k`,
    /// `v`: one value per chunk of the shard), merged into `merged` (`[out f32, lse]` per
    /// query part, of the steps before); returns `[out f32, lse]` per query part. Each kernel
    /// call is a custom-VJP unit when `differentiable`, else its forward kernels alone.
    ///
    /// The parts stay separate values (the whole ring slices and concatenates nothing per
    /// step), and each query part's running result and this step's partial results merge in
    /// one elementwise expression ([`merge_partials`]), which XLA fuses into one pass over
    /// the chunk.
    #[allow(clippy::too_many_arguments)] // the step, its plans, q/k/v, the offset, segments, state
    fn attend_step(
        &self,
        f: &mut FuncBuilder<'_>,
        t: usize,
        plans: &[Vec<Plans>],
        [q, k, v]: [&[Value]; 3],
        (shard, segments): (Value, Option<Value>),
        merged: Option<Vec<[Value; 2]>>,
        differentiable: bool,
    ) -> Result<Vec<[Value; 2]>, CollectiveError> {
        let keep = (self.splash.iter().flatten().flatten().next())
            .is_some_and(ShardedSplash::keeps_residuals);
        let mut merged_parts = Vec::with_capacity(plans.len());
        for (hq, row) in plans.iter().enumerate() {
            // This query part's result so far, if any, then each key part's.
            // The merges run on `lse [B, H, S]` (the kernels' `[B, H, 1, S]` reshaped).
            let mut partials: Vec<[Value; 2]> =
                merged.as_ref().map(|m| m[hq]).into_iter().collect();
            for (hk, (forward, backward)) in row.iter().enumerate() {
                let mut env =
                    HashMap::from([(Tensor::Q, q[hq]), (Tensor::K, k[hk]), (Tensor::V, v[hk])]);
                self.add_segments(f, &mut env, segments, shard, t, (hq, hk))?;
                if differentiable {
                    lower_forward(f, forward, backward.clone(), &mut env, Some(shard), keep)?;
                } else {
                    lower_stages(f, forward, &mut env, shard)?;
                }
                partials.push([
                    f.convert(env[&Tensor::Out], DType::F32)?,
                    lse_from_kernel(f, env[&Tensor::Lse])?,
                ]);
            }
            merged_parts.push(merge_partials(f, &partials)?);
        }
        Ok(merged_parts)
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
        let mut inputs = Inputs::new(&[q, k, v, shard]);
        let seg = inputs.optional(segment_ids.map(|x| x as _));
        let acc = inputs.optional(partial.as_ref().map(|a| &a.out as _));
        inputs.optional(partial.as_ref().map(|a| &a.lse as _));
        let parts = self.parts();
        let (out, lse) = p.local_results(&inputs.values, |f, x| {
            let merged = match acc {
                Some(i) => Some(zip_parts(
                    seq_parts(f, x[i], parts)?,
                    seq_parts(f, x[i + 1], parts)?,
                )),
                None => None,
            };
            let segments = seg.map(|i| x[i]);
            let [q, k, v] = [x[0], x[1], x[2]].map(|x| seq_parts(f, x, parts));
            let step = self.attend_step(
                f,
                t,
                &plans,
                [&q?, &k?, &v?],
                (x[3], segments),
                merged,
                true,
            )?;
            Ok(concat_partials(f, &step)?.to_vec())
        })?;
        Ok(RingPartial { out, lse })
    }

    /// The whole ring: this device's queries `q` against every K/V shard in turn, starting
    /// with its own (`k`, `v`), the shards rotated by one position over `A` between the
    /// steps; `shard` is the device's position on the ring. One custom-VJP unit on `q`, `k`,
    /// `v` whose backward is a second ring (see [`RingAttention`]).
    pub fn forward<'p, M, B, H, Q, K, V>(
        &self,
        p: &'p Spmd<'_, M>,
        shard: &AxisIndex<'p, M, A>,
        q: &DTensor<'p, M, Q>,
        k: &DTensor<'p, M, K>,
        v: &DTensor<'p, M, V>,
        segment_ids: Option<&DTensor<'p, M, WholeSegmentIds<B>>>,
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
        let segmented = segment_ids.is_some();
        let plans = (0..self.ring)
            .map(|t| self.plans(t, segmented))
            .collect::<Result<Vec<_>, _>>()?;
        let shift = Collective::ring_shift(p.mesh().axis_by_name(A::NAME)?, 1);
        let recorder = p.collective_recorder();
        let mut inputs = Inputs::new(&[q, k, v, shard]);
        let seg = inputs.optional(segment_ids.map(|x| x as _));
        let (out, lse) = p.local_results(&inputs.values, |f, x| {
            let unit = Rc::new(WholeRing {
                op: self.clone(),
                plans,
                shard: x[3],
                segments: seg.map(|i| x[i]),
                shift,
                recorder,
            });
            f.custom_vjp(unit.clone(), &x[..3], |f, qkv| {
                Ok::<_, CollectiveError>(unit.forward(f, [qkv[0], qkv[1], qkv[2]])?.to_vec())
            })
        })?;
        Ok(RingPartial { out, lse })
    }
}

/// The whole ring as one custom-VJP unit ([`RingAttention::forward`]): its forward, and its
/// backward as a [`VjpRule`].
struct WholeRing<A> {
    op: RingAttention<A>,
    /// `[t][q_part][kv_part]`.
    plans: Vec<Vec<Vec<Plans>>>,
    /// The device's position on the ring.
    shard: Value,
    /// The whole segment ids, if any.
    segments: Option<Value>,
    /// The K/V rotation: one position along the ring.
    shift: Collective,
    recorder: CollectiveRecorder,
}

impl<A: MeshAxis> fmt::Debug for WholeRing<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WholeRing")
            .field("axis", &A::NAME)
            .field("steps", &self.plans.len())
            .field("segmented", &self.segments.is_some())
            .finish_non_exhaustive()
    }
}

impl<A: MeshAxis> WholeRing<A> {
    /// Every step, the next K/V shard in flight while the current one is attended to:
    /// `[out f32, lse]`.
    ///
    /// Nothing in the data orders step `t + 1` after step `t` (each attends its own shard;
    /// only the merges chain), and XLA's scheduler would start every transfer and kernel
    /// early, holding every shard and partial result at once. An optimization barrier after
    /// each step ties the next shard to the merged result, so one step runs at a time with
    /// one transfer in flight. K/V travel as their chunks and the running result is kept per
    /// query chunk, so no step slices or concatenates a whole shard.
    fn forward(
        &self,
        f: &mut FuncBuilder<'_>,
        [q, k, v]: [Value; 3],
    ) -> Result<[Value; 2], CollectiveError> {
        let parts = self.op.parts();
        let q = seq_parts(f, q, parts)?;
        let (mut k, mut v) = (seq_parts(f, k, parts)?, seq_parts(f, v, parts)?);
        let mut merged = None;
        for (t, plans) in self.plans.iter().enumerate() {
            let next = self.next_shard(f, t, &[&k, &v])?;
            let context = (self.shard, self.segments);
            let step = self
                .op
                .attend_step(f, t, plans, [&q, &k, &v], context, merged, false)?;
            merged = Some(match next {
                Some(next) => {
                    // `[k parts, v parts, (out, lse) per query part]` through one barrier.
                    let mut tied: Vec<Value> = next.concat();
                    tied.extend(step.iter().flatten());
                    let tied = f.optimization_barrier_all(&tied)?;
                    let (kv, rest) = tied.split_at(2 * parts);
                    k = kv[..parts].to_vec();
                    v = kv[parts..].to_vec();
                    rest.chunks(2).map(|p| [p[0], p[1]]).collect()
                }
                None => step,
            });
        }
        let merged =
            merged.ok_or_else(|| CollectiveError::local("a ring has at least one step"))?;
        concat_partials(f, &merged)
    }

    /// The chunks of each of `xs` one position along the ring: the K/V shard of step
    /// `t + 1` (`None` after the last step).
    fn next_shard(
        &self,
        f: &mut FuncBuilder<'_>,
        t: usize,
        xs: &[&[Value]],
    ) -> Result<Option<Vec<Vec<Value>>>, CollectiveError> {
        if t + 1 == self.plans.len() {
            return Ok(None);
        }
        self.shift_all(f, xs).map(Some)
    }

    /// Each chunk of each of `xs` sent one position along the ring.
    fn shift_all(
        &self,
        f: &mut FuncBuilder<'_>,
        xs: &[&[Value]],
    ) -> Result<Vec<Vec<Value>>, CollectiveError> {
        xs.iter()
            .map(|parts| {
                parts
                    .iter()
                    .map(|&x| self.recorder.emit(f, &self.shift, x))
                    .collect()
            })
            .collect()
    }

    /// The backward ring. Every step's backward kernels read the final `out`, `lse`, `dout`
    /// and `Di = rowsum(out dout) - dlse` (the softmax over all keys is what each block's
    /// probabilities are relative to), so the steps are independent: dQ adds up locally,
    /// and each shard's dK/dV accumulate (in f32) in a buffer that travels with the shard,
    /// one more shift than K/V bringing it home. Barriers order the steps as in the forward.
    fn backward(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, CollectiveError> {
        let (&[q, k, v], &[out, lse]) = (call.inputs, call.outputs) else {
            return Err(CollectiveError::local(
                "the ring unit has three inputs and two outputs",
            ));
        };
        let dtype = f.value_type(q)?.dtype;
        let dout = match call.cotangents[0] {
            Some(d) => d,
            None => {
                let t = f.value_type(out)?.clone();
                f.splat(0.0, t)?
            }
        };
        let (out, dout) = (f.convert(out, dtype)?, f.convert(dout, dtype)?);
        let parts = self.op.parts();
        // Per query part: the residuals every step's kernels read.
        let mut residuals = Vec::with_capacity(parts);
        for hq in 0..parts {
            let lse_part = seq_part(f, lse, hq, parts)?;
            let mut env = HashMap::from([
                (Tensor::Out, seq_part(f, out, hq, parts)?),
                (Tensor::DOut, seq_part(f, dout, hq, parts)?),
                (Tensor::Lse, lse_to_kernel(f, lse_part)?),
            ]);
            let prep = &self.plans[0][hq][0].1[..1];
            lower_stages(f, prep, &mut env, self.shard)?;
            if let Some(dlse) = call.cotangents[1] {
                let dlse = seq_part(f, dlse, hq, parts)?;
                let dlse = lse_to_kernel(f, dlse)?;
                let di = f.sub(env[&Tensor::Di], dlse)?;
                env.insert(Tensor::Di, di);
            }
            residuals.push(env);
        }
        let q = seq_parts(f, q, parts)?;
        let (mut k, mut v) = (seq_parts(f, k, parts)?, seq_parts(f, v, parts)?);
        let mut dq: Vec<Option<Value>> = vec![None; parts];
        // The dK/dV accumulators of the shard in hand, per chunk (f32); they arrive with it.
        let mut dkv: [Vec<Option<Value>>; 2] = [vec![None; parts], vec![None; parts]];
        for (t, plans) in self.plans.iter().enumerate() {
            let next = self.next_shard(f, t, &[&k, &v])?;
            let [dk, dv] = &mut dkv;
            for (hq, row) in plans.iter().enumerate() {
                for (hk, (_, backward)) in row.iter().enumerate() {
                    let mut env = residuals[hq].clone();
                    env.insert(Tensor::Q, q[hq]);
                    env.insert(Tensor::K, k[hk]);
                    env.insert(Tensor::V, v[hk]);
                    self.op
                        .add_segments(f, &mut env, self.segments, self.shard, t, (hq, hk))?;
                    lower_stages(f, &backward[1..], &mut env, self.shard)?;
                    accumulate(f, &mut dq[hq], env[&Tensor::Dq])?;
                    accumulate(f, &mut dk[hk], env[&Tensor::Dk])?;
                    accumulate(f, &mut dv[hk], env[&Tensor::Dv])?;
                }
            }
            let [dk, dv] = dkv.clone().map(complete_parts);
            let (mut dk, mut dv) = (dk?, dv?);
            if let Some(next) = next {
                // `[k parts, v parts, dk parts, dv parts, dq parts]` through one barrier.
                let mut tied: Vec<Value> = next.concat();
                tied.extend(dk.iter().chain(&dv));
                tied.extend(dq.iter().flatten());
                let tied = f.optimization_barrier_all(&tied)?;
                let tied: Vec<Vec<Value>> = tied.chunks(parts).map(<[Value]>::to_vec).collect();
                [k, v, dk, dv] = [0, 1, 2, 3].map(|i| tied[i].clone());
                dq = tied[4].iter().copied().map(Some).collect();
            }
            let [dk, dv]: [Vec<Value>; 2] = self
                .shift_all(f, &[&dk, &dv])?
                .try_into()
                .map_err(|_| CollectiveError::local("two accumulators travel"))?;
            dkv = [dk, dv].map(|x| x.into_iter().map(Some).collect());
        }
        let [dk, dv] = dkv;
        let [dq, dk, dv] = [dq, dk, dv].map(|x| concat_parts(f, x));
        let (dq, dk, dv) = (dq?, dk?, dv?);
        let mut grads = Vec::with_capacity(3);
        for (g, x) in [dq, dk, dv].into_iter().zip(call.inputs) {
            let want = f.value_type(*x)?.dtype;
            grads.push(Some(f.convert(g, want)?));
        }
        Ok(grads)
    }
}

impl<A: MeshAxis> VjpRule for WholeRing<A> {
    fn name(&self) -> &str {
        OP
    }

    fn vjp(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, HloError> {
        self.backward(f, call).map_err(|e| backward_failed(OP, e))
    }
}

/// Lowers `stages` (no custom VJP) with `shard` selecting the per-shard tables.
fn lower_stages(
    f: &mut FuncBuilder<'_>,
    stages: &[Stage],
    env: &mut HashMap<Tensor, Value>,
    shard: Value,
) -> Result<(), CollectiveError> {
    lower_stages_on_shard(f, stages, env, Some(shard)).map_err(local_error)
}

/// `sum += x` in f32 (`sum = x` at first).
fn accumulate(
    f: &mut FuncBuilder<'_>,
    sum: &mut Option<Value>,
    x: Value,
) -> Result<(), CollectiveError> {
    let x = f.convert(x, DType::F32)?;
    *sum = Some(match *sum {
        None => x,
        Some(s) => f.add(s, x)?,
    });
    Ok(())
}

/// The sequence parts of a gradient, concatenated (every part has had a contribution).
fn concat_parts(
    f: &mut FuncBuilder<'_>,
    parts: Vec<Option<Value>>,
) -> Result<Value, CollectiveError> {
    seq_concat(f, &complete_parts(parts)?)
}

/// The `parts` equal chunks of a local value's sequence dim (2).
fn seq_parts(
    f: &mut FuncBuilder<'_>,
    x: Value,
    parts: usize,
) -> Result<Vec<Value>, CollectiveError> {
    (0..parts).map(|i| seq_part(f, x, i, parts)).collect()
}

/// `[out, lse]` per query part from the parts of `out` and of `lse`.
fn zip_parts(out: Vec<Value>, lse: Vec<Value>) -> Vec<[Value; 2]> {
    out.into_iter().zip(lse).map(|(o, l)| [o, l]).collect()
}

/// `[out, lse]` of the whole local sequence from `[out, lse]` per query part.
fn concat_partials(
    f: &mut FuncBuilder<'_>,
    parts: &[[Value; 2]],
) -> Result<[Value; 2], CollectiveError> {
    let out: Vec<Value> = parts.iter().map(|p| p[0]).collect();
    let lse: Vec<Value> = parts.iter().map(|p| p[1]).collect();
    Ok([seq_concat(f, &out)?, seq_concat(f, &lse)?])
}

/// The parts of a gradient, each of which has had a contribution.
fn complete_parts(parts: Vec<Option<Value>>) -> Result<Vec<Value>, CollectiveError> {
    parts
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| CollectiveError::local("a sequence part got no gradient"))
}

/// Merges attentions of the same queries over disjoint keys, each normalised with its own
/// logsumexp (`out [B, H, S, D]` f32, `lse [B, H, S]`), in one elementwise expression (XLA
/// fuses it into one pass over the outputs): with `m = max lse_i`,
/// `lse = m + log(sum e^(lse_i - m))` and `out = sum out_i e^(lse_i - lse)`.
/// A part that saw no key has `lse = -inf` and `out = 0` and drops out; when none did, the
/// result is `-inf` and 0 again.
pub(super) fn merge_partials(
    f: &mut FuncBuilder<'_>,
    parts: &[[Value; 2]],
) -> Result<[Value; 2], CollectiveError> {
    let Some((&[out0, lse0], rest)) = parts.split_first() else {
        return Err(CollectiveError::local("nothing to merge"));
    };
    if rest.is_empty() {
        return Ok([out0, lse0]);
    }
    let lse_type = f.value_type(lse0)?.clone();
    let out_type = f.value_type(out0)?.clone();
    let rows: Vec<i64> = (0..lse_type.dims.len() as i64).collect();
    let zero = f.splat(0.0, lse_type.clone())?;
    let one = f.splat(1.0, lse_type)?;
    let mut m = lse0;
    for &[_, lse] in rest {
        m = f.max(m, lse)?;
    }
    let finite = f.is_finite(m)?;
    let m = f.select(finite, m, zero)?;
    let mut weights = Vec::with_capacity(parts.len());
    for &[_, lse] in parts {
        let d = f.sub(lse, m)?;
        weights.push(f.exp(d)?);
    }
    let mut total = weights[0];
    for &w in &weights[1..] {
        total = f.add(total, w)?;
    }
    let log_total = f.log(total)?;
    let lse = f.add(m, log_total)?;
    let empty = f.eq(total, zero)?;
    let total = f.select(empty, one, total)?;
    let mut out = None;
    for (&[o, _], w) in parts.iter().zip(weights) {
        let w = f.div(w, total)?;
        let w = f.broadcast_in_dim(w, &out_type.dims, &rows)?;
        let scaled = f.mul(o, w)?;
        out = Some(match out {
            None => scaled,
            Some(acc) => f.add(acc, scaled)?,
        });
    }
    Ok([out.unwrap_or(out0), lse])
}
