//! Kernels with `when_else` (`if`/`else` on run-time values) and their f64 references, shared
//! by `tests/when_else.rs` (interpreter, CPU, the StableHLO text, libtpu) and
//! `tests/mosaic_eval.rs` (the Mosaic text, bit for bit).
#![allow(dead_code)]

use tessera::dsl::prelude::*;
use tessera::dsl::{HostArray, KernelDef};

/// `x @ y`: the first key step stores its product, the others add theirs (an `else` in
/// place of a zeroing `when`).
#[tpu_kernel(grid = (M / 128, N / 128, K / 128),
             dimension_semantics = (parallel, parallel, arbitrary))]
fn matmul_first_step_else(
    #[shape(M, K)]
    #[block((128, 128), |i, j, kk| (i, kk))]
    x: Ref<f32>,
    #[shape(K, N)]
    #[block((128, 128), |i, j, kk| (kk, j))]
    y: Ref<f32>,
    #[shape(M, N)]
    #[block((128, 128), |i, j, kk| (i, j))]
    out: RefMut<f32>,
    #[scratch(128, 128)] acc: Scratch<f32>,
) {
    let kk = program_id(2);
    let part = dot(x.load(), y.load());
    when_else(
        kk.eq(0),
        || acc.store(part),
        || acc.store(acc.load() + part),
    );
    when(kk.eq(num_programs(2) - 1), || out.store(acc.load()));
}

/// Per head `h` (a squeezed, parallel block dim, which the StableHLO lowering vectorises, so
/// the condition is a batched value there): `2 x` for even heads, `-x` for odd ones.
#[tpu_kernel(grid = (H,), dimension_semantics = (parallel,))]
fn even_heads_double(
    #[shape(H, 8, 128)]
    #[block((None, 8, 128), |h| (h, 0, 0))]
    x: Ref<f32>,
    #[shape(H, 8, 128)]
    #[block((None, 8, 128), |h| (h, 0, 0))]
    out: RefMut<f32>,
) {
    let even = (program_id(0) % 2).eq(0);
    when_else(even, || out.store(x.load() * 2.0), || out.store(-x.load()));
}

/// The two kernels, their arguments and their f64 references.
pub fn cases() -> Vec<(&'static str, KernelDef, Vec<HostArray>, Vec<f64>)> {
    let (m, k, n) = (256, 384, 128);
    let x = HostArray::random(DType::F32, [m, k], 1);
    let y = HostArray::random(DType::F32, [k, n], 2);
    let want = tessera::reference::matmul_ref(&x.to_f64_vec(), &y.to_f64_vec(), m, k, n);
    let heads = HostArray::random(DType::F32, [4, 8, 128], 3);
    let per_head: Vec<f64> = heads
        .to_f64_vec()
        .iter()
        .enumerate()
        .map(|(i, v)| if (i / 1024) % 2 == 0 { 2.0 * v } else { -v })
        .collect();
    vec![
        (
            "matmul_first_step_else",
            matmul_first_step_else(),
            vec![x, y],
            want,
        ),
        (
            "even_heads_double",
            even_heads_double(),
            vec![heads],
            per_head,
        ),
    ]
}
