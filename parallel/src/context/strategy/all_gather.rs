//! All-gather (MaxText's `context_parallel_strategy = "all_gather"`): K and V are gathered
//! along the sequence, so every device holds all keys; device `r` attends its query shard
//! against them, with the mask's tables for the shard's offset ([`AllGatherAttention`]).
//! The backward, the forward's gradient, computes dQ locally and partial dK/dV over the whole
//! sequence on every device, which the all-gather's transpose, a reduce-scatter, sums and
//! re-shards.
//!
//! With load balancing the shard of device `r` is chunks `r` and `2U - 1 - r` of `2U`
//! ([`chunk_of`]). Under a causal mask each device's two parts of K/V are gathered
//! separately (the first half of the sequence in order, the second reversed) and its queries
//! attend the halves ([`AllGatherAttention::forward_halves`]); under other masks the gathered
//! K/V are put back in natural order, and each chunk of queries attends them separately at
//! its own offset.

use std::rc::Rc;

use tessera_collectives::axes::Context;
use tessera_collectives::{CollectiveError, Spmd};
use tessera_splash::SeqOffsets;

use super::{Composition, ContextStrategy, Exchange, Fixed, KernelCalls, Listing, Shards};
use crate::context::config::chunk_of;
use crate::context::layout::{ModelMesh, SeqLseTensor, SeqTensor, WholeSegments};
use crate::context::local_splash::AllGatherAttention;
use crate::context::{ContextParallel, CpError};

pub(super) const LISTING: Listing = Listing::fixed::<AllGather>("all-gather (all_gather)");

impl Fixed for AllGather {
    const SPELLINGS: &'static [&'static str] = &["all-gather", "all_gather"];
}

/// K/V all-gathered along the sequence: every device attends its queries to every key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllGather;

impl ContextStrategy for AllGather {
    fn name(&self) -> String {
        "all-gather".into()
    }

    fn maxtext_name(&self) -> String {
        "all_gather".into()
    }

    fn load_balances(&self) -> bool {
        true
    }

    fn local_lengths(&self, s: Shards) -> (usize, usize) {
        (s.chunk(s.devices), s.seq)
    }

    /// One step: a call per part of each device's shard, its queries at the part's chunk,
    /// all keys from 0. (Load-balanced under a causal mask, the devices run these as three
    /// calls over the gathered halves of K/V, [`AllGatherAttention::forward_halves`], which
    /// compute the same blocks; this listing is what the stats, the step-time model and
    /// `--sa-block-* auto` count.)
    fn kernel_calls(&self, s: Shards) -> KernelCalls {
        let (n, len) = (s.devices, s.chunk(s.devices));
        let calls = (0..s.parts)
            .map(|part| {
                (0..n)
                    .map(|r| SeqOffsets {
                        q: chunk_of(r, part, n) * len,
                        kv: 0,
                    })
                    .collect()
            })
            .collect();
        vec![calls]
    }

    fn exchange(&self, _devices: usize) -> Exchange {
        Exchange::AllKeys
    }

    fn compose(&self, cp: &ContextParallel) -> Result<Rc<dyn Composition>, CpError> {
        Ok(Rc::new(Composed {
            attention: AllGatherAttention::new(cp)?,
        }))
    }
}

#[derive(Debug)]
struct Composed {
    attention: AllGatherAttention<Context>,
}

impl Composition for Composed {
    fn attend<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        [q, k, v]: [&SeqTensor<'p>; 3],
        segment_ids: Option<&WholeSegments<'p>>,
    ) -> Result<(SeqTensor<'p>, SeqLseTensor<'p>), CollectiveError> {
        let shard = p.axis_index::<Context>()?;
        if self.attention.attends_halves() {
            let gather = |x: &SeqTensor<'p>| -> Result<_, CollectiveError> {
                let [first, second] = AllGatherAttention::<Context>::shard_halves(x)?;
                Ok([
                    first.all_gather::<Context, 2>()?,
                    second.all_gather::<Context, 2>()?,
                ])
            };
            let (k, v) = (gather(k)?, gather(v)?);
            return self.attention.forward_halves(
                p,
                &shard,
                q,
                [&k[0], &k[1]],
                [&v[0], &v[1]],
                segment_ids,
            );
        }
        let k = k.all_gather::<Context, 2>()?;
        let v = v.all_gather::<Context, 2>()?;
        self.attention.forward(p, &shard, q, &k, &v, segment_ids)
    }
}
