//! Ring attention (MaxText's `context_parallel_strategy = "ring"`).
//!
//! Device `r` keeps its query shard; the K/V shards travel around the ring (a collective
//! permute to `r + 1` after every step), so at step `t` device `r` holds the keys of device
//! `r - t` and attends its queries to them with the mask's tables for that pair of offsets
//! (under a causal mask, the shards of later devices are empty and skipped block by block).
//! Each step's normalised output and logsumexp merge into the running result by logsumexp.
//!
//! The whole ring is one custom-VJP unit ([`RingAttention::forward`]) whose backward is a
//! second ring: K/V travel around again, each step's splash backward kernels read the final
//! `out` and `lse`, dQ adds up locally, and each shard's dK/dV accumulate in a buffer that
//! travels with the shard and one more step brings home. No all-to-all, no all-gather.
//!
//! With load balancing every shard is two chunks ([`chunk_of`]) and each pair of a query
//! chunk and a key chunk is its own call.

use std::rc::Rc;

use tessera_collectives::axes::Context;
use tessera_collectives::{CollectiveError, Spmd};
use tessera_splash::SeqOffsets;

use super::{Composition, ContextStrategy, Exchange, Fixed, KernelCalls, Listing, Shards};
use crate::context::config::chunk_of;
use crate::context::layout::{ModelMesh, SeqLseTensor, SeqTensor, WholeSegments};
use crate::context::local_splash::RingAttention;
use crate::context::{ContextParallel, CpError};

pub(super) const LISTING: Listing = Listing::fixed::<Ring>("ring");

impl Fixed for Ring {
    const SPELLINGS: &'static [&'static str] = &["ring"];
}

/// K/V passed around a ring over the context axis, partial results merged by logsumexp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ring;

impl ContextStrategy for Ring {
    fn name(&self) -> String {
        "ring".into()
    }

    fn load_balances(&self) -> bool {
        true
    }

    fn local_lengths(&self, s: Shards) -> (usize, usize) {
        let len = s.chunk(s.devices);
        (len, len)
    }

    fn kernel_calls(&self, s: Shards) -> KernelCalls {
        ring_calls(s.devices, s)
    }

    fn exchange(&self, devices: usize) -> Exchange {
        Exchange::Ring {
            ulysses: 1,
            ring: devices,
        }
    }

    fn compose(&self, cp: &ContextParallel) -> Result<Rc<dyn Composition>, CpError> {
        Ok(Rc::new(Composed {
            ring: RingAttention::new(cp)?,
            dtype: cp.dtype,
        }))
    }
}

/// The calls of a ring of `ring` shards: at step `t` shard `r` attends its query part `hq` to
/// key part `hk` of shard `r - t`, for every pair of parts (`[t][hq * parts + hk][r]`).
pub(super) fn ring_calls(ring: usize, s: Shards) -> KernelCalls {
    let len = s.chunk(ring);
    (0..ring)
        .map(|t| {
            let pairs = (0..s.parts).flat_map(|hq| (0..s.parts).map(move |hk| (hq, hk)));
            pairs
                .map(|(hq, hk)| {
                    (0..ring)
                        .map(|r| SeqOffsets {
                            q: chunk_of(r, hq, ring) * len,
                            kv: chunk_of((r + ring - t) % ring, hk, ring) * len,
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

#[derive(Debug)]
struct Composed {
    ring: RingAttention<Context>,
    dtype: tessera_dsl::DType,
}

impl Composition for Composed {
    fn attend<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        [q, k, v]: [&SeqTensor<'p>; 3],
        segment_ids: Option<&WholeSegments<'p>>,
    ) -> Result<(SeqTensor<'p>, SeqLseTensor<'p>), CollectiveError> {
        let shard = p.axis_index::<Context>()?;
        let partial = self.ring.forward(p, &shard, q, k, v, segment_ids)?;
        Ok((partial.out.convert(self.dtype)?, partial.lse))
    }
}
