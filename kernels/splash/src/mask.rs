//! Attention masks: which keys each query may attend to.
//!
//! A [`Mask`] is a predicate over *global* (query position, key position) pairs, with the same
//! semantics as JAX's splash attention masks (`splash_attention_mask.py`): causal with an offset,
//! local windows, chunked causal, dense masks, and their logical combinations. A
//! [`MultiHeadMask`] gives every query head a mask (one shared mask, or one per head).
//!
//! Positions are global so that a shard of a longer sequence attends correctly: a device
//! holding queries `q_offset..q_offset + q_len` and keys `kv_offset..kv_offset + kv_len`
//! evaluates the same mask at shifted positions ([`SeqOffsets`]). This is how context
//! parallelism (all-gather, ring, Ulysses) reuses one mask definition on every device.

use std::fmt;
use std::sync::Arc;

use crate::error::{MaskError, MaskParseError, SplashError};

/// Which key positions a query position attends to. `true` means visible.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Mask {
    /// Every key is visible.
    Full,
    /// Key `kv` is visible to query `q` iff `kv <= q + offset` (JAX `CausalMask`).
    Causal {
        /// Shifts the diagonal: positive offsets let queries see `offset` keys ahead.
        offset: i64,
    },
    /// Key `kv` is visible to query `q` iff `q + offset - left <= kv <= q + offset + right`
    /// (JAX `LocalMask`); `None` leaves that side unbounded.
    Local {
        left: Option<u64>,
        right: Option<u64>,
        offset: i64,
    },
    /// Causal within chunks of `chunk` positions: visible iff `kv <= q` and
    /// `q / chunk == kv / chunk` (JAX `ChunkedCausalMask`, Llama 4's chunked attention).
    ChunkedCausal {
        /// The chunk length (positive).
        chunk: u64,
    },
    /// A dense boolean mask over the global positions it covers.
    Dense(DenseMask),
    /// Visible iff visible in both.
    And(Box<Mask>, Box<Mask>),
    /// Visible iff visible in either.
    Or(Box<Mask>, Box<Mask>),
}

impl fmt::Debug for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mask::Full => write!(f, "full"),
            Mask::Causal { offset: 0 } => write!(f, "causal"),
            Mask::Causal { offset } => write!(f, "causal(offset={offset})"),
            Mask::Local {
                left,
                right,
                offset,
            } => {
                let side = |s: &Option<u64>| s.map_or_else(|| "inf".to_string(), |v| v.to_string());
                write!(f, "local({}, {}", side(left), side(right))?;
                if *offset != 0 {
                    write!(f, ", offset={offset}")?;
                }
                write!(f, ")")
            }
            Mask::ChunkedCausal { chunk } => write!(f, "chunked({chunk})"),
            Mask::Dense(d) => write!(f, "dense({}x{})", d.q_len, d.kv_len),
            Mask::And(a, b) => write!(f, "({a:?} & {b:?})"),
            Mask::Or(a, b) => write!(f, "({a:?} | {b:?})"),
        }
    }
}

/// A dense boolean mask: `q_len` rows (query positions) by `kv_len` columns (key positions).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DenseMask {
    q_len: usize,
    kv_len: usize,
    bits: Arc<Vec<bool>>,
}

impl fmt::Debug for DenseMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let visible = self.bits.iter().filter(|&&b| b).count();
        write!(
            f,
            "DenseMask({}x{}, {visible} visible)",
            self.q_len, self.kv_len
        )
    }
}

impl DenseMask {
    /// A mask from row-major booleans (`bits[q * kv_len + kv]`).
    pub fn new(q_len: usize, kv_len: usize, bits: Vec<bool>) -> Result<Self, SplashError> {
        if q_len == 0 || kv_len == 0 || bits.len() != q_len * kv_len {
            return Err(SplashError::Mask(MaskError::DenseSize {
                q_len,
                kv_len,
                got: bits.len(),
            }));
        }
        Ok(DenseMask {
            q_len,
            kv_len,
            bits: Arc::new(bits),
        })
    }

    /// A mask from a predicate over (query, key) positions.
    pub fn from_fn(q_len: usize, kv_len: usize, f: impl Fn(usize, usize) -> bool) -> Self {
        let bits = (0..q_len * kv_len)
            .map(|x| f(x / kv_len, x % kv_len))
            .collect();
        DenseMask {
            q_len,
            kv_len,
            bits: Arc::new(bits),
        }
    }

    pub fn q_len(&self) -> usize {
        self.q_len
    }

    pub fn kv_len(&self) -> usize {
        self.kv_len
    }

    fn get(&self, q: i64, kv: i64) -> bool {
        // Positions are checked against the mask's extent when a MaskInfo is built.
        self.bits[q as usize * self.kv_len + kv as usize]
    }
}

/// Whether a block of the attention matrix needs computing, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// No visible entry: the block is skipped.
    Empty,
    /// Some entries visible: computed with the mask applied.
    Partial,
    /// Every entry visible: computed without evaluating the mask.
    Full,
}

impl BlockKind {
    /// The code the kernels read from the `block_mask` table.
    pub fn code(self) -> i32 {
        match self {
            BlockKind::Empty => 0,
            BlockKind::Partial => 1,
            BlockKind::Full => 2,
        }
    }
}

/// Positions (query and key, offsets included) must stay below this, so that every mask
/// quantity the kernels compute fits in i32.
pub const MAX_POSITION: usize = 1 << 29;

/// A window, chunk or offset clamped to where it saturates: every position is below
/// [`MAX_POSITION`], so larger values mean the same as this bound (and cannot overflow).
fn sat(x: u64) -> i64 {
    x.min(MAX_POSITION as u64) as i64
}

fn sat_signed(x: i64) -> i64 {
    x.clamp(-(MAX_POSITION as i64), MAX_POSITION as i64)
}

/// A rectangle of global positions: queries `q0..q1`, keys `k0..k1` (non-empty).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rect {
    pub q0: i64,
    pub q1: i64,
    pub k0: i64,
    pub k1: i64,
}

impl Mask {
    /// A causal mask (`kv <= q`).
    pub fn causal() -> Self {
        Mask::Causal { offset: 0 }
    }

    /// A local window: `q - left <= kv <= q + right`.
    pub fn local(left: u64, right: u64) -> Self {
        Mask::Local {
            left: Some(left),
            right: Some(right),
            offset: 0,
        }
    }

    /// Chunked causal attention with chunks of `chunk` positions.
    pub fn chunked(chunk: u64) -> Self {
        Mask::ChunkedCausal { chunk }
    }

    /// Both masks.
    pub fn and(self, other: Mask) -> Self {
        Mask::And(Box::new(self), Box::new(other))
    }

    /// Either mask.
    pub fn or(self, other: Mask) -> Self {
        Mask::Or(Box::new(self), Box::new(other))
    }

    /// Parses the CLI form: `full`, `causal`, `causal:OFFSET`, `local:LEFT:RIGHT`,
    /// `chunked:SIZE`.
    pub fn parse(s: &str) -> Result<Self, SplashError> {
        let bad = |why: MaskParseError| {
            SplashError::Mask(MaskError::Parse {
                spec: s.to_string(),
                why,
            })
        };
        let parts: Vec<&str> = s.split(':').collect();
        let int = |t: &str, what: &'static str| -> Result<i64, SplashError> {
            t.trim().parse::<i64>().map_err(|_| {
                bad(MaskParseError::NotAnInteger {
                    what,
                    text: t.to_string(),
                })
            })
        };
        let count = |t: &str, what: &'static str| -> Result<u64, SplashError> {
            t.trim().parse::<u64>().map_err(|_| {
                bad(MaskParseError::NotACount {
                    what,
                    text: t.to_string(),
                })
            })
        };
        match parts.as_slice() {
            ["full"] => Ok(Mask::Full),
            ["causal"] => Ok(Mask::causal()),
            ["causal", off] => Ok(Mask::Causal {
                offset: int(off, "the offset")?,
            }),
            ["local", l, r] => Ok(Mask::local(
                count(l, "the left window")?,
                count(r, "the right window")?,
            )),
            ["chunked", c] => {
                let c = count(c, "the chunk size")?;
                if c == 0 {
                    return Err(bad(MaskParseError::ZeroChunk));
                }
                Ok(Mask::chunked(c))
            }
            _ => Err(bad(MaskParseError::UnknownForm)),
        }
    }

    /// Whether key position `kv` is visible to query position `q` (global positions).
    pub fn allows(&self, q: i64, kv: i64) -> bool {
        match self {
            Mask::Dense(d) => d.get(q, kv),
            Mask::And(a, b) => a.allows(q, kv) && b.allows(q, kv),
            Mask::Or(a, b) => a.allows(q, kv) || b.allows(q, kv),
            // Every other mask is a computable leaf (`leaf_expr` is `Some`).
            leaf => leaf.leaf_expr().is_some_and(|e| {
                let Ok(visible) = e.eval(&mut HostPositions, q, kv);
                visible
            }),
        }
    }

    /// Whether the mask has a dense component (else it is computable in-kernel from iota).
    pub fn is_computable(&self) -> bool {
        match self {
            Mask::Dense(_) => false,
            Mask::And(a, b) | Mask::Or(a, b) => a.is_computable() && b.is_computable(),
            _ => true,
        }
    }

    /// Checks parameters and that dense parts cover the positions a rectangle of queries
    /// `q0..q1` and keys `k0..k1` will read.
    pub(crate) fn check(&self, q_end: i64, kv_end: i64) -> Result<(), SplashError> {
        match self {
            Mask::ChunkedCausal { chunk: 0 } => Err(SplashError::Mask(MaskError::ZeroChunk)),
            Mask::Dense(d) if q_end > d.q_len as i64 || kv_end > d.kv_len as i64 => {
                Err(SplashError::Mask(MaskError::DenseExtent {
                    q_len: d.q_len,
                    kv_len: d.kv_len,
                    q_end,
                    kv_end,
                }))
            }
            Mask::And(a, b) | Mask::Or(a, b) => {
                a.check(q_end, kv_end)?;
                b.check(q_end, kv_end)
            }
            _ => Ok(()),
        }
    }

    /// Classifies a rectangle: exact for every mask (closed forms for the computable leaves,
    /// element-wise evaluation where a combination is not decided by its parts).
    pub(crate) fn classify(&self, r: Rect) -> BlockKind {
        match self.classify_fast(r) {
            Some(kind) => kind,
            None => self.classify_exact(r),
        }
    }

    /// Closed-form classification; `None` when undecided without evaluating elements.
    fn classify_fast(&self, r: Rect) -> Option<BlockKind> {
        let Rect { q0, q1, k0, k1 } = r;
        let (ql, kl) = (q1 - 1, k1 - 1);
        let sat_off = |o: &i64| sat_signed(*o);
        Some(match self {
            Mask::Full => BlockKind::Full,
            Mask::Causal { offset } => {
                let offset = sat_off(offset);
                if kl <= q0 + offset {
                    BlockKind::Full
                } else if k0 > ql + offset {
                    BlockKind::Empty
                } else {
                    BlockKind::Partial
                }
            }
            Mask::Local {
                left,
                right,
                offset,
            } => {
                let offset = sat_off(offset);
                let left = left.map(sat);
                let right = right.map(sat);
                let full = left.is_none_or(|l| k0 >= ql + offset - l)
                    && right.is_none_or(|rt| kl <= q0 + offset + rt);
                // Some query q in q0..=ql sees some key: q >= k0 - offset - right and
                // q <= kl - offset + left.
                let lo = right.map_or(q0, |rt| q0.max(k0 - offset - rt));
                let hi = left.map_or(ql, |l| ql.min(kl - offset + l));
                if full {
                    BlockKind::Full
                } else if lo > hi {
                    BlockKind::Empty
                } else {
                    BlockKind::Partial
                }
            }
            Mask::ChunkedCausal { chunk } => {
                let c = sat(*chunk);
                let (qc0, qc1) = (q0.div_euclid(c), ql.div_euclid(c));
                let (kc0, kc1) = (k0.div_euclid(c), kl.div_euclid(c));
                if qc0 == qc1 && kc0 == kc1 && qc0 == kc0 && kl <= q0 {
                    BlockKind::Full
                } else {
                    // Any chunk shared by both ranges with a key at or before a query in it.
                    let any = (qc0.max(kc0)..=qc1.min(kc1)).any(|ch| {
                        let lo_k = k0.max(ch * c);
                        let hi_q = ql.min(ch * c + c - 1);
                        lo_k <= hi_q
                    });
                    if any {
                        BlockKind::Partial
                    } else {
                        BlockKind::Empty
                    }
                }
            }
            Mask::Dense(_) => return None,
            Mask::And(a, b) => match (a.classify_fast(r), b.classify_fast(r)) {
                (Some(BlockKind::Empty), _) | (_, Some(BlockKind::Empty)) => BlockKind::Empty,
                (Some(BlockKind::Full), Some(other)) | (Some(other), Some(BlockKind::Full)) => {
                    other
                }
                _ => return None,
            },
            Mask::Or(a, b) => match (a.classify_fast(r), b.classify_fast(r)) {
                (Some(BlockKind::Full), _) | (_, Some(BlockKind::Full)) => BlockKind::Full,
                (Some(BlockKind::Empty), Some(other)) | (Some(other), Some(BlockKind::Empty)) => {
                    other
                }
                _ => return None,
            },
        })
    }

    fn classify_exact(&self, r: Rect) -> BlockKind {
        let (mut any, mut all) = (false, true);
        for q in r.q0..r.q1 {
            for kv in r.k0..r.k1 {
                if self.allows(q, kv) {
                    any = true;
                } else {
                    all = false;
                }
                if any && !all {
                    return BlockKind::Partial;
                }
            }
        }
        match (any, all) {
            (true, true) => BlockKind::Full,
            (false, _) => BlockKind::Empty,
            _ => BlockKind::Partial,
        }
    }

    /// The in-kernel form of a computable mask; `None` if it has a dense part.
    pub(crate) fn to_expr(&self) -> Option<MaskExpr> {
        match self {
            Mask::And(a, b) => Some(MaskExpr::And(
                Box::new(a.to_expr()?),
                Box::new(b.to_expr()?),
            )),
            Mask::Or(a, b) => Some(MaskExpr::Or(Box::new(a.to_expr()?), Box::new(b.to_expr()?))),
            leaf => leaf.leaf_expr(),
        }
    }

    /// The in-kernel form of a computable leaf, with its parameters saturated; `None` for a
    /// dense mask or a combination.
    fn leaf_expr(&self) -> Option<MaskExpr> {
        Some(match self {
            Mask::Full => MaskExpr::Full,
            Mask::Causal { offset } => MaskExpr::Causal {
                offset: sat_signed(*offset),
            },
            Mask::Local {
                left,
                right,
                offset,
            } => MaskExpr::Local {
                left: left.map(sat),
                right: right.map(sat),
                offset: sat_signed(*offset),
            },
            Mask::ChunkedCausal { chunk } => MaskExpr::Chunked { chunk: sat(*chunk) },
            Mask::Dense(_) | Mask::And(..) | Mask::Or(..) => return None,
        })
    }
}

/// A computable mask as the kernels evaluate it from iota (a compile-time parameter), and
/// the one definition of each mask's semantics (its `eval`, generic over the values: host
/// positions, traced kernel values, StableHLO values). Windows, chunks and offsets are
/// clamped to `±MAX_POSITION`, so the kernels' i32 arithmetic cannot overflow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MaskExpr {
    Full,
    Causal {
        offset: i64,
    },
    Local {
        left: Option<i64>,
        right: Option<i64>,
        offset: i64,
    },
    Chunked {
        chunk: i64,
    },
    And(Box<MaskExpr>, Box<MaskExpr>),
    Or(Box<MaskExpr>, Box<MaskExpr>),
}

impl MaskExpr {
    /// Whether each key position in `kv` is visible to the query position in `q` at the same
    /// (broadcast) place, computed with `ops`: on host integers ([`Mask::allows`]), on traced
    /// kernel values (the splash kernels) or on StableHLO values (the dense baseline).
    pub(crate) fn eval<P: PositionOps>(
        &self,
        ops: &mut P,
        q: P::Pos,
        kv: P::Pos,
    ) -> Result<P::Vis, P::Error> {
        match self {
            MaskExpr::Full => ops.all_visible(),
            MaskExpr::Causal { offset } => {
                let last = ops.add(q, *offset)?;
                ops.le(kv, last)
            }
            MaskExpr::Local {
                left,
                right,
                offset,
            } => {
                let center = ops.add(q, *offset)?;
                let after_first = match left {
                    Some(l) => {
                        let first = ops.add(center, -l)?;
                        Some(ops.le(first, kv)?)
                    }
                    None => None,
                };
                let before_last = match right {
                    Some(r) => {
                        let last = ops.add(center, *r)?;
                        Some(ops.le(kv, last)?)
                    }
                    None => None,
                };
                match (after_first, before_last) {
                    (Some(a), Some(b)) => ops.and(a, b),
                    (Some(a), None) | (None, Some(a)) => Ok(a),
                    (None, None) => ops.all_visible(),
                }
            }
            MaskExpr::Chunked { chunk } => {
                let causal = ops.le(kv, q)?;
                let q_chunk = ops.chunk_index(q, *chunk)?;
                let kv_chunk = ops.chunk_index(kv, *chunk)?;
                let same_chunk = ops.eq(q_chunk, kv_chunk)?;
                ops.and(causal, same_chunk)
            }
            MaskExpr::And(a, b) => {
                let a = a.eval(ops, q, kv)?;
                let b = b.eval(ops, q, kv)?;
                ops.and(a, b)
            }
            MaskExpr::Or(a, b) => {
                let a = a.eval(ops, q, kv)?;
                let b = b.eval(ops, q, kv)?;
                ops.or(a, b)
            }
        }
    }
}

/// The position arithmetic and comparisons a mask is made of. [`MaskExpr::eval`] is written
/// once over them; the host, the kernels and the dense baseline each implement them for their
/// own values. Constants stay within `±2 * MAX_POSITION`, so they fit in i32.
pub(crate) trait PositionOps {
    /// Positions (a scalar, or a tensor that broadcasts against the other operand).
    type Pos: Copy;
    /// Visibility (`true`: visible).
    type Vis;
    /// What building an operation can fail with.
    type Error;

    /// `p + by`.
    fn add(&mut self, p: Self::Pos, by: i64) -> Result<Self::Pos, Self::Error>;
    /// The index of the chunk of `chunk` positions that `p` (non-negative) falls in.
    fn chunk_index(&mut self, p: Self::Pos, chunk: i64) -> Result<Self::Pos, Self::Error>;
    /// `a <= b`.
    fn le(&mut self, a: Self::Pos, b: Self::Pos) -> Result<Self::Vis, Self::Error>;
    /// `a == b`.
    fn eq(&mut self, a: Self::Pos, b: Self::Pos) -> Result<Self::Vis, Self::Error>;
    /// Visible in both.
    fn and(&mut self, a: Self::Vis, b: Self::Vis) -> Result<Self::Vis, Self::Error>;
    /// Visible in either.
    fn or(&mut self, a: Self::Vis, b: Self::Vis) -> Result<Self::Vis, Self::Error>;
    /// Everything visible.
    fn all_visible(&mut self) -> Result<Self::Vis, Self::Error>;
}

/// Masks on host positions (the f64 reference, the block tables).
struct HostPositions;

impl PositionOps for HostPositions {
    type Pos = i64;
    type Vis = bool;
    type Error = std::convert::Infallible;

    fn add(&mut self, p: i64, by: i64) -> Result<i64, Self::Error> {
        Ok(p + by)
    }
    fn chunk_index(&mut self, p: i64, chunk: i64) -> Result<i64, Self::Error> {
        Ok(p.div_euclid(chunk))
    }
    fn le(&mut self, a: i64, b: i64) -> Result<bool, Self::Error> {
        Ok(a <= b)
    }
    fn eq(&mut self, a: i64, b: i64) -> Result<bool, Self::Error> {
        Ok(a == b)
    }
    fn and(&mut self, a: bool, b: bool) -> Result<bool, Self::Error> {
        Ok(a && b)
    }
    fn or(&mut self, a: bool, b: bool) -> Result<bool, Self::Error> {
        Ok(a || b)
    }
    fn all_visible(&mut self) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

/// The mask of every query head: one shared mask or one per head.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MultiHeadMask {
    /// All heads use this mask.
    Shared(Mask),
    /// Head `h` uses `masks[h]`.
    PerHead(Vec<Mask>),
}

impl From<Mask> for MultiHeadMask {
    fn from(m: Mask) -> Self {
        MultiHeadMask::Shared(m)
    }
}

impl MultiHeadMask {
    /// The mask of query head `h`.
    pub fn head(&self, h: usize) -> &Mask {
        match self {
            MultiHeadMask::Shared(m) => m,
            MultiHeadMask::PerHead(ms) => &ms[h],
        }
    }

    /// Checks the mask against the number of query heads.
    pub(crate) fn check_heads(&self, heads: usize) -> Result<(), SplashError> {
        match self {
            MultiHeadMask::PerHead(ms) if ms.len() != heads => {
                Err(SplashError::Mask(MaskError::PerHeadCount {
                    masks: ms.len(),
                    heads,
                }))
            }
            MultiHeadMask::PerHead(ms) if ms.is_empty() => {
                Err(SplashError::Mask(MaskError::NoPerHeadMasks))
            }
            _ => Ok(()),
        }
    }

    /// The distinct masks and each head's index into them (heads sharing a mask share tables).
    pub(crate) fn classes(&self, heads: usize) -> (Vec<Mask>, Vec<usize>) {
        match self {
            MultiHeadMask::Shared(m) => (vec![m.clone()], vec![0; heads]),
            MultiHeadMask::PerHead(ms) => {
                let mut distinct: Vec<Mask> = Vec::new();
                let mut class = Vec::with_capacity(ms.len());
                for m in ms {
                    match distinct.iter().position(|d| d == m) {
                        Some(i) => class.push(i),
                        None => {
                            distinct.push(m.clone());
                            class.push(distinct.len() - 1);
                        }
                    }
                }
                (distinct, class)
            }
        }
    }
}

/// Where a (possibly sharded) attention's queries and keys sit in the global sequence:
/// local query `i` is at position `q + i`, local key `j` at `kv + j`.
///
/// A device holding query shard `r` of an all-gathered sequence of shards of `n` uses
/// `q = r * n`; in ring attention the key/value block received from device `s` uses
/// `kv = s * n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqOffsets {
    pub q: usize,
    pub kv: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rects(s: i64, b: i64) -> impl Iterator<Item = Rect> {
        (0..s / b).flat_map(move |i| {
            (0..s / b).map(move |j| Rect {
                q0: i * b + 3,
                q1: i * b + b + 3,
                k0: j * b,
                k1: j * b + b,
            })
        })
    }

    #[test]
    fn closed_forms_agree_with_element_wise_classification() {
        let masks = [
            Mask::Full,
            Mask::causal(),
            Mask::Causal { offset: -5 },
            Mask::Causal { offset: 17 },
            Mask::local(9, 0),
            Mask::local(0, 20),
            Mask::Local {
                left: None,
                right: Some(3),
                offset: 4,
            },
            Mask::Local {
                left: Some(30),
                right: None,
                offset: -2,
            },
            Mask::chunked(12),
            Mask::chunked(16),
            Mask::causal().and(Mask::local(20, 0)),
            Mask::chunked(24).or(Mask::local(3, 3)),
        ];
        for m in &masks {
            for b in [8, 16] {
                for r in rects(64, b) {
                    assert_eq!(m.classify(r), m.classify_exact(r), "{m:?} on {r:?}");
                }
            }
        }
    }

    #[test]
    fn allows_follows_each_definition() {
        // The definitions, written out independently of `MaskExpr::eval`.
        type Definition = fn(i64, i64) -> bool;
        let cases: [(Mask, Definition); 6] = [
            (Mask::Full, |_, _| true),
            (Mask::Causal { offset: -3 }, |q, k| k <= q - 3),
            (Mask::local(2, 1), |q, k| q - 2 <= k && k <= q + 1),
            (
                Mask::Local {
                    left: None,
                    right: Some(u64::MAX),
                    offset: 5,
                },
                |_, _| true,
            ),
            (Mask::chunked(4), |q, k| k <= q && q / 4 == k / 4),
            (
                Mask::local(0, 2).and(Mask::causal()).or(Mask::chunked(8)),
                |q, k| k == q || (k <= q && q / 8 == k / 8),
            ),
        ];
        for (mask, visible) in &cases {
            for q in 0..24 {
                for k in 0..24 {
                    assert_eq!(mask.allows(q, k), visible(q, k), "{mask:?} at ({q}, {k})");
                }
            }
        }
    }

    #[test]
    fn parses_the_cli_forms() {
        assert_eq!(Mask::parse("full").unwrap(), Mask::Full);
        assert_eq!(Mask::parse("causal").unwrap(), Mask::causal());
        assert_eq!(
            Mask::parse("causal:-3").unwrap(),
            Mask::Causal { offset: -3 }
        );
        assert_eq!(Mask::parse("local:4:0").unwrap(), Mask::local(4, 0));
        assert_eq!(Mask::parse("chunked:64").unwrap(), Mask::chunked(64));
        for bad in [
            "",
            "causal:x",
            "local:1",
            "chunked:0",
            "window:3",
            "local:-1:2",
        ] {
            let e = Mask::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected full, causal"), "{bad}: {e}");
        }
    }
}
