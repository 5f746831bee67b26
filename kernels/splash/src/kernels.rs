//! The splash attention kernels, written with `#[tpu_kernel]`.
//!
//! Layouts (all row-major): `q`, `out`, `dout`, `dq` are `[B, H, Sq, D]`; `k`, `v`, `dk`,
//! `dv` are `[B, KVH, Skv, D]`; residuals `lse` and `di` are `[B, H, 1, Sq]` (lane-dense
//! rows, as JAX's splash keeps them: a `[.., Sq, 1]` array would pad every query to 128
//! lanes in HBM); query segment ids `[B, 1, Sq]`, key segment ids `[B, 1, Skv]` (both
//! reshapes of `[B, S]`; optional operands, left out by a call without them,
//! [`KernelDef::without`](tessera_dsl::KernelDef::without)). The forward and dQ kernels
//! compute `(bq, bkv)` score tiles and turn the rows they read into columns once per step;
//! the dK/dV kernels compute the transposed `(bkv, bq)` tiles, over which the rows
//! broadcast as they are. Query head `h` uses key/value head
//! `kv_head(h, H / KVH)` (MHA, GQA and MQA alike).
//!
//! Scalar prefetch: the [`MaskInfo`](crate::MaskInfo) tables `data_next`, `block_mask`,
//! `mask_next` (`[TH, rows, width]`, `TH` = 1 when every head shares the mask; the forward's
//! and dQ's also `row_block` and `row_bounds`), each head's
//! mask class `[H]`, the attention sinks `[H]` and the sequence offsets `[2]` (global
//! position of the first query and of the first key).
//!
//! Every grid step looks its block up in the tables: empty entries do nothing (the dK/dV
//! kernels' grids are shrunk to the longest row of non-empty blocks, the forward's and dQ's
//! compacted to every row's non-empty blocks in turn,
//! [`MaskInfo::compacted`](crate::MaskInfo::compacted), their query block and row bounds
//! read from `row_block` and `row_bounds`; padding entries
//! repeat the previous block so nothing new is fetched), full blocks are computed without
//! evaluating the mask and partial blocks with it, computed in-kernel from iota and global
//! positions or loaded from the stored int8 partial blocks; diagonal blocks
//! ([`DIAGONAL`]) are computed by sub-tiles, those above the
//! diagonal skipped.

use std::convert::Infallible;
use std::fmt;

use tessera_dsl::prelude::*;

use crate::mask::{MaskExpr, PositionOps};
use crate::mask_info::{KernelMask, DIAGONAL, ROW_FIRST, ROW_LAST};

/// `block_mask` code of a block computed with the mask.
const PARTIAL: i32 = 1;
/// `block_mask` code of a block computed without the mask.
const FULL: i32 = 2;

/// An `f32` that can key the kernel cache (compared and hashed by its bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct F32Bits(u32);

impl F32Bits {
    pub fn new(x: f32) -> Self {
        F32Bits(x.to_bits())
    }

    pub fn get(self) -> f32 {
        f32::from_bits(self.0)
    }
}

impl fmt::Debug for F32Bits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.get())
    }
}

/// The compile-time configuration of one attention kernel: block sizes and everything that
/// changes the code it traces.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelConfig {
    /// Query rows per grid step.
    pub bq: usize,
    /// Keys per grid step.
    pub bkv: usize,
    /// Keys per inner compute step (divides `bkv`).
    pub bkv_compute: usize,
    /// Logits are `scale * q.k`.
    pub scale: F32Bits,
    /// Logits are `cap * tanh(logits / cap)`.
    pub soft_cap: Option<F32Bits>,
    /// The (finite) floor of the running max: the logit masked entries stand for.
    pub mask_value: F32Bits,
    /// How partial blocks are masked.
    pub mask: KernelMask,
    /// Tables differ per head (index them with the head; else with 0).
    pub per_head: bool,
    /// Some block is partial (trace the masked path).
    pub any_partial: bool,
    /// Some block is full (trace the unmasked path).
    pub any_full: bool,
    /// Attention sinks (one logit per head with a zero value).
    pub sinks: bool,
    /// Lanes of the forward's running max and sum per query row: 1 (a `[bq, 1]` column, the
    /// cheapest form for the StableHLO lowering) or 128 (lane-replicated `[bq, 128]`, so on
    /// TPU they meet `[bq, bkv_compute]` logits and the `[bq, DV]` accumulator by whole-vreg
    /// `repeat`s instead of per-step lane broadcasts; needs `bkv_compute` and `DV` multiples
    /// of 128).
    pub lanes: usize,
    /// The dQ kernel computes keys-by-queries tiles (its tables'
    /// [`MaskInfo::keys_by_queries`](crate::MaskInfo::keys_by_queries); see [`splash_dq`]).
    pub keys_by_queries: bool,
    /// The kernel traces the path of [`DIAGONAL`] blocks, by sub-tiles of this size.
    pub diagonal_sub_tiles: Option<usize>,
    /// The forward scales its query block once per row of its grid (into a `[bq, D]`
    /// scratch) and its key blocks not at all, instead of scaling every key block. Only
    /// for a forward without its `lse` residual: the backward kernels scale the keys, and
    /// the logits they recompute must round as the forward's did.
    pub queries_scaled_once: bool,
}

impl KernelConfig {
    /// Rows of the forward's scaled-query scratch: the query block where
    /// [`KernelConfig::queries_scaled_once`], else one bf16 tile (16 rows; a scratch cannot
    /// be left out, so the unused one is the smallest Mosaic lays out whole).
    pub fn scaled_query_rows(&self) -> usize {
        if self.queries_scaled_once {
            self.bq
        } else {
            16
        }
    }
}

/// The compile-time configuration of the backward preprocessing kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrepConfig {
    pub bq: usize,
    pub sinks: bool,
    /// Sum the rows of `out * dout` with a matmul (Mosaic), not a lane reduction.
    pub rows_on_mxu: bool,
}

/// The key/value head of query head `h` in groups of `group` (`h` itself for MHA, so an
/// index map passes the head grid index through and a lowering may vectorise heads).
fn kv_head(h: Value, group: usize) -> Value {
    if group == 1 {
        h
    } else {
        h / group
    }
}

/// Query head `g` of key/value head `kh`'s group of `group` (`kh` for MHA, where `g` is 0).
fn q_head(kh: Value, g: Value, group: usize) -> Value {
    if group == 1 {
        kh
    } else {
        kh * group + g
    }
}

/// The row of `MaskInfo`'s block tables that head `h` reads (one row shared by every head
/// where the mask is the same for all). The index maps read the tables' block indices
/// through `unchecked_index`: `MaskInfo` builds every entry as a block of the array it
/// indexes (mask_info.rs's unit tests check the tables), so the run-time
/// index checks take them as proven and the pipeline's copies stay unguarded. A caller that
/// passes tables of its own to the raw kernels (`tessera run splash_fwd -i ...`) must build
/// them as `MaskInfo` does.
fn table_row(h: Value, per_head: bool) -> Value {
    if per_head {
        h
    } else {
        constant(DType::I32, &[], 0)
    }
}

fn cast_to(x: Value, dtype: DType) -> Value {
    if x.dtype() == dtype {
        x
    } else {
        x.cast(dtype)
    }
}

/// Masks on traced kernel values: query and key positions (i32) broadcasting to the tile,
/// visibility a bool tile of `shape`.
struct TracedPositions<'a> {
    shape: &'a [usize],
}

impl PositionOps for TracedPositions<'_> {
    type Pos = Value;
    type Vis = Value;
    type Error = Infallible;

    fn add(&mut self, p: Value, by: i64) -> Result<Value, Infallible> {
        // `by` is within ±2 * MAX_POSITION (saturated), so it fits in i32.
        Ok(if by == 0 { p } else { p + by as i32 })
    }
    fn chunk_index(&mut self, p: Value, chunk: i64) -> Result<Value, Infallible> {
        Ok(p / chunk as i32)
    }
    fn le(&mut self, a: Value, b: Value) -> Result<Value, Infallible> {
        Ok(a.le(b))
    }
    fn eq(&mut self, a: Value, b: Value) -> Result<Value, Infallible> {
        Ok(a.eq(b))
    }
    fn and(&mut self, a: Value, b: Value) -> Result<Value, Infallible> {
        Ok(a & b)
    }
    fn or(&mut self, a: Value, b: Value) -> Result<Value, Infallible> {
        Ok(a | b)
    }
    fn all_visible(&mut self) -> Result<Value, Infallible> {
        Ok(constant(DType::Bool, self.shape, true))
    }
}

/// A computable mask on query and key positions broadcasting to `shape`.
fn eval_mask(e: &MaskExpr, q: Value, kv: Value, shape: &[usize]) -> Value {
    let Ok(vis) = e.eval(&mut TracedPositions { shape }, q, kv);
    vis
}

/// The visibility of a `[bq, bkvc]` tile ([`Tile::visible`]) or of its transpose
/// ([`Tile::visible_t`]), or `None` when everything is visible.
///
/// `q_block`/`kv_block` are the tile's block indices (run-time), `q_rows` and `keys` its
/// window inside them (`(start, len)`: the whole query block and one compute step of keys,
/// or a sub-tile of a diagonal block); `masked` selects the partial-block path. Segment ids
/// are rows (`(1, bq)`, `(1, bkv)`); dense partial blocks are stored in the tile's
/// orientation.
struct Tile<'a> {
    cfg: &'a KernelConfig,
    masked: bool,
    q_block: Value,
    kv_block: Value,
    q_rows: (usize, usize),
    keys: (usize, usize),
    offsets: Smem<i32>,
    head_class: Smem<i32>,
    head: Value,
    q_seg: Option<Ref<i32>>,
    kv_seg: Option<Ref<i32>>,
    mask_blocks: Ref<i8>,
}

impl Tile<'_> {
    /// Queries on sublanes, keys on lanes (the forward; dQ inlined as StableHLO).
    fn visible(&self) -> Option<Value> {
        self.visibility(false)
    }

    /// Keys on sublanes, queries on lanes (dK/dV; dQ as a Mosaic call).
    fn visible_t(&self) -> Option<Value> {
        self.visibility(true)
    }

    fn visibility(&self, transposed: bool) -> Option<Value> {
        let cfg = self.cfg;
        let ((q_start, q_len), (k_start, k_len)) = (self.q_rows, self.keys);
        let (all_rows, all_keys) = (q_len == cfg.bq, k_len == cfg.bkv);
        let shape = if transposed {
            [k_len, q_len]
        } else {
            [q_len, k_len]
        };
        let mut vis: Option<Value> = None;
        if self.masked {
            let m = match &cfg.mask {
                KernelMask::Dense => {
                    let window = |whole: bool, start: usize, len: usize| {
                        if whole {
                            all()
                        } else {
                            ds(start, len)
                        }
                    };
                    let rows = window(all_rows, q_start, q_len);
                    let keys = window(all_keys, k_start, k_len);
                    let block = match (all_rows && all_keys, transposed) {
                        (true, _) => self.mask_blocks.load(),
                        (false, true) => self.mask_blocks.at(&[keys, rows]).load(),
                        (false, false) => self.mask_blocks.at(&[rows, keys]).load(),
                    };
                    // Mosaic computes on 32-bit vectors: widen the stored int8 bits first.
                    block.cast(DType::I32).ne(0)
                }
                KernelMask::Computed(exprs) => {
                    let q0 = self.offsets.get([0]) + self.q_block * cfg.bq as i32 + q_start as i32;
                    let k0 =
                        self.offsets.get([1]) + self.kv_block * cfg.bkv as i32 + k_start as i32;
                    let (q, kv) = if transposed {
                        (
                            iota(DType::I32, &[1, q_len], 1),
                            iota(DType::I32, &[k_len, 1], 0),
                        )
                    } else {
                        (
                            iota(DType::I32, &[q_len, 1], 0),
                            iota(DType::I32, &[1, k_len], 1),
                        )
                    };
                    let (q, kv) = (q + q0, kv + k0);
                    let mut m = eval_mask(&exprs[exprs.len() - 1], q, kv, &shape);
                    if exprs.len() > 1 {
                        let class = self.head_class.get([self.head]);
                        for (ci, e) in exprs.iter().enumerate().rev().skip(1) {
                            m = select(class.eq(ci as i32), eval_mask(e, q, kv, &shape), m);
                        }
                    }
                    m
                }
            };
            vis = Some(m);
        }
        // Segment ids restrict attention to equal ids, when the call has them.
        if let (Some(q_seg), Some(kv_seg)) = (self.q_seg, self.kv_seg) {
            let ids = |seg: Ref<i32>, (start, len): (usize, usize), whole: bool| {
                if whole {
                    seg.load()
                } else {
                    seg.at(&[all(), ds(start, len)]).load()
                }
            };
            let q_ids = ids(q_seg, self.q_rows, all_rows);
            let kv_ids = ids(kv_seg, self.keys, all_keys);
            let same = if transposed {
                column(kv_ids).eq(q_ids)
            } else {
                column(q_ids).eq(kv_ids)
            };
            vis = Some(match vis {
                Some(m) => m & same,
                None => same,
            });
        }
        vis
    }
}

/// A `(1, n)` row as an `(n, 1)` column.
fn column(row: Value) -> Value {
    let n = row.shape()[1];
    row.reshape(&[n, 1])
}

/// An `(n, 1)` column as a `(1, n)` row.
fn row_of(col: Value) -> Value {
    let n = col.shape()[0];
    col.reshape(&[1, n])
}

/// `k * scale` rounded to k's dtype: every kernel scales its key blocks the same way (a
/// `(bkv, D)` multiply per key block, not one per `(bq, bkv)` score tile; the dK/dV kernels
/// once per key block, which stays put while they walk query blocks), so the backward
/// recomputes the forward's logits exactly. Then `ds k_scaled` is dQ itself, and dK is
/// `scale * sum of ds^T q` (scaled once at the end).
fn scaled_k(cfg: &KernelConfig, k: Value) -> Value {
    if cfg.scale.get() == 1.0 {
        k
    } else {
        cast_to(scaled(cfg, cast_to(k, DType::F32)), k.dtype())
    }
}

/// `x * scale` (f32), or `x` when the scale is 1.
fn scaled(cfg: &KernelConfig, x: Value) -> Value {
    let scale = cfg.scale.get();
    if scale == 1.0 {
        x
    } else {
        x * scale
    }
}

/// The (soft-capped) logits of a tile from queries and a [`scaled_k`] block (`dot_nt(q, k)`,
/// or its transpose `dot_nt(k, q)` from the dK/dV kernels): `(capped, before-cap)`.
fn logits(cfg: &KernelConfig, a: Value, b: Value) -> (Value, Value) {
    let raw = dot_nt(a, b);
    match cfg.soft_cap {
        Some(c) => {
            let c = c.get();
            ((raw / c).tanh() * c, raw)
        }
        None => (raw, raw),
    }
}

/// `ds` through the soft cap: `d(cap * tanh(x / cap))/dx = 1 - tanh(x / cap)^2`.
fn through_cap(cfg: &KernelConfig, ds: Value, raw: Value) -> Value {
    match cfg.soft_cap {
        Some(c) => {
            let t = (raw / c.get()).tanh();
            ds * (1.0 - t * t)
        }
        None => ds,
    }
}

/// The backward's probabilities `exp(logits - lse)` of a tile, 0 where `vis` (when given)
/// hides an entry. Hidden logits become `-inf` before the exponential (one select on the
/// f32 logits, as the forward masks them); a row that sees no key has `lse = -inf`, which
/// counts as `+inf` here so that all its entries are 0 rather than NaN. `lse` broadcasts
/// over the tile (a column, or a row in the dK/dV kernels' transposed tiles).
fn probabilities(s: Value, lse: Value, vis: Option<Value>) -> Value {
    match vis {
        Some(vis) => {
            let lse = select(lse.eq(f32::NEG_INFINITY), f32::INFINITY, lse);
            (select(vis, s, f32::NEG_INFINITY) - lse).exp()
        }
        None => (s - lse).exp(),
    }
}

/// A window of `len` rows from `start` of a block, or the whole block.
fn rows(r: Ref<impl Element>, start: usize, len: usize, whole: bool) -> Value {
    if whole {
        r.load()
    } else {
        r.at(&[ds(start, len), all()]).load()
    }
}

/// The scaled key sub-tiles (`sub` rows each) of a [`DIAGONAL`] block.
fn key_sub_tiles(cfg: &KernelConfig, k: Ref<impl Element>, sub: usize) -> Vec<Value> {
    (0..cfg.bq / sub)
        .map(|c| scaled_k(cfg, rows(k, c * sub, sub, false)))
        .collect()
}

/// Rows `a * sub..(a + 1) * sub` of a block: query sub-tile `a` of a [`DIAGONAL`] block.
fn sub_tile_rows(a: usize, sub: usize) -> [tessera_dsl::Idx; 2] {
    [ds(a * sub, sub), all()]
}

/// A `[rows, lanes]` running value widened to `[rows, n]` (with one lane, broadcasting does).
fn widen_lanes(x: Value, n: usize, lanes: usize) -> Value {
    if lanes == 1 {
        x
    } else {
        repeat(x, n / lanes, 1)
    }
}

/// The forward's running values over some query rows: the max `m` and sum `l` (`[rows,
/// lanes]`, every lane the same) and the unnormalised output `acc` (`[rows, DV]`, f32).
struct Running {
    m: Value,
    l: Value,
    acc: Value,
}

impl Running {
    /// One online-softmax step over logits `s` (`[rows, keys]`, masked entries `-inf`) and
    /// their values `v` (`[keys, DV]`); `p` meets `v` in `dtype`.
    fn update(self, s: Value, v: Value, dtype: DType, lanes: usize) -> Running {
        let (keys, dv) = (s.shape()[1], self.acc.shape()[1]);
        let m = self.m.maximum(s.max_keepdims(-1));
        let alpha = (self.m - m).exp();
        let p = (s - widen_lanes(m, keys, lanes)).exp();
        let l = alpha * self.l + p.sum_keepdims(-1);
        let acc = self.acc * widen_lanes(alpha, dv, lanes) + dot(cast_to(p, dtype), v);
        Running { m, l, acc }
    }
}

/// Forward: `out = softmax(logits) v` with an online softmax over key blocks, and the
/// logsumexp of every query row (`-inf` for rows that see no key; then `out` is 0) unless
/// the definition leaves `lse` out (a forward no backward follows: JAX's splash with
/// `save_residuals=False`).
#[tpu_kernel(grid = (B, H, R, W),
             dimension_semantics = (parallel, parallel, arbitrary, arbitrary))]
pub fn splash_fwd<T: Element>(
    #[shape(TH, R, W)] data_next: Smem<i32>,
    #[shape(TH, R, W)] block_mask: Smem<i32>,
    #[shape(TH, R, W)] mask_next: Smem<i32>,
    #[shape(TH, R, W)] row_block: Smem<i32>,
    #[shape(TH, R, W)] row_bounds: Smem<i32>,
    #[shape(H)] head_class: Smem<i32>,
    #[shape(H)] sinks: Smem<f32>,
    #[shape(2)] offsets: Smem<i32>,
    #[shape(B, H, SQ, D)]
    #[block((None, None, cfg.bq, D),
            |b, h, i, j| (b, h, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j])), 0))]
    q: Ref<T>,
    #[shape(B, KVH, SKV, D)]
    #[block((None, None, cfg.bkv, D),
            |b, h, i, j| (b, kv_head(h, H / KVH), unchecked_index(data_next.get([table_row(h, cfg.per_head), i, j])), 0))]
    k: Ref<T>,
    #[shape(B, KVH, SKV, DV)]
    #[block((None, None, cfg.bkv, DV),
            |b, h, i, j| (b, kv_head(h, H / KVH), unchecked_index(data_next.get([table_row(h, cfg.per_head), i, j])), 0))]
    v: Ref<T>,
    #[shape(B, 1, SQ)]
    #[block((None, 1, cfg.bq),
            |b, h, i, j| (b, 0, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j]))))]
    q_seg: Option<Ref<i32>>,
    #[shape(B, 1, SKV)]
    #[block((None, 1, cfg.bkv),
            |b, h, i, j| (b, 0, unchecked_index(data_next.get([table_row(h, cfg.per_head), i, j]))))]
    kv_seg: Option<Ref<i32>>,
    #[shape(_NM, MQ, MKV)]
    #[block((None, MQ, MKV),
            |b, h, i, j| (unchecked_index(mask_next.get([table_row(h, cfg.per_head), i, j])), 0, 0))]
    mask_blocks: Ref<i8>,
    #[shape(B, H, SQ, DV)]
    #[block((None, None, cfg.bq, DV),
            |b, h, i, j| (b, h, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j])), 0))]
    out: RefMut<T>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq),
            |b, h, i, j| (b, h, 0, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j]))))]
    lse: Option<RefMut<f32>>,
    #[scratch(cfg.bq, cfg.lanes)] m_scratch: Scratch<f32>,
    #[scratch(cfg.bq, cfg.lanes)] l_scratch: Scratch<f32>,
    #[scratch(cfg.bq, DV)] acc: Scratch<f32>,
    #[scratch(cfg.scaled_query_rows(), D)] q_scaled: Scratch<T>,
    #[comptime] cfg: KernelConfig,
) {
    // With the queries scaled once per row, the keys are used as they come.
    let key_cfg = KernelConfig {
        scale: if cfg.queries_scaled_once {
            F32Bits::new(1.0)
        } else {
            cfg.scale
        },
        ..cfg.clone()
    };
    let (h, r, j) = (program_id(1), program_id(2), program_id(3));
    let (lanes, dv) = (cfg.lanes, acc.shape()[1]);
    // A `[bq, lanes]` running value widened to `[bq, n]` (with one lane, broadcasting does).
    let widen = |x: Value, n: usize| widen_lanes(x, n, lanes);
    let row = table_row(h, cfg.per_head);
    // The slot's query block, and whether it starts or ends that block's row.
    let i = row_block.get([row, r, j]);
    let bounds = row_bounds.get([row, r, j]);
    let (starts, ends) = (
        bounds.eq(ROW_FIRST) | bounds.eq(ROW_FIRST + ROW_LAST),
        bounds.ge(ROW_LAST),
    );
    when(starts, || {
        acc.store(0.0);
        if cfg.queries_scaled_once {
            q_scaled.store(cast_to(
                scaled(&cfg, cast_to(q.load(), DType::F32)),
                T::DTYPE,
            ));
        }
        if cfg.sinks {
            // The sink is one more logit with a zero value: it starts the max and the sum.
            m_scratch.store(sinks.get([h]));
            l_scratch.store(1.0);
        } else {
            m_scratch.store(cfg.mask_value.get());
            l_scratch.store(0.0);
        }
    });
    let kind = block_mask.get([row, r, j]);
    let kv_block = data_next.get([row, r, j]);
    let mask = MaskRefs {
        offsets,
        head_class,
        q_seg,
        kv_seg,
        mask_blocks,
    };
    let tile = |masked: bool, q_rows, keys| mask.tile(&cfg, masked, (i, kv_block, h), q_rows, keys);
    // The logits of queries `qv` (rows `q_rows` of the block) against scaled keys `kc`
    // (keys `keys`); masked entries never count: -inf under a finite running max.
    let masked_logits = |qv: Value, kc: Value, masked: bool, q_rows, keys| {
        let (s, _) = logits(&cfg, qv, kc);
        match tile(masked, q_rows, keys).visible() {
            Some(vis) => select(vis, s, f32::NEG_INFINITY),
            None => s,
        }
    };
    let bkvc = cfg.bkv_compute;
    let whole = bkvc == cfg.bkv;
    // The queries of rows `window` of the block, scaled where the keys are not.
    let queries = |window: Option<[tessera_dsl::Idx; 2]>| match (cfg.queries_scaled_once, window) {
        (true, Some(w)) => q_scaled.at(&w).load(),
        (true, None) => q_scaled.load(),
        (false, Some(w)) => q.at(&w).load(),
        (false, None) => q.load(),
    };
    let step = |masked: bool| {
        let qv = queries(None);
        for c in 0..cfg.bkv / bkvc {
            let kc = scaled_k(&key_cfg, rows(k, c * bkvc, bkvc, whole));
            let s = masked_logits(qv, kc, masked, (0, cfg.bq), (c * bkvc, bkvc));
            let run = Running {
                m: m_scratch.load(),
                l: l_scratch.load(),
                acc: acc.load(),
            }
            .update(s, rows(v, c * bkvc, bkvc, whole), T::DTYPE, lanes);
            l_scratch.store(run.l);
            acc.store(run.acc);
            m_scratch.store(run.m);
        }
    };
    // A diagonal block ([`DIAGONAL`]) by `sub x sub` sub-tiles: query sub-tile `a` meets key
    // sub-tiles `0..a` unmasked and `a` masked; those above the diagonal are skipped. Each
    // query sub-tile's running values stay in registers over its key sub-tiles.
    let diagonal_step = |sub: usize| {
        let ks = key_sub_tiles(&key_cfg, k, sub);
        for a in 0..ks.len() {
            let window = sub_tile_rows(a, sub);
            let qa = queries(Some(window));
            let mut run = Running {
                m: m_scratch.at(&window).load(),
                l: l_scratch.at(&window).load(),
                acc: acc.at(&window).load(),
            };
            for (c, &kc) in ks.iter().enumerate().take(a + 1) {
                let s = masked_logits(qa, kc, c == a, (a * sub, sub), (c * sub, sub));
                run = run.update(s, rows(v, c * sub, sub, false), T::DTYPE, lanes);
            }
            l_scratch.at(&window).store(run.l);
            acc.at(&window).store(run.acc);
            m_scratch.at(&window).store(run.m);
        }
    };
    if cfg.any_full {
        when(kind.eq(FULL), || step(false));
    }
    if cfg.any_partial {
        when(kind.eq(PARTIAL), || step(true));
    }
    if let Some(sub) = cfg.diagonal_sub_tiles {
        when(kind.eq(DIAGONAL), || diagonal_step(sub));
    }
    when(ends, || {
        let l = l_scratch.load();
        let none = l.eq(0.0);
        let l_safe = select(none, 1.0, l);
        out.store(cast_to(acc.load() / widen(l_safe, dv), T::DTYPE));
        if let Some(lse) = lse {
            let lse_col = select(none, f32::NEG_INFINITY, m_scratch.load() + l_safe.log());
            lse.store(if lanes == 1 {
                row_of(lse_col)
            } else {
                lane0_as_row(lse_col)
            });
        }
    });
}

/// Lane 0 of a lane-replicated `(n, lanes)` f32 tile as a `(1, n)` row, by a one-hot f32
/// matmul (exact: tessera's Mosaic multiplies f32 operands at full f32 precision, and each
/// output sums one product by 1.0 and zeros). Measured on v5p (bf16 forward, S=4096, blocks
/// 512): 1038 bundles per finalize through the `(n, 1) -> (1, n)` relayout, fewer this way.
/// `-inf` (rows that see no key) would meet the zeros as NaN, so it travels as a finite
/// stand-in.
fn lane0_as_row(tile: Value) -> Value {
    const NO_KEYS: f32 = -1.0e30;
    let lanes = tile.shape()[1];
    let finite = select(tile.eq(f32::NEG_INFINITY), NO_KEYS, tile);
    let lane0 = select(
        iota(DType::I32, &[1, lanes], 1).eq(0),
        constant(DType::F32, &[1, lanes], 1.0),
        0.0,
    );
    let row = dot_nt(lane0, finite);
    select(row.le(NO_KEYS), f32::NEG_INFINITY, row)
}

/// Backward preprocessing: `di = rowsum(out * dout)` per query row, and the gradient of the
/// attention sinks, `dsinks[h] = -sum over rows of exp(sink[h] - lse) * di`.
#[tpu_kernel(grid = (H, B, SQ / cfg.bq), dimension_semantics = (parallel, arbitrary, arbitrary))]
pub fn splash_bwd_prep<T: Element>(
    #[shape(H)] sinks: Smem<f32>,
    #[shape(B, H, SQ, DV)]
    #[block((None, None, cfg.bq, DV), |h, b, i| (b, h, i, 0))]
    out: Ref<T>,
    #[shape(B, H, SQ, DV)]
    #[block((None, None, cfg.bq, DV), |h, b, i| (b, h, i, 0))]
    dout: Ref<T>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq), |h, b, i| (b, h, 0, i))]
    lse: Ref<f32>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq), |h, b, i| (b, h, 0, i))]
    di: RefMut<f32>,
    #[shape(H, 1, 1)]
    #[block((None, 1, 1), |h, b, i| (h, 0, 0))]
    dsinks: RefMut<f32>,
    #[scratch(1, 1)] dsink_acc: Scratch<f32>,
    #[comptime] cfg: PrepConfig,
) {
    let (h, b, i) = (program_id(0), program_id(1), program_id(2));
    let prod = cast_to(out.load(), DType::F32) * cast_to(dout.load(), DType::F32);
    let d = if cfg.rows_on_mxu {
        // The row sums as a row straight from the MXU (f32 operands at full f32 precision):
        // on v5p the `(bq, 1) -> (1, bq)` relayout of a lane reduction took 2.6x the
        // kernel's cycles.
        dot_nt(constant(DType::F32, &[1, prod.shape()[1]], 1.0), prod)
    } else {
        row_of(prod.sum_keepdims(-1))
    };
    di.store(d);
    let first = b.eq(0) & i.eq(0);
    when(first, || dsink_acc.store(0.0));
    if cfg.sinks {
        let p_sink = (sinks.get([h]) - lse.load()).exp();
        let part = (p_sink * d).sum_keepdims(-1);
        dsink_acc.store(dsink_acc.load() - part);
    }
    let last = b.eq(num_programs(1) - 1) & i.eq(num_programs(2) - 1);
    when(last, || dsinks.store(dsink_acc.load()));
}

/// dQ: for each query block, `dq = scale * sum over key blocks of ds k` with
/// `ds = p * (dp - di)`, `p = exp(logits - lse)`, `dp = dout v^T` (`ds` times the scaled
/// keys, accumulated in f32).
///
/// As Mosaic calls (`cfg.keys_by_queries`) it computes the transposed tiles, keys on
/// sublanes and queries on lanes, as the dK/dV kernels do: `s^T = k q^T`,
/// `p^T = exp(s^T - lse)` with the `lse` and `di` rows broadcast over sublanes,
/// `dp^T = v dout^T`, `ds^T = p^T (dp^T - di)`, and dQ's `ds k` as a transposed-LHS matmul
/// of `ds^T`. Measured on v5p (bf16, causal, S=4096, MHA) against the query-by-key tiles
/// (`lse` and `di` as `(bq, 1)` columns): 2.4% fewer cycles at blocks 512, 2.0% at 1024,
/// with 0.78x the scoped VMEM at 1024 (`dp` computed before `s`). Inlined as StableHLO it
/// keeps the query-by-key tiles: on the CPU plugin the transposed form took 1.25x the time
/// (blocks 512, S=4096, D=64, f32).
#[tpu_kernel(grid = (B, H, R, W),
             dimension_semantics = (parallel, parallel, arbitrary, arbitrary))]
pub fn splash_dq<T: Element>(
    #[shape(TH, R, W)] data_next: Smem<i32>,
    #[shape(TH, R, W)] block_mask: Smem<i32>,
    #[shape(TH, R, W)] mask_next: Smem<i32>,
    #[shape(TH, R, W)] row_block: Smem<i32>,
    #[shape(TH, R, W)] row_bounds: Smem<i32>,
    #[shape(H)] head_class: Smem<i32>,
    #[shape(2)] offsets: Smem<i32>,
    #[shape(B, H, SQ, D)]
    #[block((None, None, cfg.bq, D),
            |b, h, i, j| (b, h, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j])), 0))]
    q: Ref<T>,
    #[shape(B, KVH, SKV, D)]
    #[block((None, None, cfg.bkv, D),
            |b, h, i, j| (b, kv_head(h, H / KVH), unchecked_index(data_next.get([table_row(h, cfg.per_head), i, j])), 0))]
    k: Ref<T>,
    #[shape(B, KVH, SKV, DV)]
    #[block((None, None, cfg.bkv, DV),
            |b, h, i, j| (b, kv_head(h, H / KVH), unchecked_index(data_next.get([table_row(h, cfg.per_head), i, j])), 0))]
    v: Ref<T>,
    #[shape(B, 1, SQ)]
    #[block((None, 1, cfg.bq),
            |b, h, i, j| (b, 0, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j]))))]
    q_seg: Option<Ref<i32>>,
    #[shape(B, 1, SKV)]
    #[block((None, 1, cfg.bkv),
            |b, h, i, j| (b, 0, unchecked_index(data_next.get([table_row(h, cfg.per_head), i, j]))))]
    kv_seg: Option<Ref<i32>>,
    // A stored partial block: `[MR, MC]` is queries by keys, or keys by queries.
    #[shape(_NM, MR, MC)]
    #[block((None, MR, MC),
            |b, h, i, j| (unchecked_index(mask_next.get([table_row(h, cfg.per_head), i, j])), 0, 0))]
    mask_blocks: Ref<i8>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq),
            |b, h, i, j| (b, h, 0, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j]))))]
    lse: Ref<f32>,
    #[shape(B, H, SQ, DV)]
    #[block((None, None, cfg.bq, DV),
            |b, h, i, j| (b, h, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j])), 0))]
    dout: Ref<T>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq),
            |b, h, i, j| (b, h, 0, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j]))))]
    di: Ref<f32>,
    #[shape(B, H, SQ, D)]
    #[block((None, None, cfg.bq, D),
            |b, h, i, j| (b, h, unchecked_index(row_block.get([table_row(h, cfg.per_head), i, j])), 0))]
    dq: RefMut<T>,
    #[scratch(cfg.bq, D)] dq_acc: Scratch<f32>,
    #[comptime] cfg: KernelConfig,
) {
    let (h, r, j) = (program_id(1), program_id(2), program_id(3));
    let row = table_row(h, cfg.per_head);
    // The slot's query block, and whether it starts or ends that block's row (the tables
    // are compacted, as the forward's).
    let i = row_block.get([row, r, j]);
    let bounds = row_bounds.get([row, r, j]);
    let (starts, ends) = (
        bounds.eq(ROW_FIRST) | bounds.eq(ROW_FIRST + ROW_LAST),
        bounds.ge(ROW_LAST),
    );
    when(starts, || dq_acc.store(0.0));
    let kind = block_mask.get([row, r, j]);
    let kv_block = data_next.get([row, r, j]);
    let mask = MaskRefs {
        offsets,
        head_class,
        q_seg,
        kv_seg,
        mask_blocks,
    };
    let tile = |masked: bool, q_rows, keys| mask.tile(&cfg, masked, (i, kv_block, h), q_rows, keys);
    let bkvc = cfg.bkv_compute;
    let whole = bkvc == cfg.bkv;
    let step = |masked: bool| {
        let (qv, dov) = (q.load(), dout.load());
        let (lse_v, di_v) = if cfg.keys_by_queries {
            (lse.load(), di.load())
        } else {
            (column(lse.load()), column(di.load()))
        };
        let mut total: Option<Value> = None;
        for c in 0..cfg.bkv / bkvc {
            let tile = tile(masked, (0, cfg.bq), (c * bkvc, bkvc));
            let kc = scaled_k(&cfg, rows(k, c * bkvc, bkvc, whole));
            let vc = rows(v, c * bkvc, bkvc, whole);
            let part = dq_part::<T>(&cfg, &tile, (kc, vc), (qv, dov), (lse_v, di_v));
            total = Some(match total {
                Some(t) => t + part,
                None => part,
            });
        }
        if let Some(t) = total {
            dq_acc.store(dq_acc.load() + t);
        }
    };
    // A diagonal block by `sub x sub` sub-tiles: query sub-tile `a` meets key sub-tiles
    // `0..a` unmasked and `a` masked; those above the diagonal are skipped.
    let diagonal_step = |sub: usize| {
        let ks = key_sub_tiles(&cfg, k, sub);
        for a in 0..ks.len() {
            let rows_a = sub_tile_rows(a, sub);
            let (qa, doa) = (q.at(&rows_a).load(), dout.at(&rows_a).load());
            let lanes_a = |x: Ref<f32>| x.at(&[all(), ds(a * sub, sub)]).load();
            let (lse_a, di_a) = if cfg.keys_by_queries {
                (lanes_a(lse), lanes_a(di))
            } else {
                (column(lanes_a(lse)), column(lanes_a(di)))
            };
            let mut total = dq_acc.at(&rows_a).load();
            for (c, &kc) in ks.iter().enumerate().take(a + 1) {
                let tile = tile(c == a, (a * sub, sub), (c * sub, sub));
                let vc = rows(v, c * sub, sub, false);
                total = total + dq_part::<T>(&cfg, &tile, (kc, vc), (qa, doa), (lse_a, di_a));
            }
            dq_acc.at(&rows_a).store(total);
        }
    };
    if cfg.any_full {
        when(kind.eq(FULL), || step(false));
    }
    if cfg.any_partial {
        when(kind.eq(PARTIAL), || step(true));
    }
    if let Some(sub) = cfg.diagonal_sub_tiles {
        when(kind.eq(DIAGONAL), || diagonal_step(sub));
    }
    when(ends, || dq.store(cast_to(dq_acc.load(), T::DTYPE)));
}

/// One tile's dQ contribution `ds k` (f32, `[queries, D]`) from scaled keys `kc` and values
/// `vc`, queries `qv` and their output cotangents `dov`, and their `lse` and `di` (rows for
/// keys-by-queries tiles, else columns).
fn dq_part<T: Element>(
    cfg: &KernelConfig,
    tile: &Tile<'_>,
    (kc, vc): (Value, Value),
    (qv, dov): (Value, Value),
    (lse, di): (Value, Value),
) -> Value {
    if cfg.keys_by_queries {
        // `dp` first: libtpu then spills less of the two score-sized tiles.
        let dp = dot_nt(vc, dov);
        let (s, raw) = logits(cfg, kc, qv);
        let p = probabilities(s, lse, tile.visible_t());
        let ds = through_cap(cfg, p * (dp - di), raw);
        dot_tn(cast_to(ds, T::DTYPE), kc)
    } else {
        let (s, raw) = logits(cfg, qv, kc);
        let p = probabilities(s, lse, tile.visible());
        let dp = dot_nt(dov, vc);
        let ds = through_cap(cfg, p * (dp - di), raw);
        dot(cast_to(ds, T::DTYPE), kc)
    }
}

/// What a tile's mask reads: the sequence offsets, the heads' mask classes, the segment ids
/// (when the call has them) and the stored partial blocks.
#[derive(Clone, Copy)]
struct MaskRefs {
    offsets: Smem<i32>,
    head_class: Smem<i32>,
    q_seg: Option<Ref<i32>>,
    kv_seg: Option<Ref<i32>>,
    mask_blocks: Ref<i8>,
}

impl MaskRefs {
    /// The tile of rows `q_rows` of query block `q_block` by keys `keys` of key block
    /// `kv_block` (`(start, len)` windows), for query head `head`.
    fn tile<'a>(
        &self,
        cfg: &'a KernelConfig,
        masked: bool,
        (q_block, kv_block, head): (Value, Value, Value),
        q_rows: (usize, usize),
        keys: (usize, usize),
    ) -> Tile<'a> {
        Tile {
            cfg,
            masked,
            q_block,
            kv_block,
            q_rows,
            keys,
            offsets: self.offsets,
            head_class: self.head_class,
            head,
            q_seg: self.q_seg,
            kv_seg: self.kv_seg,
            mask_blocks: self.mask_blocks,
        }
    }
}

/// The operands of a dK/dV step.
struct DkvRefs<T: Element> {
    mask: MaskRefs,
    q: Ref<T>,
    v: Ref<T>,
    dout: Ref<T>,
    lse: Ref<f32>,
    di: Ref<f32>,
    /// dK's output block, which holds the key block times the scale ([`scaled_k`]) from the
    /// key block's first step until the last step overwrites it with dK: an output block
    /// stays in VMEM while its block index does not change, so it serves as the scaled
    /// keys' buffer and the kernel needs no `(bkv, D)` scratch for them (on v5p that
    /// scratch was what put dK/dV's scoped VMEM above JAX's at S=4096, blocks 512 and 1024).
    k_scaled: RefMut<T>,
    dk_acc: Scratch<f32>,
    dv_acc: Scratch<f32>,
}

/// The dK/dV step shared by the separate and the fused kernels: accumulates into the
/// `[bkv, D]` scratch and returns this query block's dQ contribution when asked.
///
/// It computes the transposed tiles, keys on sublanes and queries on lanes (as JAX's
/// splash): `s^T = k q^T`, `p^T = exp(s^T - lse)` with the `lse` and `di` rows broadcast
/// over sublanes, `dv += p^T dout`, `dp^T = v dout^T`, `ds^T = p^T (dp^T - di)`,
/// `dk += ds^T q`; no matmul transposes its left operand except dQ's `ds k`.
fn dkv_step<T: Element>(
    cfg: &KernelConfig,
    masked: bool,
    ids: (Value, Value, Value),
    r: &DkvRefs<T>,
    want_dq: bool,
) -> Option<Value> {
    let (qv, dov, lse_v, di_v) = (r.q.load(), r.dout.load(), r.lse.load(), r.di.load());
    let bkvc = cfg.bkv_compute;
    let whole = bkvc == cfg.bkv;
    let mut dq_total: Option<Value> = None;
    for c in 0..cfg.bkv / bkvc {
        let tile = r.mask.tile(cfg, masked, ids, (0, cfg.bq), (c * bkvc, bkvc));
        let kc = if whole {
            r.k_scaled.load()
        } else {
            r.k_scaled.at(&[ds(c * bkvc, bkvc), all()]).load()
        };
        let vc = rows(r.v, c * bkvc, bkvc, whole);
        let (s, raw) = logits(cfg, kc, qv);
        let p = probabilities(s, lse_v, tile.visible_t());
        let dv_part = dot(cast_to(p, T::DTYPE), dov);
        let dp = dot_nt(vc, dov);
        let ds = cast_to(through_cap(cfg, p * (dp - di_v), raw), T::DTYPE);
        let dk_part = dot(ds, qv);
        if whole {
            r.dv_acc.store(r.dv_acc.load() + dv_part);
            r.dk_acc.store(r.dk_acc.load() + dk_part);
        } else {
            let win = [ds_rows(c * bkvc, bkvc), all()];
            r.dv_acc.at(&win).store(r.dv_acc.at(&win).load() + dv_part);
            r.dk_acc.at(&win).store(r.dk_acc.at(&win).load() + dk_part);
        }
        if want_dq {
            let part = dot_tn(ds, kc);
            dq_total = Some(match dq_total {
                Some(t) => t + part,
                None => part,
            });
        }
    }
    dq_total
}

/// [`dkv_step`] over a [`DIAGONAL`] block by `sub x sub` sub-tiles: key sub-tile `c` meets
/// query sub-tiles `c + 1..` unmasked and `c` masked; those above the diagonal (queries
/// before the keys) are skipped. Returns each query sub-tile's dQ contribution (`[sub, D]`,
/// f32) when asked.
fn dkv_diagonal_step<T: Element>(
    cfg: &KernelConfig,
    sub: usize,
    ids: (Value, Value, Value),
    r: &DkvRefs<T>,
    want_dq: bool,
) -> Vec<Value> {
    let n = cfg.bq / sub;
    let lanes = |x: Ref<f32>, a: usize| x.at(&[all(), ds(a * sub, sub)]).load();
    let queries: Vec<(Value, Value, Value, Value)> = (0..n)
        .map(|a| {
            let rows_a = sub_tile_rows(a, sub);
            (
                r.q.at(&rows_a).load(),
                r.dout.at(&rows_a).load(),
                lanes(r.lse, a),
                lanes(r.di, a),
            )
        })
        .collect();
    let mut dq_parts: Vec<Option<Value>> = vec![None; n];
    for c in 0..n {
        let win = sub_tile_rows(c, sub);
        let kc = r.k_scaled.at(&win).load();
        let vc = r.v.at(&win).load();
        let (mut dv_c, mut dk_c) = (r.dv_acc.at(&win).load(), r.dk_acc.at(&win).load());
        for (a, &(qa, doa, lse_a, di_a)) in queries.iter().enumerate().skip(c) {
            let tile = r
                .mask
                .tile(cfg, a == c, ids, (a * sub, sub), (c * sub, sub));
            let (s, raw) = logits(cfg, kc, qa);
            let p = probabilities(s, lse_a, tile.visible_t());
            dv_c = dv_c + dot(cast_to(p, T::DTYPE), doa);
            let dp = dot_nt(vc, doa);
            let ds = cast_to(through_cap(cfg, p * (dp - di_a), raw), T::DTYPE);
            dk_c = dk_c + dot(ds, qa);
            if want_dq {
                let part = dot_tn(ds, kc);
                dq_parts[a] = Some(match dq_parts[a] {
                    Some(t) => t + part,
                    None => part,
                });
            }
        }
        r.dv_acc.at(&win).store(dv_c);
        r.dk_acc.at(&win).store(dk_c);
    }
    dq_parts.into_iter().flatten().collect()
}

fn ds_rows(start: usize, len: usize) -> tessera_dsl::Idx {
    ds(start, len)
}

/// dK and dV: for each key block, sums over the query heads that share its key/value head
/// and over their query blocks (walked through the `Major::Kv` tables).
#[tpu_kernel(grid = (B, KVH, NKV, H / KVH, WQ),
             dimension_semantics = (parallel, parallel, arbitrary, arbitrary, arbitrary))]
pub fn splash_dkv<T: Element>(
    #[shape(TH, NKV, WQ)] data_next: Smem<i32>,
    #[shape(TH, NKV, WQ)] block_mask: Smem<i32>,
    #[shape(TH, NKV, WQ)] mask_next: Smem<i32>,
    #[shape(H)] head_class: Smem<i32>,
    #[shape(2)] offsets: Smem<i32>,
    #[shape(B, H, SQ, D)]
    #[block((None, None, cfg.bq, D),
            |b, kh, j, g, i| (b, q_head(kh, g, H / KVH),
                              unchecked_index(data_next.get([table_row(q_head(kh, g, H / KVH), cfg.per_head), j, i])), 0))]
    q: Ref<T>,
    #[shape(B, KVH, SKV, D)]
    #[block((None, None, cfg.bkv, D), |b, kh, j, g, i| (b, kh, j, 0))]
    k: Ref<T>,
    #[shape(B, KVH, SKV, DV)]
    #[block((None, None, cfg.bkv, DV), |b, kh, j, g, i| (b, kh, j, 0))]
    v: Ref<T>,
    #[shape(B, 1, SQ)]
    #[block((None, 1, cfg.bq),
            |b, kh, j, g, i| (b, 0, unchecked_index(data_next.get([table_row(q_head(kh, g, H / KVH), cfg.per_head), j, i]))))]
    q_seg: Option<Ref<i32>>,
    #[shape(B, 1, SKV)]
    #[block((None, 1, cfg.bkv), |b, kh, j, g, i| (b, 0, j))]
    kv_seg: Option<Ref<i32>>,
    #[shape(_NM, MKV, MQ)]
    #[block((None, MKV, MQ),
            |b, kh, j, g, i| (unchecked_index(mask_next.get([table_row(q_head(kh, g, H / KVH), cfg.per_head), j, i])), 0, 0))]
    mask_blocks: Ref<i8>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq),
            |b, kh, j, g, i| (b, q_head(kh, g, H / KVH), 0,
                              unchecked_index(data_next.get([table_row(q_head(kh, g, H / KVH), cfg.per_head), j, i]))))]
    lse: Ref<f32>,
    #[shape(B, H, SQ, DV)]
    #[block((None, None, cfg.bq, DV),
            |b, kh, j, g, i| (b, q_head(kh, g, H / KVH),
                              unchecked_index(data_next.get([table_row(q_head(kh, g, H / KVH), cfg.per_head), j, i])), 0))]
    dout: Ref<T>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq),
            |b, kh, j, g, i| (b, q_head(kh, g, H / KVH), 0,
                              unchecked_index(data_next.get([table_row(q_head(kh, g, H / KVH), cfg.per_head), j, i]))))]
    di: Ref<f32>,
    #[shape(B, KVH, SKV, D)]
    #[block((None, None, cfg.bkv, D), |b, kh, j, g, i| (b, kh, j, 0))]
    dk: RefMut<T>,
    #[shape(B, KVH, SKV, DV)]
    #[block((None, None, cfg.bkv, DV), |b, kh, j, g, i| (b, kh, j, 0))]
    dv: RefMut<T>,
    #[scratch(cfg.bkv, D)] dk_acc: Scratch<f32>,
    #[scratch(cfg.bkv, DV)] dv_acc: Scratch<f32>,
    #[comptime] cfg: KernelConfig,
) {
    let (kh, j, g, i) = (program_id(1), program_id(2), program_id(3), program_id(4));
    let heads_per_kv = num_programs(3);
    let h = kh * heads_per_kv + g;
    let row = table_row(h, cfg.per_head);
    when(g.eq(0) & i.eq(0), || {
        dk_acc.store(0.0);
        dv_acc.store(0.0);
        dk.store(scaled_k(&cfg, k.load()));
    });
    let kind = block_mask.get([row, j, i]);
    let q_block = data_next.get([row, j, i]);
    let refs = DkvRefs {
        mask: MaskRefs {
            offsets,
            head_class,
            q_seg,
            kv_seg,
            mask_blocks,
        },
        q,
        v,
        dout,
        lse,
        di,
        k_scaled: dk,
        dk_acc,
        dv_acc,
    };
    let step = |masked: bool| {
        dkv_step(&cfg, masked, (q_block, j, h), &refs, false);
    };
    if cfg.any_full {
        when(kind.eq(FULL), || step(false));
    }
    if cfg.any_partial {
        when(kind.eq(PARTIAL), || step(true));
    }
    if let Some(sub) = cfg.diagonal_sub_tiles {
        when(kind.eq(DIAGONAL), || {
            dkv_diagonal_step(&cfg, sub, (q_block, j, h), &refs, false);
        });
    }
    let last = g.eq(heads_per_kv - 1) & i.eq(num_programs(4) - 1);
    when(last, || {
        dk.store(cast_to(scaled(&cfg, dk_acc.load()), T::DTYPE));
        dv.store(cast_to(dv_acc.load(), T::DTYPE));
    });
}

/// The fused backward: dK and dV as [`splash_dkv`], plus each (key block, query block)'s dQ
/// contribution added to one of `NS` dQ partials (in the inputs' dtype, as dQ itself): key
/// block `j` adds to partial `j % NS`, reading it through `dq_in`, the buffer `dq_partial`
/// aliases (zeros at the start), and [`splash_dq_reduce`] sums the partials in f32. With
/// `NS` 3 ([`SplashAttention::dq_slots`](crate::SplashAttention::dq_slots)) a partial block
/// is read 3 key blocks (at least 3 grid steps) after it was written, as Mosaic's pipeline
/// needs; tokamax keeps its dQ partials so. A skipped block's step copies its partial
/// through. Its tables are not shrunk: every query block has a slot.
#[tpu_kernel(grid = (B, KVH, NKV, H / KVH, NQ),
             dimension_semantics = (parallel, parallel, arbitrary, arbitrary, arbitrary))]
pub fn splash_bwd_fused<T: Element>(
    #[shape(TH, NKV, NQ)] data_next: Smem<i32>,
    #[shape(TH, NKV, NQ)] block_mask: Smem<i32>,
    #[shape(TH, NKV, NQ)] mask_next: Smem<i32>,
    #[shape(H)] head_class: Smem<i32>,
    #[shape(2)] offsets: Smem<i32>,
    #[shape(B, H, SQ, D)]
    #[block((None, None, cfg.bq, D), |b, kh, j, g, i| (b, q_head(kh, g, H / KVH), i, 0))]
    q: Ref<T>,
    #[shape(B, KVH, SKV, D)]
    #[block((None, None, cfg.bkv, D), |b, kh, j, g, i| (b, kh, j, 0))]
    k: Ref<T>,
    #[shape(B, KVH, SKV, DV)]
    #[block((None, None, cfg.bkv, DV), |b, kh, j, g, i| (b, kh, j, 0))]
    v: Ref<T>,
    #[shape(B, 1, SQ)]
    #[block((None, 1, cfg.bq), |b, kh, j, g, i| (b, 0, i))]
    q_seg: Option<Ref<i32>>,
    #[shape(B, 1, SKV)]
    #[block((None, 1, cfg.bkv), |b, kh, j, g, i| (b, 0, j))]
    kv_seg: Option<Ref<i32>>,
    #[shape(_NM, MKV, MQ)]
    #[block((None, MKV, MQ),
            |b, kh, j, g, i| (unchecked_index(mask_next.get([table_row(q_head(kh, g, H / KVH), cfg.per_head), j, i])), 0, 0))]
    mask_blocks: Ref<i8>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq), |b, kh, j, g, i| (b, q_head(kh, g, H / KVH), 0, i))]
    lse: Ref<f32>,
    #[shape(B, H, SQ, DV)]
    #[block((None, None, cfg.bq, DV), |b, kh, j, g, i| (b, q_head(kh, g, H / KVH), i, 0))]
    dout: Ref<T>,
    #[shape(B, H, 1, SQ)]
    #[block((None, None, 1, cfg.bq), |b, kh, j, g, i| (b, q_head(kh, g, H / KVH), 0, i))]
    di: Ref<f32>,
    #[shape(NS, B, H, SQ, D)]
    #[block((None, None, None, cfg.bq, D), |b, kh, j, g, i| (j % NS, b, q_head(kh, g, H / KVH), i, 0))]
    dq_in: Ref<T>,
    #[shape(NS, B, H, SQ, D)]
    #[block((None, None, None, cfg.bq, D), |b, kh, j, g, i| (j % NS, b, q_head(kh, g, H / KVH), i, 0))]
    #[alias(dq_in)]
    dq_partial: RefMut<T>,
    #[shape(B, KVH, SKV, D)]
    #[block((None, None, cfg.bkv, D), |b, kh, j, g, i| (b, kh, j, 0))]
    dk: RefMut<T>,
    #[shape(B, KVH, SKV, DV)]
    #[block((None, None, cfg.bkv, DV), |b, kh, j, g, i| (b, kh, j, 0))]
    dv: RefMut<T>,
    #[scratch(cfg.bkv, D)] dk_acc: Scratch<f32>,
    #[scratch(cfg.bkv, DV)] dv_acc: Scratch<f32>,
    #[comptime] cfg: KernelConfig,
) {
    let (kh, j, g, i) = (program_id(1), program_id(2), program_id(3), program_id(4));
    let heads_per_kv = num_programs(3);
    let h = kh * heads_per_kv + g;
    let row = table_row(h, cfg.per_head);
    when(g.eq(0) & i.eq(0), || {
        dk_acc.store(0.0);
        dv_acc.store(0.0);
        dk.store(scaled_k(&cfg, k.load()));
    });
    let kind = block_mask.get([row, j, i]);
    // What the partial holds so far; a computed block stores it with its contribution.
    dq_partial.store(dq_in.load());
    let refs = DkvRefs {
        mask: MaskRefs {
            offsets,
            head_class,
            q_seg,
            kv_seg,
            mask_blocks,
        },
        q,
        v,
        dout,
        lse,
        di,
        k_scaled: dk,
        dk_acc,
        dv_acc,
    };
    let add = |rows: tessera_dsl::Idx, dq: Value| {
        let held = cast_to(dq_in.at(&[rows, all()]).load(), DType::F32);
        dq_partial
            .at(&[rows, all()])
            .store(cast_to(held + dq, T::DTYPE));
    };
    let step = |masked: bool| {
        let dq = dkv_step(&cfg, masked, (i, j, h), &refs, true);
        if let Some(dq) = dq {
            add(all(), dq);
        }
    };
    if cfg.any_full {
        when(kind.eq(FULL), || step(false));
    }
    if cfg.any_partial {
        when(kind.eq(PARTIAL), || step(true));
    }
    if let Some(sub) = cfg.diagonal_sub_tiles {
        when(kind.eq(DIAGONAL), || {
            let parts = dkv_diagonal_step(&cfg, sub, (i, j, h), &refs, true);
            for (a, part) in parts.into_iter().enumerate() {
                add(ds(a * sub, sub), part);
            }
        });
    }
    let last = g.eq(heads_per_kv - 1) & i.eq(num_programs(4) - 1);
    when(last, || {
        dk.store(cast_to(scaled(&cfg, dk_acc.load()), T::DTYPE));
        dv.store(cast_to(dv_acc.load(), T::DTYPE));
    });
}

/// The compile-time configuration of the dQ reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReduceConfig {
    /// Query rows per block.
    pub bq: usize,
    /// Partials summed per grid step (a divisor of `partials`).
    pub per_step: usize,
    /// dQ partials in all.
    pub partials: usize,
}

/// Sums the fused backward's dQ partials in f32, `cfg.per_step` of them per step of the
/// innermost (`arbitrary`) axis: their sum stays in registers, so the f32 accumulator is
/// loaded and stored once per step, not once per partial, and not at all where one step takes
/// every partial.
#[tpu_kernel(grid = (B, H, SQ / cfg.bq, NS / cfg.per_step),
             dimension_semantics = (parallel, parallel, parallel, arbitrary))]
pub fn splash_dq_reduce<T: Element>(
    #[shape(NS, B, H, SQ, D)]
    #[block((cfg.per_step, None, None, cfg.bq, D), |b, h, i, j| (j, b, h, i, 0))]
    dq_partial: Ref<T>,
    #[shape(B, H, SQ, D)]
    #[block((None, None, cfg.bq, D), |b, h, i, j| (b, h, i, 0))]
    dq: RefMut<T>,
    #[scratch(cfg.bq, D)] acc: Scratch<f32>,
    #[comptime] cfg: ReduceConfig,
) {
    let part = |p: usize| cast_to(dq_partial.at(&[p.into(), all(), all()]).load(), DType::F32);
    let mut sum = part(0);
    for p in 1..cfg.per_step {
        sum = sum + part(p);
    }
    if cfg.per_step == cfg.partials {
        dq.store(cast_to(sum, T::DTYPE));
        return;
    }
    let j = program_id(3);
    when(j.eq(0), || acc.store(0.0));
    acc.store(acc.load() + sum);
    when(j.eq(num_programs(3) - 1), || {
        dq.store(cast_to(acc.load(), T::DTYPE))
    });
}
