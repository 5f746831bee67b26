//! `MaskInfo`: the block-sparsity tables the kernels read from scalar prefetch (SMEM).
//!
//! The attention matrix of every head is cut into blocks (`block_q` queries by `block_kv`
//! keys) and each block is classified [`BlockKind::Empty`] (skipped: never computed),
//! [`BlockKind::Partial`] (computed with the mask applied) or [`BlockKind::Full`] (computed
//! without evaluating the mask). For every row of blocks the non-empty blocks are listed in
//! order, so the kernel's inner grid axis walks only those (the grid is "shrunk" to the
//! longest list; shorter rows are padded with empty entries that repeat the last block, so no
//! new data is fetched for them):
//!
//! - `data_next[h, r, s]`: the block index (along the inner axis) of slot `s` of row `r`;
//! - `block_mask[h, r, s]`: its [`BlockKind::code`] (0 empty/padding, 1 partial, 2 full),
//!   or [`DIAGONAL`] (3) for a partial block whose square sub-tiles are empty above their
//!   diagonal and full below it ([`MaskInfo::with_diagonal_sub_tiles`]);
//! - `mask_next[h, r, s]`: for dense masks, which stored partial mask block to load;
//! - `row_block[h, r, s]`: the block index along the rows' axis (`r` itself, except in
//!   compacted tables);
//! - `row_bounds[h, r, s]`: [`ROW_FIRST`] on the first slot of a row, [`ROW_LAST`] on its
//!   last, both (3) on a row's only slot.
//!
//! The forward's and dQ's tables are compacted ([`MaskInfo::compacted`]): one row holding
//! every row's non-empty blocks in turn (a row with none keeps one empty slot, which starts
//! and ends it), so their grids walk only blocks they compute; `row_block` says which query
//! block each slot is in and `row_bounds` where a row starts and ends.
//!
//! Computable masks (causal, local, chunked and their combinations) are evaluated in the
//! kernel from iota and the block's global positions; masks with a dense part store their
//! distinct partial blocks (`partial_blocks`, int8, deduplicated).
//!
//! The forward and dQ kernels walk key blocks for each query block ([`Major::Q`]); the dK/dV
//! kernel walks query blocks for each key block ([`Major::Kv`]).

use std::collections::HashMap;

use crate::error::{BlockSizeError, MaskError, SplashError};
use crate::mask::{BlockKind, Mask, MaskExpr, MultiHeadMask, Rect, SeqOffsets, MAX_POSITION};

/// At most this many distinct computable per-head masks are evaluated in-kernel (each
/// partial block evaluates all of them); beyond, partial blocks are stored densely.
pub const MAX_COMPUTED_MASK_CLASSES: usize = 4;

/// `block_mask` code of a diagonal block: a square partial block cut into `sub x sub`
/// sub-tiles ([`MaskInfo::diagonal_sub_tiles`]) of which those above the diagonal are empty
/// (skipped), those below it full and those on it computed with the mask. The causal
/// diagonal is one; so are the diagonals of local and chunked causal masks whose window
/// covers the block.
pub const DIAGONAL: i32 = 3;

/// `row_bounds` flag of a row's first slot.
pub const ROW_FIRST: i32 = 1;
/// `row_bounds` flag of a row's last slot.
pub const ROW_LAST: i32 = 2;

/// The `row_bounds` flags of a slot that starts and/or ends its row.
fn bounds_of(first: bool, last: bool) -> i32 {
    i32::from(first) * ROW_FIRST + i32::from(last) * ROW_LAST
}

/// Which block axis the tables' rows run along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Major {
    /// Rows are query blocks; slots walk key blocks (forward, dQ).
    Q,
    /// Rows are key blocks; slots walk query blocks (dK/dV).
    Kv,
}

/// How a kernel evaluates the mask of a partial block.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KernelMask {
    /// From iota and global positions: one expression per mask class (heads map to classes
    /// through `MaskInfo::head_class`).
    Computed(Vec<MaskExpr>),
    /// Loaded from `partial_blocks[mask_next[..]]`.
    Dense,
}

/// Counts of blocks over all heads of one batch element (before shrinking the grid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BlockStats {
    /// All blocks: heads x query blocks x key blocks.
    pub total: usize,
    /// Blocks computed without evaluating the mask.
    pub full: usize,
    /// Blocks computed with the mask applied.
    pub partial: usize,
    /// Blocks skipped.
    pub empty: usize,
}

impl BlockStats {
    /// Blocks computed (full and partial).
    pub fn computed(&self) -> usize {
        self.full + self.partial
    }

    /// The counts for `n` batch elements.
    pub fn times(&self, n: usize) -> BlockStats {
        BlockStats {
            total: self.total * n,
            full: self.full * n,
            partial: self.partial * n,
            empty: self.empty * n,
        }
    }
}

/// The block-sparsity tables of one kernel (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct MaskInfo {
    pub major: Major,
    pub block_q: usize,
    pub block_kv: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub offsets: SeqOffsets,
    /// Query heads.
    pub heads: usize,
    /// Head rows of the tables: 1 when every head has the same mask, else `heads`.
    pub table_heads: usize,
    /// Rows per head: query blocks ([`Major::Q`]) or key blocks ([`Major::Kv`]).
    pub rows: usize,
    /// Slots per row: the grid's inner extent.
    pub width: usize,
    pub data_next: Vec<i32>,
    pub block_mask: Vec<i32>,
    pub mask_next: Vec<i32>,
    pub row_block: Vec<i32>,
    pub row_bounds: Vec<i32>,
    /// Distinct partial mask blocks (dense masks only), int8, in the orientation of the
    /// kernel's score tile: [`Self::partial_block_shape`].
    pub partial_blocks: Vec<i8>,
    /// Whether the kernel's score tiles (and so the stored partial blocks) are keys by
    /// queries: the dK/dV kernels', and the dQ kernel's ([`Self::with_keys_by_queries_tiles`]).
    pub keys_by_queries: bool,
    pub num_partial_blocks: usize,
    pub kernel_mask: KernelMask,
    /// The mask class of every query head (an index into `KernelMask::Computed`).
    pub head_class: Vec<i32>,
    /// Block counts over all heads (one batch element).
    pub stats: BlockStats,
    /// The sub-tile size of the blocks coded [`DIAGONAL`], when some are.
    pub diagonal_sub_tiles: Option<usize>,
}

impl MaskInfo {
    /// Builds the tables for `heads` query heads attending with `mask`, `q_len` queries and
    /// `kv_len` keys at `offsets` in the global sequence, cut into `block_q` x `block_kv`
    /// blocks. `shrink`: list only non-empty blocks per row (else every block has a slot).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mask: &MultiHeadMask,
        heads: usize,
        q_len: usize,
        kv_len: usize,
        offsets: SeqOffsets,
        block_q: usize,
        block_kv: usize,
        major: Major,
        shrink: bool,
    ) -> Result<Self, SplashError> {
        mask.check_heads(heads)?;
        if block_q == 0 || block_kv == 0 || q_len % block_q != 0 || kv_len % block_kv != 0 {
            return Err(SplashError::BlockSizes(BlockSizeError::MaskBlocks {
                block_q,
                block_kv,
                q_len,
                kv_len,
            }));
        }
        let q_end = offsets.q + q_len;
        let kv_end = offsets.kv + kv_len;
        if q_end > MAX_POSITION || kv_end > MAX_POSITION {
            return Err(SplashError::Mask(MaskError::PositionsTooLarge {
                reach: q_end.max(kv_end),
            }));
        }
        let (classes, class_of_head) = mask.classes(heads);
        for m in &classes {
            m.check(q_end as i64, kv_end as i64)?;
        }
        let exprs: Option<Vec<MaskExpr>> = classes.iter().map(|m| m.to_expr()).collect();
        let kernel_mask = match exprs {
            Some(e) if e.len() <= MAX_COMPUTED_MASK_CLASSES => KernelMask::Computed(e),
            _ => KernelMask::Dense,
        };
        let (nq, nkv) = (q_len / block_q, kv_len / block_kv);
        let (rows, cols) = match major {
            Major::Q => (nq, nkv),
            Major::Kv => (nkv, nq),
        };
        let rect = |qb: usize, kb: usize| Rect {
            q0: (offsets.q + qb * block_q) as i64,
            q1: (offsets.q + (qb + 1) * block_q) as i64,
            k0: (offsets.kv + kb * block_kv) as i64,
            k1: (offsets.kv + (kb + 1) * block_kv) as i64,
        };
        // kinds[class][row][col]
        let kinds: Vec<Vec<Vec<BlockKind>>> = classes
            .iter()
            .map(|m| {
                (0..rows)
                    .map(|r| {
                        (0..cols)
                            .map(|c| {
                                let (qb, kb) = match major {
                                    Major::Q => (r, c),
                                    Major::Kv => (c, r),
                                };
                                m.classify(rect(qb, kb))
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let width = if shrink {
            kinds
                .iter()
                .flat_map(|k| k.iter())
                .map(|row| row.iter().filter(|&&k| k != BlockKind::Empty).count())
                .max()
                .unwrap_or(0)
                .max(1)
        } else {
            cols
        };
        // Dense partial blocks, deduplicated; their index per (class, row, col).
        let mut partial_blocks = Vec::new();
        let mut block_index: HashMap<Vec<i8>, usize> = HashMap::new();
        let mut partial_of: HashMap<(usize, usize, usize), usize> = HashMap::new();
        if kernel_mask == KernelMask::Dense {
            for (ci, (m, class_kinds)) in classes.iter().zip(&kinds).enumerate() {
                for (r, row) in class_kinds.iter().enumerate() {
                    for (c, kind) in row.iter().enumerate() {
                        if *kind != BlockKind::Partial {
                            continue;
                        }
                        let (qb, kb) = match major {
                            Major::Q => (r, c),
                            Major::Kv => (c, r),
                        };
                        let rc = rect(qb, kb);
                        // Stored as the kernel's tile: queries by keys, or keys by queries
                        // for the dK/dV kernels (which compute the transposed scores).
                        let mut bits = Vec::with_capacity(block_q * block_kv);
                        if major == Major::Kv {
                            for kv in rc.k0..rc.k1 {
                                for q in rc.q0..rc.q1 {
                                    bits.push(i8::from(m.allows(q, kv)));
                                }
                            }
                        } else {
                            for q in rc.q0..rc.q1 {
                                for kv in rc.k0..rc.k1 {
                                    bits.push(i8::from(m.allows(q, kv)));
                                }
                            }
                        }
                        let n = block_index.len();
                        let idx = *block_index.entry(bits.clone()).or_insert_with(|| {
                            partial_blocks.extend_from_slice(&bits);
                            n
                        });
                        partial_of.insert((ci, r, c), idx);
                    }
                }
            }
        }
        let num_partial_blocks = block_index.len();
        // Tables per class, then per table head.
        let mut class_tables = Vec::with_capacity(classes.len());
        for (ci, class_kinds) in kinds.iter().enumerate() {
            let mut data_next = Vec::with_capacity(rows * width);
            let mut block_mask = Vec::with_capacity(rows * width);
            let mut mask_next = Vec::with_capacity(rows * width);
            for (r, row) in class_kinds.iter().enumerate() {
                let slots: Vec<usize> = if shrink {
                    (0..cols).filter(|&c| row[c] != BlockKind::Empty).collect()
                } else {
                    (0..cols).collect()
                };
                let (mut last, mut last_mask) = (0usize, 0usize);
                for s in 0..width {
                    match slots.get(s) {
                        Some(&c) => {
                            last = c;
                            if let Some(&p) = partial_of.get(&(ci, r, c)) {
                                last_mask = p;
                            }
                            data_next.push(c as i32);
                            block_mask.push(row[c].code());
                            mask_next.push(last_mask as i32);
                        }
                        None => {
                            data_next.push(last as i32);
                            block_mask.push(BlockKind::Empty.code());
                            mask_next.push(last_mask as i32);
                        }
                    }
                }
            }
            class_tables.push((data_next, block_mask, mask_next));
        }
        let table_heads = if classes.len() == 1 { 1 } else { heads };
        let row_block: Vec<i32> = (0..table_heads * rows)
            .flat_map(|tr| std::iter::repeat_n((tr % rows) as i32, width))
            .collect();
        let row_bounds: Vec<i32> = (0..table_heads * rows)
            .flat_map(|_| (0..width).map(|s| bounds_of(s == 0, s + 1 == width)))
            .collect();
        let (mut data_next, mut block_mask, mut mask_next) = (Vec::new(), Vec::new(), Vec::new());
        for h in 0..table_heads {
            let (d, b, m) = &class_tables[class_of_head[h]];
            data_next.extend_from_slice(d);
            block_mask.extend_from_slice(b);
            mask_next.extend_from_slice(m);
        }
        let mut stats = BlockStats::default();
        for &ci in &class_of_head {
            for row in &kinds[ci] {
                for k in row {
                    stats.total += 1;
                    match k {
                        BlockKind::Empty => stats.empty += 1,
                        BlockKind::Partial => stats.partial += 1,
                        BlockKind::Full => stats.full += 1,
                    }
                }
            }
        }
        Ok(MaskInfo {
            major,
            block_q,
            block_kv,
            q_len,
            kv_len,
            offsets,
            heads,
            table_heads,
            rows,
            width,
            data_next,
            block_mask,
            mask_next,
            row_block,
            row_bounds,
            partial_blocks,
            keys_by_queries: major == Major::Kv,
            num_partial_blocks,
            kernel_mask,
            head_class: class_of_head.iter().map(|&c| c as i32).collect(),
            stats,
            diagonal_sub_tiles: None,
        })
    }

    /// Recodes the partial blocks that are [`DIAGONAL`] at sub-tile size `sub` (square blocks
    /// that `sub` cuts into at least two sub-tiles a side, either major): every
    /// sub-tile `(a, b)` (query sub-tile `a`, key sub-tile `b`) is empty where `b > a` and full
    /// where `b < a`, by `mask` at the tables' offsets (`mask` must be the one the tables were
    /// built from). Other tables are returned unchanged. A kernel that reads these tables must
    /// trace the diagonal path.
    pub fn with_diagonal_sub_tiles(mut self, mask: &MultiHeadMask, sub: usize) -> Self {
        let b = self.block_q;
        if b != self.block_kv || sub == 0 || b % sub != 0 || b / sub < 2 {
            return self;
        }
        let (classes, class_of_head) = mask.classes(self.heads);
        let n = b / sub;
        let (oq, okv) = (self.offsets.q as i64, self.offsets.kv as i64);
        let is_diagonal = |m: &Mask, qb: usize, kb: usize| {
            (0..n).all(|a| {
                (0..n).all(|c| {
                    let q0 = oq + (qb * b + a * sub) as i64;
                    let k0 = okv + (kb * b + c * sub) as i64;
                    let rect = Rect {
                        q0,
                        q1: q0 + sub as i64,
                        k0,
                        k1: k0 + sub as i64,
                    };
                    match c.cmp(&a) {
                        std::cmp::Ordering::Greater => m.classify(rect) == BlockKind::Empty,
                        std::cmp::Ordering::Less => m.classify(rect) == BlockKind::Full,
                        std::cmp::Ordering::Equal => true,
                    }
                })
            })
        };
        let per_table = self.rows * self.width;
        let mut any = false;
        for th in 0..self.table_heads {
            let m = &classes[if self.table_heads == 1 {
                0
            } else {
                class_of_head[th]
            }];
            for r in 0..self.rows {
                for s in 0..self.width {
                    let at = th * per_table + r * self.width + s;
                    let (row, col) = (self.row_block[at] as usize, self.data_next[at] as usize);
                    let (qb, kb) = match self.major {
                        Major::Q => (row, col),
                        Major::Kv => (col, row),
                    };
                    if self.block_mask[at] == BlockKind::Partial.code() && is_diagonal(m, qb, kb) {
                        self.block_mask[at] = DIAGONAL;
                        any = true;
                    }
                }
            }
        }
        if any {
            self.diagonal_sub_tiles = Some(sub);
        }
        self
    }

    /// The same blocks in one row per table head: every row's non-empty slots in turn (a row
    /// with none keeps one empty slot, so the kernel still starts and ends it), then empty
    /// slots repeating the last one up to the longest head's count. A kernel over these
    /// tables takes its row from `row_block` and its row's start and end from `row_bounds`.
    pub fn compacted(mut self) -> Self {
        let (rows, width) = (self.rows, self.width);
        let mut slots: Vec<Vec<(i32, i32, i32, i32)>> = Vec::with_capacity(self.table_heads);
        for th in 0..self.table_heads {
            let mut head = Vec::new();
            for r in 0..rows {
                let at = |s: usize| th * rows * width + r * width + s;
                let live: Vec<usize> = (0..width)
                    .filter(|&s| self.block_mask[at(s)] != BlockKind::Empty.code())
                    .collect();
                let kept = if live.is_empty() { vec![0] } else { live };
                for &s in &kept {
                    let a = at(s);
                    head.push((
                        self.data_next[a],
                        self.block_mask[a],
                        self.mask_next[a],
                        r as i32,
                    ));
                }
            }
            slots.push(head);
        }
        let new_width = slots.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let (mut data_next, mut block_mask, mut mask_next) = (Vec::new(), Vec::new(), Vec::new());
        let (mut row_block, mut row_bounds) = (Vec::new(), Vec::new());
        for head in &slots {
            for s in 0..new_width {
                match head.get(s) {
                    Some(&(d, b, m, r)) => {
                        let first = s == 0 || head[s - 1].3 != r;
                        let last = head.get(s + 1).is_none_or(|n| n.3 != r);
                        data_next.push(d);
                        block_mask.push(b);
                        mask_next.push(m);
                        row_block.push(r);
                        row_bounds.push(bounds_of(first, last));
                    }
                    None => {
                        let &(d, _, m, r) = head.last().expect("every head has a slot");
                        data_next.push(d);
                        block_mask.push(BlockKind::Empty.code());
                        mask_next.push(m);
                        row_block.push(r);
                        row_bounds.push(0);
                    }
                }
            }
        }
        self.rows = 1;
        self.width = new_width;
        self.data_next = data_next;
        self.block_mask = block_mask;
        self.mask_next = mask_next;
        self.row_block = row_block;
        self.row_bounds = row_bounds;
        self
    }

    /// Whether the tables differ per head (else one row of tables serves every head).
    pub fn per_head(&self) -> bool {
        self.table_heads > 1
    }

    /// The shape of one stored partial block: `[block_q, block_kv]`, or `[block_kv, block_q]`
    /// for kernels that compute the transposed scores ([`Self::keys_by_queries`]).
    pub fn partial_block_shape(&self) -> [usize; 2] {
        if self.keys_by_queries {
            [self.block_kv, self.block_q]
        } else {
            [self.block_q, self.block_kv]
        }
    }

    /// The same tables for a kernel whose score tiles are keys by queries while it walks
    /// key blocks for each query block (the dQ kernel): the stored partial blocks transposed.
    pub fn with_keys_by_queries_tiles(mut self) -> Self {
        if !self.keys_by_queries {
            let [rows, cols] = self.partial_block_shape();
            self.partial_blocks = self
                .partial_blocks
                .chunks(rows * cols)
                .flat_map(|b| (0..cols).flat_map(move |c| (0..rows).map(move |r| b[r * cols + c])))
                .collect();
            self.keys_by_queries = true;
        }
        self
    }

    /// Whether partial blocks are loaded from `partial_blocks`.
    pub fn dense(&self) -> bool {
        self.kernel_mask == KernelMask::Dense
    }

    /// Widens every row to `width` slots and the stored partial blocks to `num_partial`, so
    /// that tables built for different shards have one shape (one kernel serves them all).
    /// New slots are empty entries repeating the row's last block, like the padding `new`
    /// writes; new partial blocks are all-masked and never referenced.
    pub fn pad_to(&mut self, width: usize, num_partial: usize) {
        assert!(
            width >= self.width && num_partial >= self.num_partial_blocks,
            "padding only widens the tables"
        );
        if width > self.width {
            let old = self.width;
            let pad = |v: &[i32], fill: Option<i32>| -> Vec<i32> {
                v.chunks(old)
                    .flat_map(|row| {
                        let last = *row.last().expect("rows have at least one slot");
                        let extra = fill.unwrap_or(last);
                        row.iter()
                            .copied()
                            .chain((row.len()..width).map(move |_| extra))
                    })
                    .collect()
            };
            self.data_next = pad(&self.data_next, None);
            self.block_mask = pad(&self.block_mask, Some(BlockKind::Empty.code()));
            self.mask_next = pad(&self.mask_next, None);
            self.row_block = pad(&self.row_block, None);
            // A row's last slot stays its end: the new slots after it do nothing.
            self.row_bounds = pad(&self.row_bounds, Some(0));
            self.width = width;
        }
        if self.dense() && num_partial > self.num_partial_blocks {
            let block = self.block_q * self.block_kv;
            self.partial_blocks.resize(num_partial * block, 0);
            self.num_partial_blocks = num_partial;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::{DenseMask, Mask};

    fn info(mask: Mask, s: usize, b: usize, major: Major, shrink: bool) -> MaskInfo {
        MaskInfo::new(
            &mask.into(),
            2,
            s,
            s,
            SeqOffsets::default(),
            b,
            b,
            major,
            shrink,
        )
        .unwrap()
    }

    #[test]
    fn causal_computes_about_half_the_blocks() {
        let full = info(Mask::Full, 4096, 128, Major::Q, true);
        let causal = info(Mask::causal(), 4096, 128, Major::Q, true);
        let n = 32;
        assert_eq!(full.stats.computed(), 2 * n * n);
        assert_eq!(causal.stats.computed(), 2 * n * (n + 1) / 2);
        assert_eq!(causal.stats.partial, 2 * n);
        assert_eq!(causal.stats.empty, 2 * n * (n - 1) / 2);
        assert_eq!(causal.width, n);
        // Row 0 lists block 0 then pads with empty entries repeating it.
        assert_eq!(&causal.data_next[..3], &[0, 0, 0]);
        assert_eq!(&causal.block_mask[..3], &[1, 0, 0]);
        assert_eq!(causal.table_heads, 1);
        assert!(!causal.dense());
    }

    #[test]
    fn local_windows_shrink_the_grid() {
        let local = info(Mask::local(128, 0), 1024, 128, Major::Q, true);
        assert_eq!(local.width, 2);
        let kv = info(Mask::local(128, 0), 1024, 128, Major::Kv, true);
        assert_eq!(kv.width, 2);
        // Key block 0 is seen by query blocks 0 (diagonal) and 1.
        assert_eq!(&kv.data_next[..2], &[0, 1]);
    }

    #[test]
    fn dense_masks_store_deduplicated_partial_blocks() {
        let dense = Mask::Dense(DenseMask::from_fn(256, 256, |q, k| k <= q));
        let d = info(dense, 256, 64, Major::Q, false);
        assert!(d.dense());
        assert_eq!(d.num_partial_blocks, 1);
        assert_eq!(d.partial_blocks.len(), 64 * 64);
        // Queries by keys: query 0 sees key 0 only, query 1 keys 0 and 1.
        assert_eq!(&d.partial_blocks[..2], &[1, 0]);
        assert_eq!(&d.partial_blocks[64..66], &[1, 1]);
        // The dK/dV tables store keys by queries: key 1 is seen by queries 1.., not 0.
        let dense = Mask::Dense(DenseMask::from_fn(256, 256, |q, k| k <= q));
        let t = info(dense, 256, 64, Major::Kv, false);
        assert_eq!(t.partial_block_shape(), [64, 64]);
        assert_eq!(&t.partial_blocks[..2], &[1, 1]);
        assert_eq!(&t.partial_blocks[64..66], &[0, 1]);
        let c = info(Mask::causal(), 256, 64, Major::Q, false);
        assert_eq!(d.stats, c.stats);
        assert_eq!(d.block_mask, c.block_mask);
    }

    /// The dQ kernel walks the forward's tables but computes keys-by-queries tiles: its
    /// stored blocks are the forward's transposed (here 32 queries by 64 keys per block).
    #[test]
    fn keys_by_queries_tiles_transpose_the_stored_blocks() {
        let dense = Mask::Dense(DenseMask::from_fn(128, 128, |q, k| {
            k <= q && (q + k) % 3 != 0
        }));
        let (bq, bkv) = (32, 64);
        let d = MaskInfo::new(
            &dense.into(),
            1,
            128,
            128,
            SeqOffsets::default(),
            bq,
            bkv,
            Major::Q,
            true,
        )
        .unwrap();
        assert!(d.num_partial_blocks > 1);
        let t = d.clone().with_keys_by_queries_tiles();
        assert_eq!(
            (d.partial_block_shape(), t.partial_block_shape()),
            ([bq, bkv], [bkv, bq])
        );
        assert_eq!((&t.data_next, &t.mask_next), (&d.data_next, &d.mask_next));
        for b in 0..d.num_partial_blocks {
            for q in 0..bq {
                for k in 0..bkv {
                    let at = b * bq * bkv;
                    assert_eq!(
                        d.partial_blocks[at + q * bkv + k],
                        t.partial_blocks[at + k * bq + q],
                        "block {b}, query {q}, key {k}"
                    );
                }
            }
        }
        assert_eq!(
            t.clone().with_keys_by_queries_tiles(),
            t,
            "already keys by queries"
        );
    }

    #[test]
    fn per_head_masks_get_per_head_tables() {
        let m = MultiHeadMask::PerHead(vec![Mask::causal(), Mask::Full, Mask::causal()]);
        let i = MaskInfo::new(
            &m,
            3,
            256,
            256,
            SeqOffsets::default(),
            128,
            128,
            Major::Q,
            true,
        )
        .unwrap();
        assert_eq!(i.table_heads, 3);
        assert_eq!(i.head_class, vec![0, 1, 0]);
        assert_eq!(i.stats.computed(), 3 + 4 + 3);
        assert_eq!(
            i.kernel_mask,
            KernelMask::Computed(vec![Mask::causal().to_expr().unwrap(), MaskExpr::Full])
        );
    }

    #[test]
    fn offsets_shift_the_diagonal() {
        // Query shard 1 of 2 (positions 256..512) against the whole sequence: all of the
        // first half is visible, the second half is causal.
        let i = MaskInfo::new(
            &Mask::causal().into(),
            1,
            256,
            512,
            SeqOffsets { q: 256, kv: 0 },
            128,
            128,
            Major::Q,
            false,
        )
        .unwrap();
        assert_eq!(i.block_mask, vec![2, 2, 1, 0, 2, 2, 2, 1]);
    }

    #[test]
    fn compacted_tables_list_every_rows_blocks_in_turn() {
        // Causal with the first query block's row empty (keys start 128 later): rows 0..3 hold
        // 0, 1, 2 and 3 blocks; the empty row keeps one slot that starts and ends it.
        let offsets = SeqOffsets { q: 0, kv: 128 };
        let i = MaskInfo::new(
            &Mask::causal().into(),
            1,
            512,
            512,
            offsets,
            128,
            128,
            Major::Q,
            true,
        )
        .unwrap()
        .compacted();
        assert_eq!((i.rows, i.width), (1, 7));
        assert_eq!(i.row_block, vec![0, 1, 2, 2, 3, 3, 3]);
        assert_eq!(i.data_next, vec![0, 0, 0, 1, 0, 1, 2]);
        assert_eq!(i.block_mask, vec![0, 1, 2, 1, 2, 2, 1]);
        let both = ROW_FIRST + ROW_LAST;
        assert_eq!(
            i.row_bounds,
            vec![both, both, ROW_FIRST, ROW_LAST, ROW_FIRST, 0, ROW_LAST]
        );
        // Padding (shards of one kernel) adds empty slots repeating the last, ending nothing.
        let mut padded = i.clone();
        padded.pad_to(9, 0);
        assert_eq!(&padded.row_block[7..], &[3, 3]);
        assert_eq!(&padded.row_bounds[6..], &[ROW_LAST, 0, 0]);
        assert_eq!(&padded.block_mask[7..], &[0, 0]);
    }

    #[test]
    fn diagonal_blocks_are_recoded_where_their_sub_tiles_allow() {
        let causal = |offsets: SeqOffsets, mask: Mask| {
            MaskInfo::new(&mask.into(), 1, 512, 512, offsets, 256, 256, Major::Q, true).unwrap()
        };
        let mask = Mask::causal();
        // Both diagonal blocks of a causal mask: empty above, full below at any sub-tile.
        let d = causal(SeqOffsets::default(), mask.clone())
            .with_diagonal_sub_tiles(&mask.clone().into(), 64);
        assert_eq!(d.block_mask, vec![DIAGONAL, 0, 2, DIAGONAL]);
        assert_eq!(d.diagonal_sub_tiles, Some(64));
        // Shifted by 32 (a query shard's offsets), the diagonal crosses sub-tiles of 64
        // off their corners: a sub-tile above it is partial, so the blocks stay partial.
        let shifted = SeqOffsets { q: 32, kv: 0 };
        let p = causal(shifted, mask.clone()).with_diagonal_sub_tiles(&mask.clone().into(), 64);
        assert!(!p.block_mask.contains(&DIAGONAL), "{:?}", p.block_mask);
        assert_eq!(p.diagonal_sub_tiles, None);
        // Nor at 32: the diagonal then runs through sub-tiles (a, a + 1), not (a, a).
        let p = causal(shifted, mask.clone()).with_diagonal_sub_tiles(&mask.clone().into(), 32);
        assert_eq!(p.diagonal_sub_tiles, None, "{:?}", p.block_mask);
        // A local window narrower than the block leaves sub-tiles below the diagonal partial.
        let local = Mask::causal().and(Mask::local(100, 0));
        let l = causal(SeqOffsets::default(), local.clone())
            .with_diagonal_sub_tiles(&local.clone().into(), 64);
        assert!(!l.block_mask.contains(&DIAGONAL));
        // A sub-tile the size of the block (or non-square blocks) changes nothing.
        let whole = causal(SeqOffsets::default(), mask.clone());
        assert_eq!(
            whole
                .clone()
                .with_diagonal_sub_tiles(&mask.clone().into(), 256),
            whole
        );
    }

    #[test]
    fn padding_repeats_the_last_block_as_empty_slots() {
        let mut causal = info(Mask::causal(), 256, 128, Major::Q, true);
        assert_eq!(causal.width, 2);
        let before = causal.stats;
        causal.pad_to(4, 0);
        assert_eq!(causal.width, 4);
        assert_eq!(causal.data_next, vec![0, 0, 0, 0, 0, 1, 1, 1]);
        assert_eq!(causal.block_mask, vec![1, 0, 0, 0, 2, 1, 0, 0]);
        assert_eq!(causal.stats, before);
    }
}
