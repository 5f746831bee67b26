//! Kernels with `repeat` (copies of a value side by side, Pallas' `pltpu.repeat`) and their
//! f64 references, shared by `tests/repeat.rs` (interpreter, CPU, the lowered texts, libtpu)
//! and `tests/mosaic_eval.rs` (the Mosaic text, bit for bit).
#![allow(dead_code)]

use tessera::dsl::prelude::*;
use tessera::dsl::{HostArray, KernelDef};

/// Lane-replicated row maxima scaled into a wider block, as splash's forward uses them: `m`
/// is `[8, 128]`, repeated 3 times along lanes to meet `[8, 384]`.
#[tpu_kernel(grid = (1,))]
fn repeat_lanes(
    #[shape(8, 384)]
    #[block((8, 384), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    m: Ref<f32>,
    #[shape(8, 384)]
    #[block((8, 384), |i| (i, 0))]
    out: RefMut<f32>,
) {
    out.store(x.load() - repeat(m.load(), 3, -1));
}

/// Two copies stacked along sublanes (axis 0, whole 8-row tiles), per head `h` (a squeezed,
/// parallel block dim, which the StableHLO lowering vectorises: the repeat of a batched
/// value).
#[tpu_kernel(grid = (H,), dimension_semantics = (parallel,))]
fn repeat_sublanes_per_head(
    #[shape(H, 8, 128)]
    #[block((None, 8, 128), |h| (h, 0, 0))]
    x: Ref<f32>,
    #[shape(H, 16, 128)]
    #[block((None, 16, 128), |h| (h, 0, 0))]
    out: RefMut<f32>,
) {
    out.store(repeat(x.load() * 2.0, 2, 0));
}

/// A width-1 column repeated 128 times along lanes (not whole tiles: Mosaic accepts it, as
/// libtpu 0.0.42 compiles unaligned concatenations; it costs more than whole-vreg copies).
#[tpu_kernel(grid = (1,))]
fn repeat_column(
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let column = x.load().max_keepdims(-1);
    out.store(x.load() - repeat(column, 128, 1));
}

/// `times` copies of a row-major `[rows, cols]` array along its columns.
fn repeat_cols(x: &[f64], rows: usize, cols: usize, times: usize) -> Vec<f64> {
    (0..rows * cols * times)
        .map(|i| {
            let (r, c) = (i / (cols * times), i % (cols * times));
            x[r * cols + c % cols]
        })
        .collect()
}

/// The kernels, their arguments and their f64 references.
pub fn cases() -> Vec<(&'static str, KernelDef, Vec<HostArray>, Vec<f64>)> {
    let x = HostArray::random(DType::F32, [8, 384], 1);
    let m = HostArray::random(DType::F32, [8, 128], 2);
    let want_lanes: Vec<f64> = x
        .to_f64_vec()
        .iter()
        .zip(repeat_cols(&m.to_f64_vec(), 8, 128, 3))
        .map(|(x, m)| x - m)
        .collect();
    let heads = HostArray::random(DType::F32, [4, 8, 128], 3);
    let hv = heads.to_f64_vec();
    // Per head, the `[8, 128]` block twice (rows 0..8 and 8..16), doubled.
    let want_heads: Vec<f64> = (0..4 * 16 * 128)
        .map(|i| {
            let (h, r, c) = (i / (16 * 128), (i / 128) % 16, i % 128);
            2.0 * hv[(h * 8 + r % 8) * 128 + c]
        })
        .collect();
    let c = HostArray::random(DType::F32, [8, 128], 4);
    let cv = c.to_f64_vec();
    let want_column: Vec<f64> = cv
        .chunks(128)
        .flat_map(|row| {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            row.iter().map(move |v| v - max)
        })
        .collect();
    vec![
        ("repeat_lanes", repeat_lanes(), vec![x, m], want_lanes),
        ("repeat_column", repeat_column(), vec![c], want_column),
        (
            "repeat_sublanes_per_head",
            repeat_sublanes_per_head(),
            vec![heads],
            want_heads,
        ),
    ]
}
