//! Context-parallel attention as one layer of a larger SPMD program (a model's train step) on
//! a mesh with a data axis: [`ModelMesh`] is `data x context x ring`, the batch split over
//! `data` and the sequence over `context` (and, for USP, `ring`).
//!
//! [`AttentionLayer::forward`] takes and returns the local per-device values of the caller's
//! program, `q [b, H, s, D]`, `k`, `v [b, KVH, s, D]` (`b`
//! the batch per data shard, `s` the sequence per context device), and emit the strategy's
//! collectives and splash kernels around them through the typed ops of [`super::ops`]:
//!
//! - `ulysses`: all-to-all over `context` to heads, [`UlyssesAttention`], all-to-all back;
//! - `all_gather`: K/V gathered over `context`, [`AllGatherAttention`];
//! - `ring`: K/V rotated over `context`, [`RingAttention`] step by step;
//! - `usp:UxR`: all-to-all over `context` (the Ulysses degree `U`) to whole ring chunks, ring
//!   attention over `ring` (`R`), all-to-all back.
//!
//! Its backward is the program's: [`Spmd::vjp`] differentiates through the splash calls (custom
//! VJPs running splash's backward kernels) and the collectives (their transposes).
//!
//! Every device's sequence block is the one the strategy expects (see
//! [`AttentionLayer::sequence_order`]): the caller lays its `[B, S]` token arrays out in that
//! order and declares them as [`TokenLayout`] over [`AttentionLayer::token_dims`], so each
//! device's local `[b, 1, s]` block holds its positions.

use tessera_collectives::axes::{Context, Data};
use tessera_collectives::{
    mesh, CollectiveError, DTensor, Invariant, Mesh, Replicated, Split, Spmd,
};
use tessera_hlo::Value;

use super::ops::{
    AllGatherAttention, ByHeads, BySequence, BySequenceRows, RingAttention, UlyssesAttention,
};
use super::{replicate_heads, zigzag_order, ContextParallel, CpError, RingAxis, Strategy};

mesh!(pub ModelMesh = [Data, Context, RingAxis]);

/// `[B, R, S/R]` token arrays: the batch over `data`, each sequence cut into `R` ring chunks
/// over `ring` and each chunk into pieces over `context` (with `R = 1` unless USP).
pub type TokenLayout = (Split<Data>, Split<RingAxis>, Split<Context>);

/// `[B, H, S, D]`, the sequence over `context`, batch over `data`.
type Seq = BySequence<Split<Data>, Replicated, Context>;
/// `[B, H, S]`.
type SeqRows = BySequenceRows<Split<Data>, Replicated, Context>;
/// `[B, H, S, D]` by heads over `context`.
type Heads = ByHeads<Split<Data>, Context>;
/// USP: `[B, H, R, S/R, D]`, chunks over `ring`, pieces over `context`.
type Pieces = (
    Split<Data>,
    Replicated,
    Split<RingAxis>,
    Split<Context>,
    Replicated,
);
/// USP after the all-to-all: `[B, H/U, R, S/R, D]`, whole chunks.
type Chunks5 = (
    Split<Data>,
    Split<Context>,
    Split<RingAxis>,
    Replicated,
    Replicated,
);
/// USP: `[B, H/U, R, S/R]`.
type Chunks5Rows = (Split<Data>, Split<Context>, Split<RingAxis>, Replicated);
/// USP: `[B, H/U, S, D]` with the sequence over `ring`, what the ring steps take.
type Chunks = BySequence<Split<Data>, Split<Context>, RingAxis>;

#[derive(Debug, Clone)]
enum Kernels {
    Ulysses(UlyssesAttention<Context>),
    AllGather(AllGatherAttention<Context>),
    Ring(RingAttention<Context>),
    Usp(RingAttention<RingAxis>),
}

/// One context-parallel attention inside a caller's program on [`ModelMesh`].
#[derive(Debug, Clone)]
pub struct AttentionLayer {
    cp: ContextParallel,
    data: usize,
    kernels: Kernels,
}

impl AttentionLayer {
    /// The layer of `cp` (its `dims.batch` the batch of one data shard, its `devices` the
    /// context degree) on `data` data shards. Fails with the configuration's message when the
    /// strategy cannot split these dims.
    pub fn new(cp: ContextParallel, data: usize) -> Result<Self, CpError> {
        if data == 0 {
            return Err(cp.config_error("the data degree must be at least 1".into()));
        }
        cp.validate()?;
        let kernels = match cp.strategy {
            Strategy::Ulysses => Kernels::Ulysses(UlyssesAttention::new(&cp)?),
            Strategy::AllGather => Kernels::AllGather(AllGatherAttention::new(&cp)?),
            Strategy::Ring => Kernels::Ring(RingAttention::new(&cp)?),
            Strategy::Usp { .. } => Kernels::Usp(RingAttention::new(&cp)?),
        };
        Ok(AttentionLayer { cp, data, kernels })
    }

    /// The configuration.
    pub fn config(&self) -> &ContextParallel {
        &self.cp
    }

    /// `[data, context, ring]` sizes: the context axis is the Ulysses degree for USP.
    pub fn mesh_sizes(&self) -> [usize; 3] {
        match self.cp.strategy {
            Strategy::Usp { ulysses, ring } => [self.data, ulysses, ring],
            _ => [self.data, self.cp.devices, 1],
        }
    }

    /// The mesh of the layer's programs.
    pub fn mesh(&self) -> Result<Mesh<ModelMesh>, CpError> {
        Ok(Mesh::new(self.mesh_sizes())?)
    }

    /// The global dims `[B, R, S/R]` of a `[B, S]` token array declared as [`TokenLayout`].
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
        let s = self.cp.dims.q_len;
        if !self.cp.load_balance {
            return (0..s).collect();
        }
        let chunks = zigzag_order(self.cp.devices);
        let len = s / chunks.len();
        chunks
            .iter()
            .flat_map(|&c| c * len..(c + 1) * len)
            .collect()
    }

    /// `out [b, H, s, D]` (the configuration's dtype) and `lse [b, H, s]` (f32) of the local
    /// `q`, `k`, `v` of every device.
    pub fn forward(
        &self,
        p: &Spmd<'_, ModelMesh>,
        q: Value,
        k: Value,
        v: Value,
    ) -> Result<(Value, Value), CollectiveError> {
        let (q, k, v) = (declare(p, q)?, declare(p, k)?, declare(p, v)?);
        let rep = self.cp.kv_replication();
        match &self.kernels {
            Kernels::Ulysses(attention) => {
                let (k, v) = (replicate_heads(&k, rep)?, replicate_heads(&v, rep)?);
                let (q, k, v) = (to_heads(&q)?, to_heads(&k)?, to_heads(&v)?);
                let (out, lse) = attention.forward(p, &q, &k, &v, None)?;
                let out = to_sequence(&out)?;
                let lse: DTensor<'_, _, SeqRows> = lse.all_to_all::<Context, 2, 1>()?;
                Ok((out.value(), lse.value()))
            }
            Kernels::AllGather(attention) => {
                let k = k.all_gather::<Context, 2>()?;
                let v = v.all_gather::<Context, 2>()?;
                let shard = p.axis_index::<Context>()?;
                let (out, lse) = attention.forward(p, &shard, &q, &k, &v, None)?;
                Ok((out.value(), lse.value()))
            }
            Kernels::Ring(ring) => {
                let shard = p.axis_index::<Context>()?;
                let partial = ring.forward(p, &shard, &q, &k, &v, None)?;
                Ok((
                    partial.out.convert(self.cp.dtype)?.value(),
                    partial.lse.value(),
                ))
            }
            Kernels::Usp(ring) => {
                let q = to_chunks(&q, 1)?;
                let (k, v) = (to_chunks(&k, rep)?, to_chunks(&v, rep)?);
                let shard = p.axis_index::<RingAxis>()?;
                let partial = ring.forward(p, &shard, &q, &k, &v, None)?;
                let out = from_chunks(&partial.out.convert(self.cp.dtype)?)?;
                let lse = partial
                    .lse
                    .map_local_as::<Chunks5Rows, Invariant>(|f, x| {
                        let d = f.value_type(x)?.dims.clone();
                        Ok(f.reshape(x, &[d[0], d[1], 1, d[2]])?)
                    })?
                    .all_to_all::<Context, 3, 1>()?;
                let lse = lse.map_local_as::<SeqRows, Invariant>(|f, x| {
                    let d = f.value_type(x)?.dims.clone();
                    Ok(f.reshape(x, &[d[0], d[1], d[3]])?)
                })?;
                Ok((out.value(), lse.value()))
            }
        }
    }
}

/// Ulysses: sequence to heads.
fn to_heads<'p>(
    x: &DTensor<'p, ModelMesh, Seq>,
) -> Result<DTensor<'p, ModelMesh, Heads>, CollectiveError> {
    x.all_to_all::<Context, 1, 2>()
}

/// Ulysses: heads to sequence.
fn to_sequence<'p>(
    x: &DTensor<'p, ModelMesh, Heads>,
) -> Result<DTensor<'p, ModelMesh, Seq>, CollectiveError> {
    x.all_to_all::<Context, 2, 1>()
}

/// A local `[b, H, s, D]` value as a tensor with the sequence over `context`.
fn declare<'p>(
    p: &'p Spmd<'_, ModelMesh>,
    x: Value,
) -> Result<DTensor<'p, ModelMesh, Seq>, CollectiveError> {
    p.declare::<Seq, Invariant>(x)
}

/// USP: a `[b, H, s, D]` block (piece `u` of ring chunk `r`) to the whole chunk `r` of
/// `H/U` heads, replicating the heads `rep` times first.
fn to_chunks<'p>(
    x: &DTensor<'p, ModelMesh, Seq>,
    rep: usize,
) -> Result<DTensor<'p, ModelMesh, Chunks>, CollectiveError> {
    let x = replicate_heads(x, rep)?;
    x.map_local_as::<Pieces, Invariant>(|f, v| {
        let d = f.value_type(v)?.dims.clone();
        Ok(f.reshape(v, &[d[0], d[1], 1, d[2], d[3]])?)
    })?
    .all_to_all::<Context, 1, 3>()?
    .map_local_as::<Chunks, Invariant>(|f, v| {
        let d = f.value_type(v)?.dims.clone();
        Ok(f.reshape(v, &[d[0], d[1], d[2] * d[3], d[4]])?)
    })
}

/// The inverse of [`to_chunks`] for the output (whose heads are not replicated).
fn from_chunks<'p>(
    x: &DTensor<'p, ModelMesh, Chunks>,
) -> Result<DTensor<'p, ModelMesh, Seq>, CollectiveError> {
    x.map_local_as::<Chunks5, Invariant>(|f, v| {
        let d = f.value_type(v)?.dims.clone();
        Ok(f.reshape(v, &[d[0], d[1], 1, d[2], d[3]])?)
    })?
    .all_to_all::<Context, 3, 1>()?
    .map_local_as::<Seq, Invariant>(|f, v| {
        let d = f.value_type(v)?.dims.clone();
        Ok(f.reshape(v, &[d[0], d[1], d[3], d[4]])?)
    })
}
