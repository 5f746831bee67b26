//! The Ulysses attention op: every device attends the whole sequence of its heads.

use std::collections::HashMap;
use std::marker::PhantomData;

use tessera_collectives::{
    CollectiveError, DTensor, DimSharding, HasAxis, MeshAxis, MeshShape, Spmd,
};
use tessera_splash::{ShardedSplash, Tensor};

use super::super::spmd::{lower_forward, lse_from_kernel};
use super::super::{ContextParallel, CpError};
use super::{
    add_segments, expect_lengths, features, local_error, ByHeads, ByHeadsLse, Inputs, LocalShapes,
    UlyssesOperand, WholeSegmentIds,
};

const OP: &str = "Ulysses attention";

/// Splash attention on the whole sequence of this device's heads (DeepSpeed-Ulysses, after
/// the all-to-all over `A` from sequence to heads). No offsets: every device sees every
/// position.
#[derive(Debug, Clone)]
pub struct UlyssesAttention<A> {
    splash: ShardedSplash,
    shapes: LocalShapes,
    seq: usize,
    _axis: PhantomData<fn() -> A>,
}

/// `forward`'s results: `out [B, H, S, Dv]` and `lse [B, H, S]`, by heads.
type Forward<'p, M, B, A> = (
    DTensor<'p, M, ByHeads<B, A>>,
    DTensor<'p, M, ByHeadsLse<B, A>>,
);

impl<A: MeshAxis> UlyssesAttention<A> {
    /// The kernels of a configuration whose devices attend the whole sequence per kernel call
    /// (Ulysses): `H/U` query heads and `KVH/U` KV heads (after any KV head replication) over the whole
    /// sequence per device, at the offsets of the strategy's one kernel call.
    pub fn new(cp: &ContextParallel) -> Result<Self, CpError> {
        cp.validate()?;
        let seq = cp.dims.q_len;
        expect_lengths(cp, OP, (seq, seq))?;
        let calls = cp.kernel_calls();
        Ok(UlyssesAttention {
            splash: cp.sharded_splash(&calls[0][0])?,
            shapes: LocalShapes::of(cp, 1, 1),
            seq: cp.dims.q_len,
            _axis: PhantomData,
        })
    }

    /// `out` and `lse` of this device's heads. `q`, `k`, `v` hold the heads split over `A`
    /// and the whole sequence ([`UlyssesOperand`]); `segment_ids` are the whole `[B, S]`.
    /// The kernel is a custom-VJP unit: [`Spmd::vjp`] differentiates it with splash's
    /// backward kernels.
    pub fn forward<'p, M, B, Q, K, V>(
        &self,
        p: &'p Spmd<'_, M>,
        q: &DTensor<'p, M, Q>,
        k: &DTensor<'p, M, K>,
        v: &DTensor<'p, M, V>,
        segment_ids: Option<&DTensor<'p, M, WholeSegmentIds<B>>>,
    ) -> Result<Forward<'p, M, B, A>, CollectiveError>
    where
        M: MeshShape + HasAxis<A>,
        B: DimSharding<M>,
        Q: UlyssesOperand<A, Batch = B>,
        K: UlyssesOperand<A, Batch = B>,
        V: UlyssesOperand<A, Batch = B>,
    {
        self.shapes.check_qkv(OP, q, k, v)?;
        let feats = features(segment_ids.is_some());
        let forward = self.splash.forward_plan(feats).map_err(local_error)?;
        let backward = self.splash.backward_plan(feats).map_err(local_error)?;
        let mut inputs = Inputs::new(&[q, k, v]);
        let seg = inputs.optional(segment_ids.map(|x| x as _));
        let len = self.seq;
        let keep = self.splash.keeps_residuals();
        p.local_results(&inputs.values, |f, x| {
            let mut env = HashMap::from([(Tensor::Q, x[0]), (Tensor::K, x[1]), (Tensor::V, x[2])]);
            add_segments(f, &mut env, x, seg, (None, len), (None, len))?;
            lower_forward(f, &forward, backward, &mut env, None, keep)?;
            Ok(vec![
                env[&Tensor::Out],
                lse_from_kernel(f, env[&Tensor::Lse])?,
            ])
        })
    }
}
