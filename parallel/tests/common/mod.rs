//! Helpers of the context-parallel tests.

use tessera_dsl::{DType, HostArray};

/// Deterministic inputs in [-1, 1).
pub fn random(dtype: DType, shape: &[usize], seed: u64) -> HostArray {
    HostArray::random(dtype, shape, seed)
}

/// Asserts `got` is within `tol` of `want` everywhere (NaN fails).
#[track_caller]
pub fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let (err, at) = got
        .iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| ((g - w).abs(), i))
        .fold(
            (0.0, 0),
            |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a },
        );
    assert!(
        err <= tol && !err.is_nan(),
        "{what}: max abs error {err:e} at {at} (got {}, want {}) exceeds {tol:e}",
        got[at],
        want[at]
    );
}
