//! USP, the Ulysses x ring hybrid, on a 2-D mesh `[ulysses U, ring R]`.
//!
//! The sequence is cut into `R` ring chunks of `S/R`, and each ring chunk into `U` pieces of
//! `S/(U R)`: device `(u, r)` holds piece `u` of chunk `r`. The programs see the sequence as
//! `[R, S/R]` (dims 2 and 3 of a 5-D view, a free reshape of the global array), so each of
//! the two splits has its own dim and mesh axis. An all-to-all over `ulysses` (split heads,
//! concatenate the pieces) gives device `(u, r)` the whole chunk `r` for `H/U` heads; ring
//! attention over `ring` runs on those chunks; the inverse all-to-all brings the output back.
//! The backward is the forward's gradient (the all-to-alls' and the ring permutes'
//! transposes around splash's backward kernels).

use tessera_collectives::{
    CollectiveError, DTensor, Invariant, Mesh, Program, Replicated, Split, Spmd,
};
use tessera_dsl::DType;
use tessera_hlo::{FuncBuilder, Value};

use super::ops::{BySequence, RingAttention, WholeSegmentIds};
use super::seq_dim;
use super::{
    output_gradients, replicate_heads, ContextParallel, CpError, OutLse, RingAxis, Strategy,
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

/// Re-shards a `[B, H, S, D]` tensor in pieces to whole chunks (replicating each head `rep`
/// times first).
fn chunks_of<'p>(
    x: &DTensor<'p, UspMesh, Pieces>,
    rep: usize,
) -> Result<DTensor<'p, UspMesh, Chunks>, CollectiveError> {
    let x = replicate_heads(x, rep)?;
    x.all_to_all::<UlyssesAxis, 1, 3>()?
        .map_local_as::<Chunks, Invariant>(|f, v| chunk_view(f, v, false))
}

/// A `[B, H/U, S, D]` chunk (f32) in pieces, as `dtype`.
fn to_pieces_of<'p>(
    cp: &ContextParallel,
    x: &DTensor<'p, UspMesh, Chunks>,
) -> Result<DTensor<'p, UspMesh, Pieces>, CollectiveError> {
    x.convert(cp.dtype)?
        .map_local_as::<Chunks5, Invariant>(|f, v| chunk_view(f, v, true))?
        .all_to_all::<UlyssesAxis, 3, 1>()
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

/// The forward on `q, k, v` in pieces: re-shards them to whole chunks by heads, runs the
/// ring, and brings `out` and `lse` back to pieces.
fn attend<'p>(
    cp: &ContextParallel,
    ring: &RingAttention<RingAxis>,
    p: &'p Spmd<'_, UspMesh>,
    [q, k, v]: [&DTensor<'p, UspMesh, Pieces>; 3],
    seg: Option<&DTensor<'p, UspMesh, WholeSegmentIds<Replicated>>>,
) -> Result<OutLse<'p, UspMesh, Pieces, Pieces4>, CollectiveError> {
    let rep = cp.kv_replication();
    let q = chunks_of(q, 1)?;
    let k = chunks_of(k, rep)?;
    let v = chunks_of(v, rep)?;
    let shard = p.axis_index::<RingAxis>()?;
    let partial = ring.forward(p, &shard, &q, &k, &v, seg)?;
    let out = to_pieces_of(cp, &partial.out)?;
    // [B, h, n] -> [B, h, 1, n], then the pieces back over `ulysses`.
    let lse = partial
        .lse
        .map_local_as::<Chunks4Lse, Invariant>(|f, lse| {
            let d = f.value_type(lse)?.dims.clone();
            Ok(f.reshape(lse, &[d[0], d[1], 1, d[2]])?)
        })?
        .all_to_all::<UlyssesAxis, 3, 1>()?;
    Ok((out, lse))
}

/// Declares a `[B, H, S, D]` argument in pieces.
fn arg<'p>(
    cp: &ContextParallel,
    p: &'p Spmd<'_, UspMesh>,
    dims: [i64; 4],
) -> Result<DTensor<'p, UspMesh, Pieces>, CollectiveError> {
    p.arg::<Pieces>(pieces_dims(cp, dims), cp.dtype)
}

pub(super) fn forward(cp: &ContextParallel, segmented: bool) -> Result<Program<UspMesh>, CpError> {
    let ring = RingAttention::<RingAxis>::new(cp)?;
    let g = cp.global_dims();
    Ok(Program::build("usp_fwd", &mesh(cp)?, |p| {
        let (q, k, v) = (arg(cp, p, g.q)?, arg(cp, p, g.k)?, arg(cp, p, g.v)?);
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let (out, lse) = attend(cp, &ring, p, [&q, &k, &v], seg.as_ref())?;
        out.output::<Pieces>()?;
        lse.output::<Pieces4>()
    })?)
}

/// The forward + backward program: `q, k, v, dout` in pieces in, `out`, `lse` and
/// `dq, dk, dv` out (the gradient of the forward).
pub(super) fn forward_backward(
    cp: &ContextParallel,
    segmented: bool,
) -> Result<Program<UspMesh>, CpError> {
    let ring = RingAttention::<RingAxis>::new(cp)?;
    let g = cp.global_dims();
    Ok(Program::build("usp_fwdbwd", &mesh(cp)?, |p| {
        let (q, k, v) = (arg(cp, p, g.q)?, arg(cp, p, g.k)?, arg(cp, p, g.v)?);
        let dout = arg(cp, p, g.out)?;
        let seg = segmented.then(|| gather_segments(cp, p)).transpose()?;
        let (out, lse) = attend(cp, &ring, p, [&q, &k, &v], seg.as_ref())?;
        out.output::<Pieces>()?;
        lse.output::<Pieces4>()?;
        output_gradients(p, &out, &dout, [&q, &k, &v])
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
