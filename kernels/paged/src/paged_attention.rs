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
//! One grid step per sequence. The pages are fetched `pages_per_block` at a time, one copy
//! per page holding every KV head (`k_pages[:, page]`), into one half of a two-block VMEM
//! buffer while the other half is computed on (double buffering within the step); the
//! softmax is online across pages, per KV head group, with the running max, sum and output
//! in scratch.

use tessera_dsl::prelude::*;
use tessera_dsl::{CopyDescriptor, HostArray};

/// What masked logits are set to (JAX's `DEFAULT_MASK_VALUE`).
pub const MASK_VALUE: f32 = -0.7 * f32::MAX;

/// Paged attention over `T` (f32 or bf16) inputs, fetching `pages_per_block` pages per copy
/// block. Arguments `q, k_pages, v_pages, lengths, page_indices`; see the module docs.
#[tpu_kernel(
    grid = B,
    dimension_semantics = (parallel,),
    require(
        H % KVH == 0,
        "{KVH} KV heads do not divide q's {H} heads; each KV head serves a group of query heads"
    ),
    require(
        pages_per_block > 0 && PAGES_PER_SEQ % pages_per_block == 0,
        "{PAGES_PER_SEQ} pages per sequence are not whole blocks of pages_per_block = \
         {pages_per_block}; choose a pages_per_block that divides {PAGES_PER_SEQ}"
    )
)]
pub fn paged_attention<T: Element>(
    #[shape(B, H, D)]
    #[block((None, H, D), |b| (b, 0, 0))]
    q: Ref<T>,
    #[shape(KVH, P, PAGE_SIZE, D)] k_pages: Hbm<T>,
    #[shape(KVH, P, PAGE_SIZE, D)] v_pages: Hbm<T>,
    #[shape(B)] lengths: Smem<i32>,
    #[shape(B, PAGES_PER_SEQ)] page_indices: Smem<i32>,
    #[shape(B, H, D)]
    #[block((None, H, D), |b| (b, 0, 0))]
    out: RefMut<T>,
    #[scratch(2, pages_per_block, KVH, PAGE_SIZE, D)] mut k_buf: Vmem<T>,
    #[scratch(2, pages_per_block, KVH, PAGE_SIZE, D)] mut v_buf: Vmem<T>,
    #[scratch(2)] k_sems: DmaSem,
    #[scratch(2)] v_sems: DmaSem,
    #[scratch(H, 1)] m: Scratch<f32>,
    #[scratch(H, 1)] l: Scratch<f32>,
    #[scratch(H, D)] acc: Scratch<f32>,
    #[comptime] pages_per_block: usize,
) {
    let ppb = pages_per_block;
    let group = H / KVH;
    let b = program_id(0);
    let length = lengths.get([b]);
    let block_len = (ppb * PAGE_SIZE) as i32;
    let blocks = (length + (block_len - 1)) / block_len;
    m.store(f32::NEG_INFINITY);
    l.store(0.0);
    acc.store(0.0);
    // The copies of page `j` of block `i` into slot `slot` of the buffers (K and V): started
    // one block ahead, waited by the block that computes on them.
    let page_of = |i: Value, j: usize| page_indices.get([b, i * ppb as i32 + j as i32]);
    let page_copies = |k_buf: &mut Vmem<T>, v_buf: &mut Vmem<T>, i: Value, slot: Value, j| {
        let (at, to) = (page(page_of(i, j)), slot_page(slot, j));
        [
            make_async_copy(k_pages.at(&at), k_buf.at_mut(&to), k_sems.at(slot)),
            make_async_copy(v_pages.at(&at), v_buf.at_mut(&to), v_sems.at(slot)),
        ]
    };
    let fetch = |k_buf: &mut Vmem<T>, v_buf: &mut Vmem<T>, i: Value, slot: Value| {
        for j in 0..ppb {
            page_copies(k_buf, v_buf, i, slot, j)
                .iter()
                .for_each(CopyDescriptor::start);
        }
    };
    when(blocks.gt(0), || {
        let zero = constant(DType::I32, &[], 0);
        fetch(&mut k_buf, &mut v_buf, zero, zero)
    });
    fori_loop(0, blocks, (), |i, ()| {
        let slot = i % 2;
        let next = i + 1;
        when(next.lt(blocks), || {
            fetch(&mut k_buf, &mut v_buf, next, next % 2)
        });
        for j in 0..ppb {
            page_copies(&mut k_buf, &mut v_buf, i, slot, j)
                .iter()
                .for_each(CopyDescriptor::wait);
        }
        // Every KV head's group of query heads, over the block's pages.
        for g in 0..KVH {
            let rows = [ds(g * group, group), all()];
            let qg = q.at(&rows).load().cast(DType::F32);
            let state = (m.at(&rows).load(), l.at(&rows).load(), acc.at(&rows).load());
            let (mg, lg, accg) = fori_loop(0, ppb as i32, state, |j, (mg, lg, accg)| {
                let at = [ds(slot, 1), ds(j, 1), ds(g, 1), all(), all()];
                let k = k_buf.at(&at).load().reshape(&[PAGE_SIZE, D]);
                let v = v_buf.at(&at).load().reshape(&[PAGE_SIZE, D]);
                let s = dot_nt(qg, k.cast(DType::F32));
                let first = (i * ppb as i32 + j) * PAGE_SIZE as i32;
                let pos = iota(DType::I32, &[group, PAGE_SIZE], 1) + first;
                let s = select(pos.lt(length), s, MASK_VALUE);
                let m_next = mg.maximum(s.max_keepdims(-1));
                let alpha = (mg - m_next).exp();
                let p = (s - m_next).exp();
                let l_next = alpha * lg + p.sum_keepdims(-1);
                let acc_next = accg * alpha + dot(p, v.cast(DType::F32));
                (m_next, l_next, acc_next)
            });
            m.at(&rows).store(mg);
            l.at(&rows).store(lg);
            acc.at(&rows).store(accg);
        }
    });
    // A sequence of length 0 has `l == 0` and `acc == 0`: zeros.
    let l_all = l.load();
    out.store((acc.load() / l_all.maximum(f32::MIN_POSITIVE)).cast(T::DTYPE));
}

/// The window of page `page` of every KV head in HBM, and of slot `slot`, page `j` of a VMEM
/// block buffer.
fn page(page: Value) -> [tessera_dsl::Idx; 4] {
    [all(), ds(page, 1), all(), all()]
}
fn slot_page(slot: Value, j: usize) -> [tessera_dsl::Idx; 5] {
    [ds(slot, 1), ds(j, 1), all(), all(), all()]
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
