//! The fused backward's dQ reduction (`splash_dq_reduce`) summing several dQ partials per
//! grid step, with an f32 accumulator over steps and without one (a step that takes every
//! partial), in f32 and bf16: on every backend and in mosaic-eval against an f64 sum, and
//! compiled by libtpu for v5p. Splash's own backward tests run it at their sizes, where one
//! step takes every partial.

mod common;

use tessera::dsl::{with_float_type, DType, HostArray};
use tessera::splash::kernels::{splash_dq_reduce, ReduceConfig};

/// `[NS, B, H, SQ, D]`: 4 dQ partials, B 1, H 2, SQ 256, D 128.
const SHAPE: [usize; 5] = [4, 1, 2, 256, 128];

/// Their sum, in f64 (each partial as its dtype holds it).
fn reference(partials: &HostArray) -> Vec<f64> {
    let values = partials.to_f64_vec();
    let per_block: usize = SHAPE[1..].iter().product();
    (0..per_block)
        .map(|e| (0..SHAPE[0]).map(|b| values[b * per_block + e]).sum())
        .collect()
}

/// The reduction of random partials in `dtype`: 2 of 4 a step (an accumulator over 2
/// steps), all 4 (none), 1 (4 steps).
fn cases(dtype: DType) -> Vec<common::Case> {
    let partials = HostArray::random(dtype, SHAPE.to_vec(), 7);
    let want = reference(&partials);
    [2, 4, 1]
        .into_iter()
        .map(|per_step| {
            let cfg = ReduceConfig {
                bq: 128,
                per_step,
                partials: SHAPE[0],
            };
            let def = with_float_type!(dtype, T => splash_dq_reduce::<T>(cfg));
            (
                "splash_dq_reduce",
                def,
                vec![partials.clone()],
                want.clone(),
            )
        })
        .collect()
}

/// bf16 rounds the f32 sum (up to 4 in size) once, when it is stored.
const BF16_TOLERANCE: f64 = 4.0 / 256.0;

#[test]
fn several_key_blocks_a_step_sum_as_one_per_step() {
    common::cases_on_every_backend(cases(DType::F32), 1e-5);
    common::cases_on_every_backend(cases(DType::BF16), BF16_TOLERANCE);
}

#[test]
fn mosaic_eval_sums_them_too() {
    common::cases_on_mosaic_eval(cases(DType::F32), 1e-5);
    common::cases_on_mosaic_eval(cases(DType::BF16), BF16_TOLERANCE);
}

#[test]
fn libtpu_compiles_every_form() {
    common::cases_compile_for("tpu:v5p:2x2x1", cases(DType::BF16));
}
