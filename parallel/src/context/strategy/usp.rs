//! USP, the Ulysses x ring hybrid: Ulysses over the `context` axis (`U` devices) and ring
//! attention over the `ring` axis (`R` devices), `U x R` context devices.
//!
//! The sequence is cut into `R` ring chunks of `S/R`, and each ring chunk into `U` pieces of
//! `S/(U R)`: device `(u, r)` holds piece `u` of chunk `r` (the programs see the sequence as
//! `[R, S/R]`, [`Pieces`]). An all-to-all over `context` (split heads, concatenate the
//! pieces) gives device `(u, r)` the whole chunk `r` for `H/U` heads; ring attention over
//! `ring` runs on those chunks; the inverse all-to-all brings the output back. The backward
//! is the forward's gradient (the all-to-alls' and the ring permutes' transposes around
//! splash's backward kernels).

use std::rc::Rc;

use tessera_collectives::axes::{Context, Data};
use tessera_collectives::{CollectiveError, DTensor, Invariant, Replicated, Split, Spmd};

use super::ring::ring_calls;
use super::{
    Composition, ConfigError, ContextStrategy, Exchange, KernelCalls, Listing, Shards, Strategy,
};
use crate::context::layout::{
    ModelMesh, Pieces, RingAxis, Seq, SeqLse, SeqLseTensor, SeqTensor, WholeSegments,
};
use crate::context::local_splash::{BySequence, RingAttention};
use crate::context::spmd::{chunk_view, replicate_heads};
use crate::context::{ContextParallel, CpError};

pub(super) const LISTING: Listing = Listing {
    name: "usp",
    spellings: "usp (usp:UxR: Ulysses degree U x ring degree R; usp alone: the most square \
                split of the devices)",
    parse,
};

/// `usp` (the most square split of `devices`, the larger factor on Ulysses) or `usp:UxR`.
fn parse(text: &str, devices: usize) -> Option<Result<Strategy, ConfigError>> {
    if text == "usp" {
        let ring = (1..=devices)
            .filter(|r| devices % r == 0 && r * r <= devices)
            .max()
            .unwrap_or(1);
        return Some(Ok(Usp {
            ulysses: devices.max(1) / ring,
            ring,
        }
        .into()));
    }
    let degrees = text.strip_prefix("usp:")?;
    let parsed = degrees
        .split_once('x')
        .and_then(|(u, r)| Some((u.parse().ok()?, r.parse().ok()?)));
    Some(match parsed {
        Some((ulysses, ring)) if ulysses > 0 && ring > 0 => Ok(Usp { ulysses, ring }.into()),
        _ => Err(ConfigError::BadDegrees {
            text: text.to_string(),
            form: "usp:UxR",
            example: "usp:2x2",
        }),
    })
}

/// Ulysses over `ulysses` devices times ring over `ring` devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usp {
    pub ulysses: usize,
    pub ring: usize,
}

impl ContextStrategy for Usp {
    fn name(&self) -> String {
        format!("usp:{}x{}", self.ulysses, self.ring)
    }

    fn mesh_axes(&self, _devices: usize) -> [usize; 2] {
        [self.ulysses, self.ring]
    }

    fn fixed_devices(&self) -> Option<usize> {
        Some(self.ulysses * self.ring)
    }

    fn ulysses_degree(&self, _devices: usize) -> usize {
        self.ulysses
    }

    /// After the all-to-all each device holds a whole ring chunk.
    fn local_lengths(&self, s: Shards) -> (usize, usize) {
        let len = s.chunk(self.ring);
        (len, len)
    }

    fn kernel_calls(&self, s: Shards) -> KernelCalls {
        ring_calls(self.ring, s)
    }

    fn exchange(&self, _devices: usize) -> Exchange {
        Exchange::Ring {
            ulysses: self.ulysses,
            ring: self.ring,
        }
    }

    fn compose(&self, cp: &ContextParallel) -> Result<Rc<dyn Composition>, CpError> {
        Ok(Rc::new(Composed {
            ring: RingAttention::new(cp)?,
            kv_replication: cp.kv_replication(),
            dtype: cp.dtype,
        }))
    }
}

#[derive(Debug)]
struct Composed {
    ring: RingAttention<RingAxis>,
    kv_replication: usize,
    dtype: tessera_dsl::DType,
}

/// `[b, H/U, R, S/R, D]` after the all-to-all: whole chunks, heads over `context`.
type Chunks5 = (
    Split<Data>,
    Split<Context>,
    Split<RingAxis>,
    Replicated,
    Replicated,
);
/// `[b, H/U, R, S/R]`: a logsumexp of [`Chunks5`].
type Chunks5Lse = (Split<Data>, Split<Context>, Split<RingAxis>, Replicated);
/// `[b, H/U, S, D]` with the sequence over `ring`: what the ring steps work on.
type Chunks = BySequence<Split<Data>, Split<Context>, RingAxis>;

/// A device's piece `[b, H, s, D]` to the whole chunk of `H/U` heads, replicating the heads
/// `rep` times first.
fn to_chunks<'p>(
    x: &SeqTensor<'p>,
    rep: usize,
) -> Result<DTensor<'p, ModelMesh, Chunks>, CollectiveError> {
    replicate_heads(x, rep)?
        .map_local_as::<Pieces, Invariant>(|f, v| chunk_view(f, v, false))?
        .all_to_all::<Context, 1, 3>()?
        .map_local_as::<Chunks, Invariant>(|f, v| chunk_view(f, v, true))
}

/// The inverse of [`to_chunks`] for the output (whose heads are not replicated).
fn from_chunks<'p>(x: &DTensor<'p, ModelMesh, Chunks>) -> Result<SeqTensor<'p>, CollectiveError> {
    x.map_local_as::<Chunks5, Invariant>(|f, v| chunk_view(f, v, false))?
        .all_to_all::<Context, 3, 1>()?
        .map_local_as::<Seq, Invariant>(|f, v| {
            let d = f.value_type(v)?.dims.clone();
            Ok(f.reshape(v, &[d[0], d[1], d[3], d[4]])?)
        })
}

impl Composition for Composed {
    fn attend<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        [q, k, v]: [&SeqTensor<'p>; 3],
        segment_ids: Option<&WholeSegments<'p>>,
    ) -> Result<(SeqTensor<'p>, SeqLseTensor<'p>), CollectiveError> {
        let rep = self.kv_replication;
        let q = to_chunks(q, 1)?;
        let (k, v) = (to_chunks(k, rep)?, to_chunks(v, rep)?);
        let shard = p.axis_index::<RingAxis>()?;
        let partial = self.ring.forward(p, &shard, &q, &k, &v, segment_ids)?;
        let out = from_chunks(&partial.out.convert(self.dtype)?)?;
        let lse = partial
            .lse
            .map_local_as::<Chunks5Lse, Invariant>(|f, x| chunk_view(f, x, false))?
            .all_to_all::<Context, 3, 1>()?
            .map_local_as::<SeqLse, Invariant>(|f, x| {
                let d = f.value_type(x)?.dims.clone();
                Ok(f.reshape(x, &[d[0], d[1], d[3]])?)
            })?;
        Ok((out, lse))
    }
}
