//! Naive host references (f64, written for clarity, separately from the kernels) and helpers.
#![allow(dead_code)]

pub use tessera::reference::*;

/// Asserts `got` is within `tol` of `want` everywhere (NaN fails).
#[track_caller]
pub fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let (err, at) = max_abs_diff(got, want);
    assert!(
        err <= tol && !err.is_nan(),
        "{what}: max abs error {err:e} at {at} (got {}, want {}) exceeds {tol:e}",
        got[at],
        want[at]
    );
}
