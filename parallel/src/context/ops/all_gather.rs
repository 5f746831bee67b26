//! The all-gather attention op: this device's queries against every key.

use std::collections::HashMap;
use std::marker::PhantomData;

use tessera_collectives::{
    CollectiveError, DTensor, DimSharding, HasAxis, MeshAxis, MeshShape, Spmd, Varying,
};
use tessera_hlo::{FuncBuilder, Value};
use tessera_splash::{SeqOffsets, ShardedSplash, Stage, Tensor};

use super::super::{
    backward_env, chunk_of, lower_plan, lse_from_kernel, part_start, reorder_chunks, seq_concat,
    seq_part, zigzag_inverse, zigzag_order, ContextParallel, CpError, Strategy,
};
use super::{
    add_segments, expect_strategy, features, local_error, sum_in_f32, AxisIndex, BySequence,
    BySequenceRows, Inputs, LocalShapes, QueryShard, WholeKeys, WholeSegmentIds, WholeSequence,
};

const OP: &str = "all-gather attention";

/// Splash attention of this device's block of queries (the sequence split over `A`) against
/// the whole K/V, with the mask's tables for the block's offset (MaxText's all-gather
/// strategy). With load balancing a device's block is two chunks (zigzag), each attended at
/// its own offset; the whole K/V then arrive in the program's (zigzag) order.
#[derive(Debug, Clone)]
pub struct AllGatherAttention<A> {
    /// Per query part, the attention of every device's part.
    splash: Vec<ShardedSplash>,
    shapes: LocalShapes,
    /// The sequence length `S`.
    seq: usize,
    devices: usize,
    load_balance: bool,
    _axis: PhantomData<fn() -> A>,
}

/// `forward`'s results: `out [B, H, S/U, Dv]` and `lse [B, H, S/U]`.
type Forward<'p, M, B, H, A> = (
    DTensor<'p, M, BySequence<B, H, A>>,
    DTensor<'p, M, BySequenceRows<B, H, A>>,
);

/// `backward`'s results: `dq` of this device's queries, and `dk`, `dv` over the whole
/// sequence holding only this device's queries' contribution: partial sums over `A`.
type Backward<'p, M, B, H, A> = (
    DTensor<'p, M, BySequence<B, H, A>>,
    DTensor<'p, M, WholeSequence<B, H>, Varying<A>>,
    DTensor<'p, M, WholeSequence<B, H>, Varying<A>>,
);

/// Where every device's query part `part` attends: queries from chunk
/// [`chunk_of`]`(r, part)`, all keys.
pub(in crate::context) fn offsets(cp: &ContextParallel, part: usize) -> Vec<SeqOffsets> {
    let u = cp.devices;
    let len = cp.dims.q_len / (u * cp.parts());
    (0..u)
        .map(|r| SeqOffsets {
            q: chunk_of(r, part, u) * len,
            kv: 0,
        })
        .collect()
}

impl<A: MeshAxis> AllGatherAttention<A> {
    /// The kernels of an all-gather configuration: one sharded attention per query part.
    pub fn new(cp: &ContextParallel) -> Result<Self, CpError> {
        expect_strategy(
            cp,
            cp.strategy == Strategy::AllGather,
            "the all-gather attention op",
        )?;
        cp.validate()?;
        Ok(AllGatherAttention {
            splash: (0..cp.parts())
                .map(|h| cp.sharded_splash(&offsets(cp, h)))
                .collect::<Result<_, _>>()?,
            shapes: LocalShapes::of(cp, cp.parts(), 1),
            seq: cp.dims.q_len,
            devices: cp.devices,
            load_balance: cp.load_balance,
            _axis: PhantomData,
        })
    }

    fn plans(&self, segmented: bool, backward: bool) -> Result<Vec<Vec<Stage>>, CollectiveError> {
        self.splash
            .iter()
            .map(|s| {
                if backward {
                    s.backward_plan(features(segmented))
                } else {
                    s.forward_plan(features(segmented))
                }
                .map_err(local_error)
            })
            .collect()
    }

    /// The gathered K or V in natural order (they arrive in the program's order).
    fn natural(&self, f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, CollectiveError> {
        if self.load_balance {
            reorder_chunks(f, x, 2, &zigzag_inverse(self.devices))
        } else {
            Ok(x)
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
    /// ([`QueryShard`]), `k` and `v` the whole sequence ([`WholeKeys`]).
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
        let plans = self.plans(segment_ids.is_some(), false)?;
        let mut inputs = Inputs::new(&[q, k, v, shard]);
        let seg = inputs.optional(segment_ids.map(|x| x as _));
        p.local_results(&inputs.values, |f, x| {
            let (k, v) = (self.natural(f, x[1])?, self.natural(f, x[2])?);
            let (mut outs, mut lses) = (Vec::new(), Vec::new());
            for (h, plan) in plans.iter().enumerate() {
                let q = seq_part(f, x[0], h, plans.len())?;
                let mut env = HashMap::from([(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)]);
                let queries = self.query_part(f, x[3], h)?;
                add_segments(f, &mut env, x, seg, queries, (None, self.seq))?;
                lower_plan(f, plan, &mut env, Some(x[3]))?;
                outs.push(env[&Tensor::Out]);
                lses.push(env[&Tensor::Lse]);
            }
            let (out, lse) = (seq_concat(f, &outs)?, seq_concat(f, &lses)?);
            Ok(vec![out, lse_from_kernel(f, lse)?])
        })
    }

    /// `dq` of this device's queries and its contribution to `dk`, `dv` over every key (in
    /// the program's order), given the forward's `out`, `lse` and the cotangent `dout`
    /// (split like `q`). The partial `dk`, `dv` vary over `A`: `reduce_scatter::<A, 2>()`
    /// sums them and splits the sequence again (the all-gather's transpose).
    #[allow(clippy::too_many_arguments)] // the attention's six tensors, its offset and segments
    pub fn backward<'p, M, B, H, Q, K, V, O, L, DO>(
        &self,
        p: &'p Spmd<'_, M>,
        shard: &AxisIndex<'p, M, A>,
        q: &DTensor<'p, M, Q>,
        k: &DTensor<'p, M, K>,
        v: &DTensor<'p, M, V>,
        out: &DTensor<'p, M, O>,
        lse: &DTensor<'p, M, L>,
        dout: &DTensor<'p, M, DO>,
        segment_ids: Option<&DTensor<'p, M, WholeSegmentIds<B>>>,
    ) -> Result<Backward<'p, M, B, H, A>, CollectiveError>
    where
        M: MeshShape + HasAxis<A>,
        B: DimSharding<M>,
        H: DimSharding<M>,
        Q: QueryShard<A, Batch = B, Heads = H>,
        K: WholeKeys<A, Batch = B, Heads = H>,
        V: WholeKeys<A, Batch = B, Heads = H>,
        O: QueryShard<A, Batch = B, Heads = H>,
        L: QueryShard<A, Batch = B, Heads = H>,
        DO: QueryShard<A, Batch = B, Heads = H>,
    {
        self.shapes.check_qkv(OP, q, k, v)?;
        self.shapes.check_residuals(OP, out, lse, dout)?;
        let plans = self.plans(segment_ids.is_some(), true)?;
        let mut inputs = Inputs::new(&[q, k, v, out, lse, dout, shard]);
        let seg = inputs.optional(segment_ids.map(|x| x as _));
        p.local_results(&inputs.values, |f, x| {
            let (k, v) = (self.natural(f, x[1])?, self.natural(f, x[2])?);
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
                let queries = self.query_part(f, x[6], h)?;
                add_segments(f, &mut env, x, seg, queries, (None, self.seq))?;
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
            let dkv = dkv.ok_or_else(|| CollectiveError::local("no query part to attend"))?;
            for g in dkv {
                // Back to the program's order for the reduce-scatter.
                grads.push(if self.load_balance {
                    reorder_chunks(f, g, 2, &zigzag_order(self.devices))?
                } else {
                    g
                });
            }
            Ok(grads)
        })
    }
}
