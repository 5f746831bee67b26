//! The all-gather attention op: this device's queries against every key.
//!
//! With load balancing under a causal mask the keys need not be put back in natural order:
//! device `r` holds chunks `r` (part 0) and `2U - 1 - r` (part 1), so gathering the parts
//! separately gives the first half of the sequence in natural order (part 0 of every device)
//! and the second half in reverse chunk order (part 1), which is the second half exactly
//! reversed when each device reverses its part 1 before the gather (`len` rows, not `S`).
//! Then each device makes three calls ([`AllGatherAttention::forward_halves`]): part 0
//! against the first half (causal at its offset), part 1 against the first half (every key
//! visible), and part 1 reversed against the reversed second half, where the causal mask
//! reads `key >= query + r len` (a one-sided local window); part 1's two results merge by
//! logsumexp. That replaces the reorder of the whole gathered K/V (and its gradient) with
//! `len`-row reverses and one merge.

use std::collections::HashMap;
use std::marker::PhantomData;

use tessera_collectives::{
    CollectiveError, DTensor, DimSharding, HasAxis, MeshAxis, MeshShape, Spmd,
};
use tessera_dsl::DType;
use tessera_hlo::{FuncBuilder, Value};
use tessera_splash::{Dims, Mask, SeqOffsets, ShardedSplash, Tensor};

use super::super::config::inverse;
use super::super::spmd::{
    lower_forward, lse_from_kernel, part_start, reorder_chunks, seq_concat, seq_part,
};
use super::super::{ContextParallel, CpError};
use super::ring_steps::merge_partials;
use super::{
    add_segments, expect_lengths, features, local_error, AxisIndex, BySequence, BySequenceLse,
    Inputs, LocalShapes, Plans, QueryShard, WholeKeys, WholeSegmentIds,
};

const OP: &str = "all-gather attention";

/// Splash attention of this device's block of queries (the sequence split over `A`) against
/// the whole K/V, with the mask's tables for the block's offset (MaxText's all-gather
/// strategy). With load balancing a device's block is two chunks (zigzag): under a causal
/// mask they attend the gathered halves of K/V ([`Self::forward_halves`], see the module
/// docs); under other masks each attends the whole K/V, which arrive in the program's
/// (zigzag) order and are put back in natural order, at its own offset ([`Self::forward`]).
#[derive(Debug, Clone)]
pub struct AllGatherAttention<A> {
    /// Per query part, the attention of every device's part.
    splash: Vec<ShardedSplash>,
    shapes: LocalShapes,
    /// The sequence length `S`.
    seq: usize,
    /// Devices on `A`.
    devices: usize,
    /// The natural chunk order of K/V gathered in the program's order (with load balancing).
    natural: Option<Vec<usize>>,
    /// With load balancing under a causal mask: the calls over the gathered halves.
    halves: Option<HalvesCalls>,
    _axis: PhantomData<fn() -> A>,
}

/// The three calls of [`AllGatherAttention::forward_halves`] (see the module docs), each
/// `len` queries against `S / 2` keys.
#[derive(Debug, Clone)]
struct HalvesCalls {
    /// Part 0 (chunk `r`) against the first half: causal, queries from `r len`.
    first: ShardedSplash,
    /// Part 1 (chunk `2U - 1 - r`) against the first half: every key visible.
    second_on_first: ShardedSplash,
    /// Part 1 reversed against the second half reversed: key `g` visible to query `i` iff
    /// `g >= i + r len`.
    second_on_second: ShardedSplash,
}

impl HalvesCalls {
    /// The calls for `cp` (load-balanced, causal), or `None` when its mask is another, or
    /// when its blocks do not fit half the keys (a key block that divides `S` but not `S / 2`,
    /// or one the TPU rules take only as the whole `S`): the whole gathered K/V serve then.
    fn of(cp: &ContextParallel) -> Option<Self> {
        if !(cp.load_balance && cp.mask == Mask::causal()) {
            return None;
        }
        let u = cp.devices;
        // Each call: one chunk of `len` queries (the local query length with load
        // balancing) against half the sequence.
        let local = cp.local_dims();
        let len = local.q_len;
        let dims = Dims {
            kv_len: local.kv_len / 2,
            ..local
        };
        let at = |q: &dyn Fn(usize) -> usize| -> Vec<SeqOffsets> {
            (0..u).map(|r| SeqOffsets { q: q(r), kv: 0 }).collect()
        };
        let splash = |mask: Mask, offsets: Vec<SeqOffsets>| {
            ShardedSplash::new(
                mask,
                dims,
                cp.dtype,
                cp.block_sizes,
                cp.options,
                cp.lowering.clone(),
                &offsets,
            )
        };
        let from_own_chunk = at(&|r| r * len);
        // Everything else about the blocks was validated with the configuration.
        Some(HalvesCalls {
            first: splash(Mask::causal(), from_own_chunk.clone()).ok()?,
            second_on_first: splash(Mask::Full, at(&|_| 0)).ok()?,
            second_on_second: splash(
                Mask::Local {
                    left: Some(0),
                    right: None,
                    offset: 0,
                },
                from_own_chunk,
            )
            .ok()?,
        })
    }

    /// Each call's forward and backward plans, in the order of the fields.
    fn plans(&self, segmented: bool) -> Result<[Plans; 3], CollectiveError> {
        let feats = features(segmented);
        let plans = |s: &ShardedSplash| -> Result<Plans, CollectiveError> {
            Ok((
                s.forward_plan(feats).map_err(local_error)?,
                s.backward_plan(feats).map_err(local_error)?,
            ))
        };
        Ok([
            plans(&self.first)?,
            plans(&self.second_on_first)?,
            plans(&self.second_on_second)?,
        ])
    }
}

/// Reverses dim 2 (the sequence) of `x`.
fn reverse_seq(f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, CollectiveError> {
    Ok(f.reverse(x, &[2])?)
}

/// `forward`'s results: `out [B, H, S/U, Dv]` and `lse [B, H, S/U]`.
type Forward<'p, M, B, H, A> = (
    DTensor<'p, M, BySequence<B, H, A>>,
    DTensor<'p, M, BySequenceLse<B, H, A>>,
);

impl<A: MeshAxis> AllGatherAttention<A> {
    /// The kernels of a configuration whose devices attend their queries (a shard, in `parts`
    /// chunks) against every key (all-gather): one sharded attention per query part, at the offsets of the strategy's calls.
    pub fn new(cp: &ContextParallel) -> Result<Self, CpError> {
        cp.validate()?;
        let seq = cp.dims.q_len;
        expect_lengths(cp, OP, (seq / (cp.devices * cp.parts()).max(1), seq))?;
        let calls = cp.kernel_calls();
        Ok(AllGatherAttention {
            splash: calls[0]
                .iter()
                .map(|offsets| cp.sharded_splash(offsets))
                .collect::<Result<_, _>>()?,
            shapes: LocalShapes::of(cp, cp.parts(), 1),
            seq: cp.dims.q_len,
            devices: cp.devices,
            natural: cp.load_balance.then(|| inverse(&cp.chunk_order())),
            halves: HalvesCalls::of(cp),
            _axis: PhantomData,
        })
    }

    /// Per query part, the forward and backward plans.
    fn plans(&self, segmented: bool) -> Result<Vec<Plans>, CollectiveError> {
        let feats = features(segmented);
        self.splash
            .iter()
            .map(|s| Ok((s.forward_plan(feats)?, s.backward_plan(feats)?)))
            .collect::<Result<_, _>>()
            .map_err(local_error)
    }

    /// The gathered K or V in natural order (they arrive in the program's order).
    fn natural(&self, f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, CollectiveError> {
        match &self.natural {
            Some(order) => reorder_chunks(f, x, 2, order),
            None => Ok(x),
        }
    }

    /// Where query part `part` of the device at `shard` starts, and its length.
    fn query_part(
        &self,
        f: &mut FuncBuilder<'_>,
        shard: Value,
        part: usize,
    ) -> Result<(Option<Value>, usize), CollectiveError> {
        let u = self.devices;
        let len = self.seq / (u * self.splash.len());
        Ok((Some(part_start(f, shard, 0, u, part, len)?), len))
    }

    /// `out` and `lse` of this device's queries. `shard` is the device's position on `A`
    /// (`axis_index::<A>()`); `q` holds the device's block of the sequence
    /// ([`QueryShard`]), `k` and `v` the whole sequence ([`WholeKeys`]). Each kernel call is
    /// a custom-VJP unit: [`Spmd::vjp`] differentiates it with splash's backward kernels, and
    /// the gathered K/V's cotangents (this device's partial sums) go back through the
    /// gather's transpose, a reduce-scatter.
    pub fn forward<'p, M, B, H, Q, K, V>(
        &self,
        p: &'p Spmd<'_, M>,
        shard: &AxisIndex<'p, M, A>,
        q: &DTensor<'p, M, Q>,
        k: &DTensor<'p, M, K>,
        v: &DTensor<'p, M, V>,
        segment_ids: Option<&DTensor<'p, M, WholeSegmentIds<B>>>,
    ) -> Result<Forward<'p, M, B, H, A>, CollectiveError>
    where
        M: MeshShape + HasAxis<A>,
        B: DimSharding<M>,
        H: DimSharding<M>,
        Q: QueryShard<A, Batch = B, Heads = H>,
        K: WholeKeys<A, Batch = B, Heads = H>,
        V: WholeKeys<A, Batch = B, Heads = H>,
    {
        self.shapes.check_qkv(OP, q, k, v)?;
        let plans = self.plans(segment_ids.is_some())?;
        let mut inputs = Inputs::new(&[q, k, v, shard]);
        let seg = inputs.optional(segment_ids.map(|x| x as _));
        let keep = self
            .splash
            .first()
            .is_some_and(ShardedSplash::keeps_residuals);
        p.local_results(&inputs.values, |f, x| {
            let (k, v) = (self.natural(f, x[1])?, self.natural(f, x[2])?);
            let (mut outs, mut lses) = (Vec::new(), Vec::new());
            for (h, (forward, backward)) in plans.into_iter().enumerate() {
                let q = seq_part(f, x[0], h, self.splash.len())?;
                let mut env = HashMap::from([(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)]);
                let queries = self.query_part(f, x[3], h)?;
                add_segments(f, &mut env, x, seg, queries, (None, self.seq))?;
                lower_forward(f, &forward, backward, &mut env, Some(x[3]), keep)?;
                outs.push(env[&Tensor::Out]);
                lses.push(lse_from_kernel(f, env[&Tensor::Lse])?);
            }
            Ok(vec![seq_concat(f, &outs)?, seq_concat(f, &lses)?])
        })
    }

    /// Whether this op attends the gathered halves ([`Self::forward_halves`]): load
    /// balancing under a causal mask.
    pub fn attends_halves(&self) -> bool {
        self.halves.is_some()
    }

    /// This device's K or V shard (dim 2, the sequence, split over `A` in two parts) as the
    /// two halves [`Self::forward_halves`] takes once each is gathered over `A`: part 0 as
    /// it is, part 1 reversed along the sequence.
    pub fn shard_halves<'p, M: MeshShape, S>(
        x: &DTensor<'p, M, S>,
    ) -> Result<[DTensor<'p, M, S>; 2], CollectiveError> {
        Ok([
            x.map_local(|f, x| seq_part(f, x, 0, 2))?,
            x.map_local(|f, x| {
                let part = seq_part(f, x, 1, 2)?;
                reverse_seq(f, part)
            })?,
        ])
    }

    /// `out` and `lse` of this device's queries from the gathered halves of K and V (see the
    /// module docs): `k[0]`, `v[0]` the first half of the sequence in natural order (part 0
    /// of every device's shard, gathered), `k[1]`, `v[1]` the second half reversed (part 1 of
    /// every shard reversed along the sequence, then gathered). Only for a configuration
    /// where [`Self::attends_halves`]; `shard`, `q` and `segment_ids` as for [`Self::forward`].
    pub fn forward_halves<'p, M, B, H, Q, K, V>(
        &self,
        p: &'p Spmd<'_, M>,
        shard: &AxisIndex<'p, M, A>,
        q: &DTensor<'p, M, Q>,
        k: [&DTensor<'p, M, K>; 2],
        v: [&DTensor<'p, M, V>; 2],
        segment_ids: Option<&DTensor<'p, M, WholeSegmentIds<B>>>,
    ) -> Result<Forward<'p, M, B, H, A>, CollectiveError>
    where
        M: MeshShape + HasAxis<A>,
        B: DimSharding<M>,
        H: DimSharding<M>,
        Q: QueryShard<A, Batch = B, Heads = H>,
        K: WholeKeys<A, Batch = B, Heads = H>,
        V: WholeKeys<A, Batch = B, Heads = H>,
    {
        let halves = self.halves.as_ref().ok_or_else(|| {
            CollectiveError::local(format!(
                "{OP}: the gathered halves serve load balancing under a causal mask; this \
                 configuration attends the whole gathered K/V (`forward`)"
            ))
        })?;
        let mut half = self.shapes.clone();
        half.k[2] /= 2;
        half.v[2] /= 2;
        half.check_qkv(OP, q, k[0], v[0])?;
        half.check_kv(OP, k[1], v[1])?;
        let [first, second_on_first, second_on_second] = halves.plans(segment_ids.is_some())?;
        let mut inputs = Inputs::new(&[q, k[0], k[1], v[0], v[1], shard]);
        let seg = inputs.optional(segment_ids.map(|x| x as _));
        let seq = self.seq;
        let keep = self
            .splash
            .first()
            .is_some_and(ShardedSplash::keeps_residuals);
        p.local_results(&inputs.values, |f, x| {
            let [q, k0, k1, v0, v1, r] = [x[0], x[1], x[2], x[3], x[4], x[5]];
            let (q0, q1) = (seq_part(f, q, 0, 2)?, seq_part(f, q, 1, 2)?);
            let zero = f.scalar(0.0, DType::I32)?;
            let half_start = f.scalar((seq / 2) as f64, DType::I32)?;
            // Where each query part starts in the natural sequence, and its length.
            let queries = [self.query_part(f, r, 0)?, self.query_part(f, r, 1)?];
            // One call: its `[out, lse [B, H, len]]`, the queries and keys reversed first
            // (and the results back) when `reversed`.
            let call = |f: &mut FuncBuilder<'_>,
                        (forward, backward): Plans,
                        [q, k, v]: [Value; 3],
                        [queries, keys]: [(Option<Value>, usize); 2],
                        reversed: bool|
             -> Result<[Value; 2], CollectiveError> {
                let mut env = HashMap::from([(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)]);
                add_segments(f, &mut env, x, seg, queries, keys)?;
                if reversed {
                    for t in [Tensor::Q, Tensor::QSegments, Tensor::KvSegments] {
                        if let Some(&s) = env.get(&t) {
                            env.insert(t, reverse_seq(f, s)?);
                        }
                    }
                }
                lower_forward(f, &forward, backward, &mut env, Some(r), keep)?;
                let (mut out, mut lse) =
                    (env[&Tensor::Out], lse_from_kernel(f, env[&Tensor::Lse])?);
                if reversed {
                    out = reverse_seq(f, out)?;
                    lse = reverse_seq(f, lse)?;
                }
                Ok([out, lse])
            };
            let [out0, lse0] = call(
                f,
                first,
                [q0, k0, v0],
                [queries[0], (Some(zero), seq / 2)],
                false,
            )?;
            let mut second = Vec::with_capacity(2);
            for (plans, kv, kv_at, reversed) in [
                (second_on_first, [k0, v0], zero, false),
                (second_on_second, [k1, v1], half_start, true),
            ] {
                let [out, lse] = call(
                    f,
                    plans,
                    [q1, kv[0], kv[1]],
                    [queries[1], (Some(kv_at), seq / 2)],
                    reversed,
                )?;
                second.push([f.convert(out, DType::F32)?, lse]);
            }
            let [out1, lse1] = merge_partials(f, &second)?;
            let dtype = f.value_type(out0)?.dtype;
            let out1 = f.convert(out1, dtype)?;
            Ok(vec![
                seq_concat(f, &[out0, out1])?,
                seq_concat(f, &[lse0, lse1])?,
            ])
        })
    }
}
