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

/// Runs the `tessera` binary with `args`: whether it succeeded, its stdout and its stderr.
pub fn tessera(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
