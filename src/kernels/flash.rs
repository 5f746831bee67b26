//! Single-head flash attention forward with an online softmax.

use tessera_dsl::prelude::*;

/// `out = softmax(q k^T / sqrt(d)) v` for one head, `BQ` query rows per parallel step and `BKV`
/// keys per arbitrary step, keeping the running max `m`, sum `l` and output `acc` in scratch.
/// With `causal`, key `j` is visible to query `i` iff `j <= i`, and key blocks entirely above
/// the diagonal are skipped.
#[tpu_kernel(grid = (S / BQ, S / BKV), dimension_semantics = (parallel, arbitrary))]
pub fn flash_attention<T: Element, const BQ: usize, const BKV: usize>(
    #[shape(S, D)]
    #[block((BQ, D), |i, j| (i, 0))]
    q: Ref<T>,
    #[shape(S, D)]
    #[block((BKV, D), |i, j| (j, 0))]
    k: Ref<T>,
    #[shape(S, D)]
    #[block((BKV, D), |i, j| (j, 0))]
    v: Ref<T>,
    #[shape(S, D)]
    #[block((BQ, D), |i, j| (i, 0))]
    out: RefMut<T>,
    #[scratch(BQ, 1)] m: Scratch<f32>,
    #[scratch(BQ, 1)] l: Scratch<f32>,
    #[scratch(BQ, D)] acc: Scratch<f32>,
    #[comptime] causal: bool,
) {
    let (qi, kj) = (program_id(0), program_id(1));
    when(kj.eq(0), || {
        m.store(f32::NEG_INFINITY);
        l.store(0.0);
        acc.store(0.0);
    });
    let scale = 1.0 / (q.shape()[1] as f32).sqrt();
    let step = || {
        let s = dot_nt(q.load(), k.load()) * scale;
        let s = if causal {
            let row = iota(DType::I32, &[BQ, BKV], 0) + qi * BQ as i32;
            let col = iota(DType::I32, &[BQ, BKV], 1) + kj * BKV as i32;
            select(col.le(row), s, f32::NEG_INFINITY)
        } else {
            s
        };
        let m_prev = m.load();
        let m_next = m_prev.maximum(s.max_keepdims(-1));
        let alpha = (m_prev - m_next).exp();
        let p = (s - m_next).exp();
        l.store(alpha * l.load() + p.sum_keepdims(-1));
        acc.store(acc.load() * alpha + dot(p.cast(T::DTYPE), v.load()));
        m.store(m_next);
    };
    if causal {
        // A key block whose first key is after the block's last query is fully masked.
        when((kj * BKV as i32).le(qi * BQ as i32 + (BQ as i32 - 1)), step);
    } else {
        step();
    }
    when(kj.eq(num_programs(1) - 1), || {
        out.store((acc.load() / l.load()).cast(T::DTYPE))
    });
}
