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

use tessera_dsl::__private::{ArgDecl, BlockDim, DimSemantics, Loc, OperandRole, Param};
use tessera_dsl::prelude::*;
use tessera_dsl::{HostArray, IntoIndex, KernelDef};

/// What masked logits are set to (JAX's `DEFAULT_MASK_VALUE`).
pub const MASK_VALUE: f32 = -0.7 * f32::MAX;

/// Paged attention over `T` (f32 or bf16) inputs, fetching `pages_per_block` pages per copy
/// block. Arguments `q, k_pages, v_pages, lengths, page_indices`; see the module docs.
#[track_caller]
pub fn paged_attention<T: Element>(pages_per_block: usize) -> KernelDef {
    let loc = Loc::caller();
    let args = vec![
        arg("q", OperandRole::Input, T::DTYPE, 3),
        arg("k_pages", OperandRole::Input, T::DTYPE, 4),
        arg("v_pages", OperandRole::Input, T::DTYPE, 4),
        arg("lengths", OperandRole::ScalarPrefetch, DType::I32, 1),
        arg("page_indices", OperandRole::ScalarPrefetch, DType::I32, 2),
    ];
    let params = vec![Param {
        name: "pages_per_block".into(),
        value: pages_per_block.to_string(),
    }];
    KernelDef::__new("paged_attention", params, args, loc, move |b| {
        let qs = b.__arg("q", T::DTYPE, 3)?;
        let ks = b.__arg("k_pages", T::DTYPE, 4)?;
        let vs = b.__arg("v_pages", T::DTYPE, 4)?;
        let ls = b.__arg("lengths", DType::I32, 1)?;
        let ps = b.__arg("page_indices", DType::I32, 2)?;
        let (batch, heads, d) = (qs[0], qs[1], qs[2]);
        let (kv_heads, page_size) = (ks[0], ks[2]);
        shapes_agree(b, [&qs, &ks, &vs, &ls, &ps], pages_per_block)?;
        b.__grid(&[batch], &[DimSemantics::Parallel])?;
        let block = vec![
            BlockDim::Squeezed,
            BlockDim::Sized(heads),
            BlockDim::Sized(d),
        ];
        let per_seq = |i: &[Value]| vec![i[0], 0i32.into_index(), 0i32.into_index()];
        let q = b.__input::<T>("q", qs.clone(), block.clone(), &per_seq, loc);
        let k_pages = b.__hbm::<T>("k_pages", ks.clone(), loc);
        let v_pages = b.__hbm::<T>("v_pages", ks.clone(), loc);
        let lengths = b.__prefetch::<i32>("lengths", ls, loc);
        let page_indices = b.__prefetch::<i32>("page_indices", ps, loc);
        let out = b.__output::<T>("out", qs, block, &per_seq, loc);
        let buf = vec![2, pages_per_block, kv_heads, page_size, d];
        let parts = Parts {
            q,
            k_pages,
            v_pages,
            lengths,
            page_indices,
            out,
            k_buf: b.__vmem::<T>("k_buf", buf.clone(), loc),
            v_buf: b.__vmem::<T>("v_buf", buf, loc),
            k_sems: b.__dma_sems("k_sems", vec![2], loc),
            v_sems: b.__dma_sems("v_sems", vec![2], loc),
            m: b.__scratch::<f32>("m", vec![heads, 1], loc),
            l: b.__scratch::<f32>("l", vec![heads, 1], loc),
            acc: b.__scratch::<f32>("acc", vec![heads, d], loc),
            pages_per_block,
        };
        paged_attention_body(parts);
        Ok(())
    })
}

fn arg(name: &'static str, role: OperandRole, dtype: DType, rank: usize) -> ArgDecl {
    ArgDecl::new(name, role, dtype, rank)
}

/// The dims the arguments share: `q [B, H, D]`, pages `[KVH, P, page_size, D]` (K and V
/// alike) with `KVH` dividing `H`, `lengths [B]`, `page_indices [B, pages_per_seq]` in whole
/// blocks of `pages_per_block`.
fn shapes_agree(
    b: &mut tessera_dsl::Builder,
    [q, k, v, lengths, pages]: [&[usize]; 5],
    pages_per_block: usize,
) -> Result<(), tessera_dsl::Stop> {
    for (d, (&kd, &vd)) in k.iter().zip(v).enumerate() {
        b.__dim_eq("v_pages", d, vd, "k_pages's dim", kd)?;
    }
    b.__dim_eq("k_pages", 3, k[3], "D (q's dim 2)", q[2])?;
    b.__dim_eq("lengths", 0, lengths[0], "B (q's dim 0)", q[0])?;
    b.__dim_eq("page_indices", 0, pages[0], "B (q's dim 0)", q[0])?;
    b.__require(
        q[1] % k[0] == 0,
        "k_pages",
        format!(
            "{} KV heads do not divide q's {} heads; each KV head serves a group of query heads",
            k[0], q[1]
        ),
    )?;
    b.__require(
        pages_per_block > 0 && pages[1] % pages_per_block == 0,
        "page_indices",
        format!(
            "{} pages per sequence are not whole blocks of pages_per_block = {pages_per_block}; \
             choose a pages_per_block that divides {}",
            pages[1], pages[1]
        ),
    )
}

struct Parts<T: Element> {
    q: Ref<T>,
    k_pages: Hbm<T>,
    v_pages: Hbm<T>,
    lengths: Smem<i32>,
    page_indices: Smem<i32>,
    out: RefMut<T>,
    k_buf: Vmem<T>,
    v_buf: Vmem<T>,
    k_sems: DmaSem,
    v_sems: DmaSem,
    m: Scratch<f32>,
    l: Scratch<f32>,
    acc: Scratch<f32>,
    pages_per_block: usize,
}

/// The window of page `page` of every KV head in HBM, and of slot `slot`, page `j` of a VMEM
/// block buffer.
fn page(page: Value) -> [tessera_dsl::Idx; 4] {
    [all(), ds(page, 1), all(), all()]
}
fn slot_page(slot: Value, j: usize) -> [tessera_dsl::Idx; 5] {
    [ds(slot, 1), ds(j, 1), all(), all(), all()]
}

fn paged_attention_body<T: Element>(p: Parts<T>) {
    let Parts {
        q,
        k_pages,
        v_pages,
        lengths,
        page_indices,
        out,
        mut k_buf,
        mut v_buf,
        k_sems,
        v_sems,
        m,
        l,
        acc,
        pages_per_block: ppb,
    } = p;
    let [kv_heads, page_size, d] = [k_pages.shape()[0], k_pages.shape()[2], q.shape()[1]];
    let group = q.shape()[0] / kv_heads;
    let b = program_id(0);
    let length = lengths.get([b]);
    let block_len = (ppb * page_size) as i32;
    let blocks = (length + (block_len - 1)) / block_len;
    m.store(f32::NEG_INFINITY);
    l.store(0.0);
    acc.store(0.0);
    // Block `i`'s pages into slot `slot` of the buffers, one copy per page and tensor.
    let page_of = |i: Value, j: usize| page_indices.get([b, i * ppb as i32 + j as i32]);
    let fetch = |k_buf: &mut Vmem<T>, v_buf: &mut Vmem<T>, i: Value, slot: Value| {
        for j in 0..ppb {
            let at = page(page_of(i, j));
            async_copy(
                k_pages.at(&at),
                k_buf.at_mut(&slot_page(slot, j)),
                k_sems.at(slot),
            )
            .detach();
            async_copy(
                v_pages.at(&at),
                v_buf.at_mut(&slot_page(slot, j)),
                v_sems.at(slot),
            )
            .detach();
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
            let at = page(page_of(i, j));
            wait_copy(
                k_pages.at(&at),
                k_buf.at_mut(&slot_page(slot, j)),
                k_sems.at(slot),
            );
            wait_copy(
                v_pages.at(&at),
                v_buf.at_mut(&slot_page(slot, j)),
                v_sems.at(slot),
            );
        }
        // Every KV head's group of query heads, over the block's pages.
        for g in 0..kv_heads {
            let rows = [ds(g * group, group), all()];
            let qg = q.at(&rows).load().cast(DType::F32);
            let state = (m.at(&rows).load(), l.at(&rows).load(), acc.at(&rows).load());
            let (mg, lg, accg) = fori_loop(0, ppb as i32, state, |j, (mg, lg, accg)| {
                let at = [ds(slot, 1), ds(j, 1), ds(g, 1), all(), all()];
                let k = k_buf.at(&at).load().reshape(&[page_size, d]);
                let v = v_buf.at(&at).load().reshape(&[page_size, d]);
                let s = dot_nt(qg, k.cast(DType::F32));
                let first = (i * ppb as i32 + j) * page_size as i32;
                let pos = iota(DType::I32, &[group, page_size], 1) + first;
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
