//! Paged attention for decoding: one query token per sequence attends to its keys and
//! values, which live in pages of a shared pool in HBM, found through a page table.
//!
//! JAX's `paged_attention` semantics and argument layout: `q [B, H, D]`, `k_pages` and
//! `v_pages [KVH, P, page_size, D]` left in HBM, `lengths [B]` and `page_indices [B,
//! pages_per_seq]` (i32, scalar prefetch: in SMEM), `out [B, H, D]`. Query head `h` reads KV
//! head `h / (H / KVH)` (MHA when `KVH == H`, GQA otherwise); sequence `b` has `lengths[b]`
//! tokens, token `t` in page `page_indices[b, t / page_size]` at row `t % page_size`. The
//! logits are not scaled (scale `q` first, as with JAX's kernel); a sequence of length 0 gets
//! zeros.
//!
//! One grid step per sequence and KV head (`grid = (B, KVH)`, the KV heads `arbitrary`, so
//! a core computes a sequence's heads in order): the head's pages are fetched
//! `pages_per_block` at a time, one copy per page, into one half of a two-block VMEM buffer
//! while the other half is computed on; the block after a head's last is the next head's
//! first, so each step but a sequence's first starts with its first block in flight (JAX's
//! kernel prefetches across its steps too). The softmax is online across blocks, one `q k^T`
//! and one `p v` product per block for the head's group of query heads, its running max,
//! sum and output carried by the loop. Only the entries a sequence uses are read (the first
//! `ceil(length / page_size)` of its table row): a block's pages past them are copied from
//! the sequence's first page, and their positions masked. `q` and `out` are one `[H, D]`
//! block per sequence, single-buffered (each is copied once per sequence; one buffer each
//! keeps the kernel's VMEM at JAX's, 147,456 bytes at `scripts/memory_cost.py`'s sizes); a
//! step picks its group's rows of `q` and adds its rows of `out` with one-hot products.
//!
//! The tables are run-time data: a page index outside the pool would copy another
//! sequence's (another tenant's) pages, a length past the table would read past the row.
//! [`validate_tables`] states the rules and refuses a bad entry with a sentence naming the
//! sequence, the entry and the bound; every host path runs it before the kernel (`tessera
//! run`, the registry's `Instance::run`, tessera-jax's `call` on concrete arrays). The kernel
//! checks the same rules itself, on every backend (the StableHLO path and TPU included): a
//! length with `debug_check` (the interpreter and mosaic-eval stop at it with the grid step
//! and a `debug_print` line of the values; on TPU also a `cf.assert`), then clamped so that
//! everything counted from it is proven in range; each page number by tessera's run-time
//! index checks on the copy's window ([`tessera_dsl::checks`]). A bad page is never copied,
//! and the run returns an error naming the kernel line, the value and the grid step instead
//! of outputs.

use tessera_dsl::prelude::*;
use tessera_dsl::HostArray;

/// What masked logits are set to (JAX's `DEFAULT_MASK_VALUE`).
pub const MASK_VALUE: f32 = -0.7 * f32::MAX;

/// Paged attention over `T` (f32 or bf16) inputs, fetching `pages_per_block` pages per copy
/// block. Arguments `q, k_pages, v_pages, lengths, page_indices`; see the module docs.
#[tpu_kernel(
    grid = (B, KVH),
    dimension_semantics = (parallel, arbitrary),
    require(
        H % KVH == 0,
        "{KVH} KV heads do not divide q's {H} heads; each KV head serves a group of query heads"
    ),
    require(
        (PAGES_PER_SEQ + pages_per_block) * PAGE_SIZE <= i32::MAX as usize,
        "{PAGES_PER_SEQ} pages of {PAGE_SIZE} tokens per sequence (and a block of \
         {pages_per_block} more) do not fit the i32 lengths and positions the kernel counts with"
    ),
    require(
        pages_per_block > 0 && PAGES_PER_SEQ % pages_per_block == 0,
        "{PAGES_PER_SEQ} pages per sequence are not whole blocks of pages_per_block = \
         {pages_per_block}; choose a pages_per_block that divides {PAGES_PER_SEQ}"
    )
)]
pub fn paged_attention<T: Element>(
    #[shape(B, H, D)]
    #[block((None, H, D), |b, _| (b, 0, 0), buffers = 1)]
    q: Ref<T>,
    #[shape(KVH, P, PAGE_SIZE, D)] k_pages: Hbm<T>,
    #[shape(KVH, P, PAGE_SIZE, D)] v_pages: Hbm<T>,
    #[shape(B)] lengths: Smem<i32>,
    #[shape(B, PAGES_PER_SEQ)] page_indices: Smem<i32>,
    #[shape(B, H, D)]
    #[block((None, H, D), |b, _| (b, 0, 0), buffers = 1)]
    out: RefMut<T>,
    #[scratch(2, pages_per_block * PAGE_SIZE, D)] mut k_buf: Vmem<T>,
    #[scratch(2, pages_per_block * PAGE_SIZE, D)] mut v_buf: Vmem<T>,
    #[scratch(2)] k_sems: DmaSem,
    #[scratch(2)] v_sems: DmaSem,
    #[comptime] pages_per_block: usize,
) {
    let ppb = pages_per_block;
    let group = H / KVH;
    let (b, kv_head) = (program_id(0), program_id(1));
    let length = lengths.get([b]);
    // The host checks these (`validate_tables`); the kernel checks them again before they
    // count anything (on every backend: its check flags).
    let max_len = (PAGES_PER_SEQ * PAGE_SIZE) as i32;
    let length_ok = length.ge(0) & length.le(max_len);
    when(!length_ok, || {
        debug_print!("paged_attention: sequence {} has length {}", b, length)
    });
    let length_message = format!(
        "lengths[b] is outside 0..={max_len} ({PAGES_PER_SEQ} pages of {PAGE_SIZE} tokens per \
         sequence)"
    );
    debug_check(length_ok, &length_message);
    // Past the check the length is taken within its bounds (a bad one has been reported),
    // so that every block, entry and slot derived from it is proven in range at
    // instantiation and only the page numbers the kernel loads are checked at run time.
    let length = length.maximum(0).minimum(max_len);
    let block_len = ppb * PAGE_SIZE;
    let blocks = (length + (block_len as i32 - 1)) / block_len as i32;
    // The table entries the sequence uses. A block's pages past them (the last block's) are
    // copied from the sequence's first page instead (entry 0, used whenever a block is, and
    // checked), so that every page copied is one the sequence owns and the compute, which
    // masks those positions, stays one dot over the whole block.
    let used = (length + (PAGE_SIZE as i32 - 1)) / PAGE_SIZE as i32;
    // The entry page `j` of block `i` is copied from, and its page.
    let entry = |i: Value, j: usize| {
        let e = i * ppb as i32 + j as i32;
        select(e.lt(used), e, 0)
    };
    let page_of = |i: Value, j: usize| page_indices.get([b, entry(i, j)]);
    // The buffers' slot of KV head `head`'s block `i`: the blocks of the sequence's heads
    // alternate between the two slots in the order the core computes them.
    let slot_of = |head: Value, i: Value| (head * blocks + i) % 2;
    // The copies of KV head `head`'s page `page` (a block's `j`th) into slot `slot` of the
    // buffers (K and V): started one block ahead, waited by the block that computes on them.
    let page_copies = |k_buf: &mut Vmem<T>, v_buf: &mut Vmem<T>, head, page: Value, slot, j| {
        let at = [ds(head, 1), ds(page, 1), all(), all()];
        let to = [ds(slot, 1), ds(j * PAGE_SIZE, PAGE_SIZE), all()];
        [
            make_async_copy(k_pages.at(&at), k_buf.at_mut(&to), k_sems.at(slot)),
            make_async_copy(v_pages.at(&at), v_buf.at_mut(&to), v_sems.at(slot)),
        ]
    };
    // Each page number is checked by tessera's run-time index checks on the copy's window
    // (`0 <= p < P`; a bad one is not copied and is reported with its value, this line and
    // the grid step), on every backend: no check of the kernel's own is needed.
    let fetch = |k_buf: &mut Vmem<T>, v_buf: &mut Vmem<T>, head: Value, i: Value, slot: Value| {
        for j in 0..ppb {
            let p = page_of(i, j);
            for copy in page_copies(k_buf, v_buf, head, p, slot, j) {
                copy.start();
            }
        }
    };
    // A sequence's first block is fetched by its first KV head's step; every later block,
    // the next heads' first ones included, one block ahead, by the loop below.
    when(kv_head.eq(0), || {
        when(blocks.gt(0), || {
            let zero = constant(DType::I32, &[], 0);
            fetch(&mut k_buf, &mut v_buf, zero, zero, zero)
        })
    });
    // This step's KV head serves query heads `kv_head * group ..`, picked out of the
    // sequence's `[H, D]` block by a one-hot product (exact: one nonzero term per entry). A
    // group of 4 or 2 rows at a run-time row offset is no whole (8, 128) tile, which TPU
    // loads and stores need; the product is a few MXU pushes.
    let in_group = |rows: usize, cols: usize, head_dim: usize| {
        let head = iota(DType::I32, &[rows, cols], head_dim);
        let member = iota(DType::I32, &[rows, cols], 1 - head_dim) + kv_head * group as i32;
        select(head.eq(member), 1.0f32, 0.0f32).cast(T::DTYPE)
    };
    let qg = dot(in_group(group, H, 1), q.load()).cast(T::DTYPE);
    // The online softmax over the sequence's blocks, one `[group, block_len]` product per
    // block for q k^T and one for p v (bf16 operands where the pages are bf16, accumulated in
    // f32, as the MXU runs JAX's kernel), its running max, sum and output carried by the loop.
    let init = (
        constant(DType::F32, &[group, 1], f32::NEG_INFINITY),
        zeros(DType::F32, &[group, 1]),
        zeros(DType::F32, &[group, D]),
    );
    let (_, l, acc) = fori_loop(0, blocks, init, |i, (m, l, acc)| {
        let slot = slot_of(kv_head, i);
        // The next block: this head's, or after its last the next head's first, which the
        // next grid step computes (on this core: the heads are the grid's `arbitrary` axis),
        // so that it is in flight when that step starts.
        let next = i + 1;
        let this_head = next.lt(blocks);
        when(this_head | kv_head.lt(KVH as i32 - 1), || {
            // At most the last head (the branch runs for the next head only below it; the
            // bound lets the run-time checks prove the copies' head in range).
            let head = select(this_head, kv_head, kv_head + 1).minimum(KVH as i32 - 1);
            let block = select(this_head, next, 0);
            // `slot_of(kv_head + 1, 0)` is `slot_of(kv_head, blocks)`.
            fetch(&mut k_buf, &mut v_buf, head, block, slot_of(kv_head, next))
        });
        // A wait needs the copy's shape and semaphore, not its page: page 0 spares the
        // table read.
        let any_page = constant(DType::I32, &[], 0);
        for j in 0..ppb {
            for copy in page_copies(&mut k_buf, &mut v_buf, kv_head, any_page, slot, j) {
                copy.wait();
            }
        }
        let at = [ds(slot, 1), all(), all()];
        let k = k_buf.at(&at).load().reshape(&[block_len, D]);
        let v = v_buf.at(&at).load().reshape(&[block_len, D]);
        let s = dot_nt(qg, k);
        let pos = iota(DType::I32, &[group, block_len], 1) + i * block_len as i32;
        let s = select(pos.lt(length), s, MASK_VALUE);
        let m_next = m.maximum(s.max_keepdims(-1));
        let alpha = (m - m_next).exp();
        let p = (s - m_next).exp();
        let l_next = alpha * l + p.sum_keepdims(-1);
        let acc_next = acc * alpha + dot(p.cast(T::DTYPE), v);
        (m_next, l_next, acc_next)
    });
    // A sequence of length 0 has `l == 0` and `acc == 0`: zeros. The output block stays in
    // VMEM across the sequence's KV heads (the grid's `arbitrary` axis) and is written back
    // after the last; each head adds its group's rows (exact: the other rows add 0).
    let rows = dot(
        in_group(H, group, 0),
        (acc / l.maximum(f32::MIN_POSITIVE)).cast(T::DTYPE),
    );
    when(kv_head.eq(0), || out.store(0.0));
    out.store((out.load().cast(DType::F32) + rows).cast(T::DTYPE));
}

/// A page table or lengths paged attention refuses to run on ([`validate_tables`]): one
/// sentence naming the sequence, the entry and the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// A length below 0 or past what the sequence's table row holds.
    #[error(
        "paged attention: sequence {seq} has length lengths[{seq}] = {length}, outside 0 to \
         {max} (its table row holds {pages_per_seq} pages of {page_size} tokens)"
    )]
    Length {
        seq: usize,
        length: i32,
        /// `pages_per_seq * page_size`.
        max: usize,
        pages_per_seq: usize,
        page_size: usize,
    },
    /// An entry the sequence uses that is no page of the pool.
    #[error(
        "paged attention: sequence {seq} reads entry page_indices[{seq}, {entry}] = {page}, \
         which is no page of the pool's {pages} (0 to {last}); its {length} tokens use entries \
         0 to {last_used}",
        last = *.pages as i64 - 1,
        last_used = *.used as i64 - 1
    )]
    Page {
        seq: usize,
        entry: usize,
        page: i32,
        pages: usize,
        length: i32,
        /// The entries the sequence uses: `ceil(length / page_size)`.
        used: usize,
    },
    /// Tables whose sizes do not agree with each other.
    #[error(
        "paged attention: page_indices holds {entries} entries and lengths {sequences}; the \
         table holds {pages_per_seq} entries per sequence, so it needs {}",
        .sequences * .pages_per_seq
    )]
    Shape {
        entries: usize,
        sequences: usize,
        pages_per_seq: usize,
    },
}

/// Checks paged attention's run-time tables against the pool, the rules the kernel relies
/// on: `lengths[b]` (one per sequence) in `0..=pages_per_seq * page_size`, and the entries
/// sequence `b` uses, `page_indices[b, e]` for `e < ceil(lengths[b] / page_size)` (the table
/// row-major, `pages_per_seq` entries per sequence), pages of the pool (`0..pages`). The
/// entries past a sequence's pages are never read and may hold anything (a scheduler's
/// padding); sequences may share pages. The first bad entry is the error, by sequence.
pub fn validate_tables(
    lengths: &[i32],
    page_indices: &[i32],
    pages_per_seq: usize,
    page_size: usize,
    pages: usize,
) -> Result<(), TableError> {
    if lengths.len().checked_mul(pages_per_seq) != Some(page_indices.len()) {
        return Err(TableError::Shape {
            entries: page_indices.len(),
            sequences: lengths.len(),
            pages_per_seq,
        });
    }
    let max = pages_per_seq.saturating_mul(page_size);
    for (seq, &length) in lengths.iter().enumerate() {
        let Some(tokens) = usize::try_from(length).ok().filter(|&t| t <= max) else {
            return Err(TableError::Length {
                seq,
                length,
                max,
                pages_per_seq,
                page_size,
            });
        };
        let used = tokens.div_ceil(page_size.max(1));
        let row = &page_indices[seq * pages_per_seq..][..used];
        for (entry, &page) in row.iter().enumerate() {
            if usize::try_from(page).map_or(true, |p| p >= pages) {
                return Err(TableError::Page {
                    seq,
                    entry,
                    page,
                    pages,
                    length,
                    used,
                });
            }
        }
    }
    Ok(())
}

/// The f64 reference of [`paged_attention`]: `q [B, H, D]`, pages `[KVH, P, page_size, D]`,
/// `lengths [B]`, `page_indices [B, pages_per_seq]`; returns `out [B, H, D]` flattened.
pub fn paged_attention_reference(
    q: &HostArray,
    k_pages: &HostArray,
    v_pages: &HostArray,
    lengths: &[i32],
    page_indices: &HostArray,
) -> Vec<f64> {
    let (qs, ks, ps) = (q.shape(), k_pages.shape(), page_indices.shape());
    let (batch, heads, d) = (qs[0], qs[1], qs[2]);
    let (kv_heads, pages, page_size) = (ks[0], ks[1], ks[2]);
    let group = heads / kv_heads;
    let (q, k, v) = (q.to_f64_vec(), k_pages.to_f64_vec(), v_pages.to_f64_vec());
    let table = page_indices.to_f64_vec();
    let mut out = vec![0.0; batch * heads * d];
    for b in 0..batch {
        let len = lengths[b].max(0) as usize;
        for h in 0..heads {
            let kvh = h / group;
            let row = |src: &[f64], t: usize| {
                let page = table[b * ps[1] + t / page_size] as usize;
                let start = ((kvh * pages + page) * page_size + t % page_size) * d;
                src[start..start + d].to_vec()
            };
            let qh = &q[(b * heads + h) * d..][..d];
            let logits: Vec<f64> = (0..len)
                .map(|t| row(&k, t).iter().zip(qh).map(|(a, b)| a * b).sum())
                .collect();
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = logits.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (t, w) in weights.iter().enumerate() {
                let vt = row(&v, t);
                for (o, x) in out[(b * heads + h) * d..][..d].iter_mut().zip(&vt) {
                    *o += w / total * x;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{validate_tables, TableError};

    /// Two sequences of a 64-page pool, 4 entries of 16 tokens each: 40 tokens use 3
    /// entries (the 4th is padding), 16 tokens use 1; they share page 5.
    fn check(lengths: [i32; 2], table: [i32; 8]) -> Result<(), TableError> {
        validate_tables(&lengths, &table, 4, 16, 64)
    }
    const GOOD: [i32; 8] = [5, 9, 63, -7, 5, i32::MIN, 100, i32::MAX];

    #[test]
    fn unused_entries_and_shared_pages_are_legal() {
        assert_eq!(check([40, 16], GOOD), Ok(()));
        assert_eq!(check([64, 0], [0, 1, 2, 3, -1, -1, -1, -1]), Ok(()));
    }

    #[test]
    fn every_page_a_sequence_uses_is_in_the_pool() {
        for bad in [64, 100, -1, i32::MIN, i32::MAX] {
            let mut table = GOOD;
            table[5] = bad;
            let e = check([40, 17], table).unwrap_err();
            assert_eq!(
                e,
                TableError::Page {
                    seq: 1,
                    entry: 1,
                    page: bad,
                    pages: 64,
                    length: 17,
                    used: 2
                }
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "paged attention: sequence 1 reads entry page_indices[1, 1] = {bad}, which \
                     is no page of the pool's 64 (0 to 63); its 17 tokens use entries 0 to 1"
                )
            );
        }
    }

    #[test]
    fn lengths_fit_the_table() {
        for bad in [65, -1, i32::MIN, i32::MAX] {
            let e = check([40, bad], GOOD).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "paged attention: sequence 1 has length lengths[1] = {bad}, outside 0 to \
                     64 (its table row holds 4 pages of 16 tokens)"
                )
            );
        }
    }

    #[test]
    fn tables_of_other_sizes_are_refused() {
        let e = validate_tables(&[1, 2], &[0; 7], 4, 16, 64).unwrap_err();
        assert_eq!(
            e.to_string(),
            "paged attention: page_indices holds 7 entries and lengths 2; the table holds 4 \
             entries per sequence, so it needs 8"
        );
    }
}
