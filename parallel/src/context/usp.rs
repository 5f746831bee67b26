//! USP, the Ulysses x ring hybrid, on a 2-D mesh `[ulysses U, ring R]`.
//!
//! The sequence is cut into `R` ring chunks of `S/R`, and each ring chunk into `U` pieces of
//! `S/(U R)`: device `(u, r)` holds piece `u` of chunk `r`. The programs see the sequence as
//! `[R, S/R]` (dims 2 and 3 of a 5-D view, a free reshape of the global array), so each of
//! the two splits has its own dim and mesh axis. An all-to-all over `ulysses` (split heads,
//! concatenate the pieces) gives device `(u, r)` the whole chunk `r` for `H/U` heads; ring
//! attention over `ring` runs on those chunks; the inverse all-to-all brings the output back.

use tessera_collectives::{
    CollectiveError, DTensor, Invariant, Mesh, Program, Replicated, Split, Spmd,
};
use tessera_dsl::DType;
use tessera_hlo::{FuncBuilder, Value};

use super::ops::{BySequence, BySequenceRows, RingAttention, WholeSegmentIds};
use super::ring::{backward_steps, forward_steps};
use super::seq_dim;
use super::{
    replicate_heads, sum_replicated_heads, ContextParallel, CpError, RingAxis, Strategy,
    UlyssesAxis, UspMesh,
};

/// `[B, H, R, S/R, D]`: chunks over `ring`, pieces of a chunk over `ulysses`.
type Pieces = (
    Replicated,
    Replicated,
    Split<RingAxis>,
    Split<UlyssesAxis>,
    Replicated,
);
/// `[B, H, R, S/R]` (logsumexp).
type Pieces4 = (Replicated, Replicated, Split<RingAxis>, Split<UlyssesAxis>);
/// `[B, R, S/R]` (segment ids).
type SegPieces = (Replicated, Split<RingAxis>, Split<UlyssesAxis>);
/// `[B, H/U, R, S/R, D]` after the all-to-all: whole chunks, heads over `ulysses`.
type Chunks5 = (
    Replicated,
    Split<UlyssesAxis>,
    Split<RingAxis>,
    Replicated,
    Replicated,
);
/// `[B, H/U, R, S/R]`.
type Chunks4Lse = (Replicated, Split<UlyssesAxis>, Split<RingAxis>, Replicated);
/// `[B, H/U, S, D]` with the sequence over `ring`: what the ring steps work on.
type Chunks = BySequence<Replicated, Split<UlyssesAxis>, RingAxis>;
/// `[B, H/U, S]` (logsumexp) with the sequence over `ring`.
type ChunksLse = BySequenceRows<Replicated, Split<UlyssesAxis>, RingAxis>;

fn degrees(cp: &ContextParallel) -> (usize, usize) {
    match cp.strategy {
        Strategy::Usp { ulysses, ring } => (ulysses, ring),
        _ => unreachable!("usp programs are built for the usp strategy"),
    }
}

fn mesh(cp: &ContextParallel) -> Result<Mesh<UspMesh>, CpError> {
    let (u, r) = degrees(cp);
    Ok(Mesh::<UspMesh>::new([u, r])?)
}

/// `[B, H, R, S/R, D]` global dims of a `[B, H, S, D]` array.
fn pieces_dims(cp: &ContextParallel, dims: [i64; 4]) -> [i64; 5] {
    let r = degrees(cp).1 as i64;
    [dims[0], dims[1], r, dims[2] / r, dims[3]]
}

/// Merges dims 2 and 3 of a local value (`[B, h, 1, n, ..] -> [B, h, n, ..]`) or splits them
/// back (`rank_up`).
fn chunk_view(f: &mut FuncBuilder<'_>, x: Value, rank_up: bool) -> Result<Value, CollectiveError> {
    let d = f.value_type(x)?.dims.clone();
    let dims: Vec<i64> = if rank_up {
        [&d[..2], &[1], &d[2..]].concat()
    } else {
        [&d[..2], &[d[2] * d[3]], &d[4..]].concat()
    };
    Ok(f.reshape(x, &dims)?)
}

/// Declares a `[B, H, S, D]` argument in pieces and re-shards it to whole chunks.
fn chunks_of<'p>(
    cp: &ContextParallel,
    p: &'p Spmd<'_, UspMesh>,
    dims: [i64; 4],
    rep: usize,
) -> Result<DTensor<'p, UspMesh, Chunks>, CollectiveError> {
    let x = p.arg::<Pieces>(pieces_dims(cp, dims), cp.dtype)?;
    let x = replicate_heads(&x, rep)?;
    x.all_to_all::<UlyssesAxis, 1, 3>()?
        .map_local_as::<Chunks, Invariant>(|f, v| chunk_view(f, v, false))
}

/// Returns a `[B, H/U, S, D]` chunk (f32) in pieces, as `dtype`.
fn output_pieces(
    cp: &ContextParallel,
    x: &DTensor<'_, UspMesh, Chunks>,
    rep: usize,
) -> Result<(), CollectiveError> {
    let x = x
        .convert(cp.dtype)?
        .map_local_as::<Chunks5, Invariant>(|f, v| chunk_view(f, v, true))?
        .all_to_all::<UlyssesAxis, 3, 1>()?;
    sum_replicated_heads(&x, rep)?.output::<Pieces>()
}

/// The segment ids `[B, S]` (as `[B, R, S/R]` in pieces) gathered whole on every device.
fn gather_segments<'p>(
    cp: &ContextParallel,
    p: &'p Spmd<'_, UspMesh>,
) -> Result<DTensor<'p, UspMesh, WholeSegmentIds<Replicated>>, CollectiveError> {
    let r = degrees(cp).1 as i64;
    let [b, s] = cp.global_dims().seq;
    p.arg::<SegPieces>([b, r, s / r], DType::I32)?
        .all_gather::<UlyssesAxis, 2>()?
        .all_gather::<RingAxis, 1>()?
        .map_local_as::<WholeSegmentIds<Replicated>, Invariant>(|f, x| Ok(f.reshape(x, &[b, s])?))
}

pub(super) fn forward(cp: &ContextParallel, segmented: bool) -> Result<Program<UspMesh>, CpError> {
    let ring = RingAttention::<RingAxis>::new(cp)?;
    let g = cp.global_dims();
    let rep = cp.kv_replication();
    Ok(Program::build("usp_fwd", &mesh(cp)?, |p| {
        let q = chunks_of(cp, p, g.q, 1)?;
        let k = chunks_of(cp, p, g.k, rep)?;
        let v = chunks_of(cp, p, g.v, rep)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let shard = p.axis_index::<RingAxis>()?;
        let partial = forward_steps(p, &ring, &shard, &q, k, v, seg.as_ref())?;
        output_pieces(cp, &partial.out, 1)?;
        // [B, h, n] -> [B, h, 1, n], then the pieces back over `ulysses`.
        partial
            .lse
            .map_local_as::<Chunks4Lse, Invariant>(|f, lse| {
                let d = f.value_type(lse)?.dims.clone();
                Ok(f.reshape(lse, &[d[0], d[1], 1, d[2]])?)
            })?
            .all_to_all::<UlyssesAxis, 3, 1>()?
            .output::<Pieces4>()
    })?)
}

pub(super) fn backward(cp: &ContextParallel, segmented: bool) -> Result<Program<UspMesh>, CpError> {
    let ring = RingAttention::<RingAxis>::new(cp)?;
    let g = cp.global_dims();
    let rep = cp.kv_replication();
    Ok(Program::build("usp_bwd", &mesh(cp)?, |p| {
        let q = chunks_of(cp, p, g.q, 1)?;
        let k = chunks_of(cp, p, g.k, rep)?;
        let v = chunks_of(cp, p, g.v, rep)?;
        let out = chunks_of(cp, p, g.out, 1)?;
        let r = degrees(cp).1 as i64;
        let lse_dims = [g.lse[0], g.lse[1], r, g.lse[2] / r];
        // [B, h, 1, n] -> [B, h, n].
        let lse = p
            .arg::<Pieces4>(lse_dims, DType::F32)?
            .all_to_all::<UlyssesAxis, 1, 3>()?
            .map_local_as::<ChunksLse, Invariant>(|f, lse| {
                let d = f.value_type(lse)?.dims.clone();
                Ok(f.reshape(lse, &[d[0], d[1], d[3]])?)
            })?;
        let dout = chunks_of(cp, p, g.out, 1)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let shard = p.axis_index::<RingAxis>()?;
        let residuals = ring.backward_residuals(p, &q, &out, &lse, &dout)?;
        let grads = backward_steps(p, &ring, &shard, &residuals, k, v, seg.as_ref())?;
        output_pieces(cp, &grads.dq, 1)?;
        output_pieces(cp, &grads.dk, rep)?;
        output_pieces(cp, &grads.dv, rep)
    })?)
}

/// The 5-D view the USP programs take of a `[B, H, S, ...]` host array (`[B, H, R, S/R,
/// ...]`), and back.
pub(super) fn to_pieces(a: &tessera_dsl::HostArray, ring: usize) -> tessera_dsl::HostArray {
    let (s, d) = (a.shape(), seq_dim(a.shape().len()));
    let shape = [&s[..d], &[ring, s[d] / ring], &s[d + 1..]].concat();
    tessera_splash::reshape(a, &shape)
}

/// The inverse of [`to_pieces`] for the programs' outputs (`[B, H, R, S/R, ...]`).
pub(super) fn from_pieces(a: &tessera_dsl::HostArray) -> tessera_dsl::HostArray {
    let s = a.shape();
    let shape = [&s[..2], &[s[2] * s[3]], &s[4..]].concat();
    tessera_splash::reshape(a, &shape)
}
