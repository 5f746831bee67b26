//! Ulysses (DeepSpeed-Ulysses, MaxText's `context_parallel_strategy = "ulysses"`).
//!
//! Per device the sequence is sharded, `[b, H, s, D]`; an all-to-all over `context` (split
//! heads, concatenate sequence) gives each device the whole sequence for `H/U` heads; the
//! local splash kernels run ([`UlyssesAttention`], whose signature requires exactly that
//! layout); the inverse all-to-all brings the result back. Its backward (the forward's
//! gradient) is only all-to-alls: the cotangent goes through the inverse all-to-all's
//! transpose, splash's dq/dkv kernels run locally, and the gradients go back through the
//! forward all-to-alls' transposes.
//!
//! GQA: with `KVH` divisible by `U` the KV heads go through the same all-to-all; with
//! `KVH < U` (which MaxText rejects) each KV head is first replicated `U / KVH` times so every
//! device holds the one KV head its query heads use; its gradient is summed back over the
//! replicas (the broadcast's transpose).

use std::rc::Rc;

use tessera_collectives::axes::{Context, Data};
use tessera_collectives::{CollectiveError, DTensor, Split, Spmd};
use tessera_splash::SeqOffsets;

use super::{Composition, ContextStrategy, Exchange, Fixed, KernelCalls, Listing, Shards};
use crate::context::layout::{ModelMesh, SeqLseTensor, SeqTensor, WholeSegments};
use crate::context::local_splash::{ByHeads, UlyssesAttention};
use crate::context::spmd::replicate_heads;
use crate::context::{ContextParallel, CpError};

pub(super) const LISTING: Listing = Listing::fixed::<Ulysses>("ulysses");

impl Fixed for Ulysses {
    const SPELLINGS: &'static [&'static str] = &["ulysses"];
}

/// All-to-all from sequence to heads and back: every device attends `H/U` heads over the
/// whole sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ulysses;

impl ContextStrategy for Ulysses {
    fn name(&self) -> String {
        "ulysses".into()
    }

    fn ulysses_degree(&self, devices: usize) -> usize {
        devices
    }

    fn local_lengths(&self, s: Shards) -> (usize, usize) {
        (s.seq, s.seq)
    }

    /// One call, at the start of the sequence, on every device.
    fn kernel_calls(&self, _s: Shards) -> KernelCalls {
        vec![vec![vec![SeqOffsets::default()]]]
    }

    fn exchange(&self, _devices: usize) -> Exchange {
        Exchange::Heads
    }

    fn compose(&self, cp: &ContextParallel) -> Result<Rc<dyn Composition>, CpError> {
        Ok(Rc::new(Composed {
            attention: UlyssesAttention::new(cp)?,
            kv_replication: cp.kv_replication(),
        }))
    }
}

#[derive(Debug)]
struct Composed {
    attention: UlyssesAttention<Context>,
    kv_replication: usize,
}

/// `[b, H/U, S, D]`: the heads split over `context`, the whole sequence on every device.
type Heads = ByHeads<Split<Data>, Context>;

impl Composition for Composed {
    fn attend<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        [q, k, v]: [&SeqTensor<'p>; 3],
        segment_ids: Option<&WholeSegments<'p>>,
    ) -> Result<(SeqTensor<'p>, SeqLseTensor<'p>), CollectiveError> {
        let rep = self.kv_replication;
        let (k, v) = (replicate_heads(k, rep)?, replicate_heads(v, rep)?);
        let q: DTensor<'_, ModelMesh, Heads> = q.all_to_all::<Context, 1, 2>()?;
        let k: DTensor<'_, ModelMesh, Heads> = k.all_to_all::<Context, 1, 2>()?;
        let v: DTensor<'_, ModelMesh, Heads> = v.all_to_all::<Context, 1, 2>()?;
        let (out, lse) = self.attention.forward(p, &q, &k, &v, segment_ids)?;
        Ok((
            out.all_to_all::<Context, 2, 1>()?,
            lse.all_to_all::<Context, 2, 1>()?,
        ))
    }
}
