//! Naive f64 references, written for clarity and separately from the kernels: what every
//! backend's results are checked against (tests, `tessera demo`).

/// The largest absolute difference between two results (the registry's).
pub use tessera_registry::max_abs_diff;

use tessera_dsl::{DType, HostArray};

/// Deterministic pseudo-random values in [-1, 1), rounded to `dtype`.
pub fn random(dtype: DType, shape: &[usize], seed: u64) -> HostArray {
    HostArray::random(dtype, shape, seed)
}

/// `x [m, k] @ y [k, n]`.
pub fn matmul_ref(x: &[f64], y: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| x[i * k + p] * y[p * n + j]).sum();
        }
    }
    out
}

/// Softmax of each row of `x [rows, cols]`.
pub fn softmax_ref(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        for c in 0..cols {
            out[r * cols + c] = exps[c] / sum;
        }
    }
    out
}

/// Dense single-head attention: `softmax(q k^T / sqrt(d)) v`, optionally causal (`j <= i`).
pub fn attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    s: usize,
    d: usize,
    causal: bool,
) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; s * d];
    for i in 0..s {
        let visible: Vec<usize> = (0..s).filter(|&j| !causal || j <= i).collect();
        let logits: Vec<f64> = visible
            .iter()
            .map(|&j| scale * (0..d).map(|t| q[i * d + t] * k[j * d + t]).sum::<f64>())
            .collect();
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for t in 0..d {
            out[i * d + t] = visible
                .iter()
                .zip(&weights)
                .map(|(&j, w)| w * v[j * d + t])
                .sum::<f64>()
                / total;
        }
    }
    out
}
