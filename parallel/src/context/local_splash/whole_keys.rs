//! The all-gather attention op: this device's queries against every key.

use std::collections::HashMap;
use std::marker::PhantomData;

use tessera_collectives::{
    CollectiveError, DTensor, DimSharding, HasAxis, MeshAxis, MeshShape, Spmd,
};
use tessera_hlo::{FuncBuilder, Value};
use tessera_splash::{ShardedSplash, Tensor};

use super::super::config::inverse;
use super::super::spmd::{
    lower_forward, lse_from_kernel, part_start, reorder_chunks, seq_concat, seq_part,
};
use super::super::strategy::DeviceOp;
use super::super::{ContextParallel, CpError};
use super::{
    add_segments, expect_op, features, local_error, AxisIndex, BySequence, BySequenceLse, Inputs,
    LocalShapes, Plans, QueryShard, WholeKeys, WholeSegmentIds,
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
    /// Devices on `A`.
    devices: usize,
    /// The natural chunk order of K/V gathered in the program's order (with load balancing).
    natural: Option<Vec<usize>>,
    _axis: PhantomData<fn() -> A>,
}

/// `forward`'s results: `out [B, H, S/U, Dv]` and `lse [B, H, S/U]`.
type Forward<'p, M, B, H, A> = (
    DTensor<'p, M, BySequence<B, H, A>>,
    DTensor<'p, M, BySequenceLse<B, H, A>>,
);

impl<A: MeshAxis> AllGatherAttention<A> {
    /// The kernels of a configuration whose strategy calls this op ([`DeviceOp::AllKeys`]):
    /// one sharded attention per query part, at the offsets of the strategy's calls.
    pub fn new(cp: &ContextParallel) -> Result<Self, CpError> {
        expect_op(cp, DeviceOp::AllKeys)?;
        cp.validate()?;
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
        p.local_results(&inputs.values, |f, x| {
            let (k, v) = (self.natural(f, x[1])?, self.natural(f, x[2])?);
            let (mut outs, mut lses) = (Vec::new(), Vec::new());
            for (h, (forward, backward)) in plans.into_iter().enumerate() {
                let q = seq_part(f, x[0], h, self.splash.len())?;
                let mut env = HashMap::from([(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)]);
                let queries = self.query_part(f, x[3], h)?;
                add_segments(f, &mut env, x, seg, queries, (None, self.seq))?;
                lower_forward(f, &forward, backward, &mut env, Some(x[3]))?;
                outs.push(env[&Tensor::Out]);
                lses.push(lse_from_kernel(f, env[&Tensor::Lse])?);
            }
            Ok(vec![seq_concat(f, &outs)?, seq_concat(f, &lses)?])
        })
    }
}
