//! Context-parallel attention as one layer of a larger SPMD program (a model's train step) on
//! a [`ModelMesh`] with a data axis: the batch split over `data`, the sequence over `context`
//! (and a strategy's own `ring` axis).
//!
//! [`AttentionLayer::forward`] takes and returns the local per-device values of the caller's
//! program, `q [b, H, s, D]`, `k`, `v [b, KVH, s, D]` (`b` the batch per data shard, `s` the
//! sequence per context device), and emits the strategy's composition around them (its
//! collectives and typed splash calls, [`Composition`]): the same composition the
//! standalone programs of [`ContextParallel`] run. Its backward is the program's:
//! [`Spmd::vjp`] differentiates through the splash calls (custom VJPs running splash's
//! backward kernels) and the collectives (their transposes).
//!
//! Every device's sequence block is the one the strategy expects (see
//! [`AttentionLayer::sequence_order`]): the caller lays its `[B, S]` token arrays out in that
//! order and declares them as [`TokenLayout`](crate::TokenLayout) over [`AttentionLayer::token_dims`], so each
//! device's local `[b, 1, s]` block holds its positions.

use std::fmt;
use std::rc::Rc;

use tessera_collectives::{CollectiveError, Mesh, Spmd};

use super::error::{ConfigError, CpError, Quantity};
use super::layout::{ModelMesh, SeqLseTensor, SeqTensor, WholeSegments};
use super::strategy::Composition;
use super::ContextParallel;

/// One context-parallel attention inside a caller's program on [`ModelMesh`].
#[derive(Clone)]
pub struct AttentionLayer {
    cp: ContextParallel,
    data: usize,
    composition: Rc<dyn Composition>,
}

impl fmt::Debug for AttentionLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttentionLayer")
            .field("cp", &self.cp)
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

impl AttentionLayer {
    /// The layer of `cp` (its `dims.batch` the batch of one data shard, its `devices` the
    /// context degree) on `data` data shards. Fails with the configuration's error when the
    /// strategy cannot split these dims.
    pub fn new(cp: ContextParallel, data: usize) -> Result<Self, CpError> {
        if data == 0 {
            return Err(ConfigError::Zero {
                quantity: Quantity::DataDegree,
            }
            .into());
        }
        cp.validate()?;
        let composition = cp.strategy.compose(&cp)?;
        Ok(AttentionLayer {
            cp,
            data,
            composition,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ContextParallel {
        &self.cp
    }

    /// `[data, context, ring]` sizes.
    pub fn mesh_sizes(&self) -> [usize; 3] {
        self.cp.mesh_sizes(self.data)
    }

    /// The mesh of the layer's programs.
    pub fn mesh(&self) -> Result<Mesh<ModelMesh>, CpError> {
        self.cp.mesh(self.data)
    }

    /// The global dims `[B, R, S/R]` of a `[B, S]` token array declared as [`TokenLayout`](crate::TokenLayout).
    pub fn token_dims(&self) -> [i64; 3] {
        let [data, _, ring] = self.mesh_sizes();
        let (b, s) = (
            (self.cp.dims.batch * data) as i64,
            self.cp.dims.q_len as i64,
        );
        [b, ring as i64, s / ring as i64]
    }

    /// The order of the sequence the programs take: position `j` of a token array as laid out
    /// for the program holds natural position `order[j]` (the identity, or zigzag chunks with
    /// load balancing).
    pub fn sequence_order(&self) -> Vec<usize> {
        self.cp.sequence_order()
    }

    /// `out [b, H, s, D]` (the configuration's dtype) and `lse [b, H, s]` (f32) of `q`, `k`,
    /// `v`, each device's `[b, H, s, D]` block of the sequence ([`Seq`](crate::context::Seq)).
    pub fn forward<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        q: &SeqTensor<'p>,
        k: &SeqTensor<'p>,
        v: &SeqTensor<'p>,
    ) -> Result<(SeqTensor<'p>, SeqLseTensor<'p>), CollectiveError> {
        self.composition.attend(p, [q, k, v], None)
    }

    /// [`Self::forward`] of packed sequences: a query attends only to the keys of its own
    /// segment (`segment_ids`, whole `[b, S]` on every device in natural order, one id per
    /// document), so documents packed into one sequence do not see each other, whichever
    /// devices their tokens are on.
    pub fn forward_segmented<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        q: &SeqTensor<'p>,
        k: &SeqTensor<'p>,
        v: &SeqTensor<'p>,
        segment_ids: &WholeSegments<'p>,
    ) -> Result<(SeqTensor<'p>, SeqLseTensor<'p>), CollectiveError> {
        self.composition.attend(p, [q, k, v], Some(segment_ids))
    }
}
