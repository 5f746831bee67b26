//! A fused RMSNorm, as a kernel author writes one in a crate of their own:
//! `out = x / sqrt(mean(x^2) + eps) * weight`, row by row, in f32 whatever the input dtype.
//! The weight is optional (`Option<Ref<T>>`): leave it out with
//! `rms_norm::<T, BR>().without("weight")`.

use tessera::prelude::*;

/// Added to the mean square before the square root.
pub const EPS: f32 = 1e-6;

/// RMSNorm of each row of `x [R, C]` times `weight [1, C]`, `BR` rows per grid step.
#[tpu_kernel(grid = (R / BR,), dimension_semantics = (parallel,))]
pub fn rms_norm<T: Element, const BR: usize>(
    #[shape(R, C)]
    #[block((BR, C), |i| (i, 0))]
    x: Ref<T>,
    #[shape(1, C)] weight: Option<Ref<T>>,
    #[shape(R, C)]
    #[block((BR, C), |i| (i, 0))]
    out: RefMut<T>,
) {
    let x = x.load().cast(DType::F32);
    // `C`, bound by `#[shape]`, is the row length here too.
    let mean_square = (x * x).sum_keepdims(-1) / C as f32;
    let y = x * (mean_square + EPS).rsqrt();
    let y = match weight {
        Some(w) => y * w.load().cast(DType::F32),
        None => y,
    };
    out.store(y.cast(T::DTYPE));
}

/// The f64 reference, written from the definition: each row of `x [rows, cols]` over its
/// root mean square (plus [`EPS`]), times `weight [cols]` when given.
pub fn rms_norm_ref(x: &[f64], weight: Option<&[f64]>, rows: usize, cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for row in x.chunks(cols).take(rows) {
        let mean_square = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
        let inv = 1.0 / (mean_square + f64::from(EPS)).sqrt();
        for (c, v) in row.iter().enumerate() {
            out.push(v * inv * weight.map_or(1.0, |w| w[c]));
        }
    }
    out
}
