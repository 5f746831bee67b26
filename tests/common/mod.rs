//! Naive host references (f64, written for clarity, separately from the kernels) and helpers.
#![allow(dead_code)]

pub use tessera::reference::*;

use tessera::dsl::{mosaic, ArgSpec, HostArray, KernelDef, TargetRules};
use tessera_mosaic_eval::{EvalError, Module, OutputSpec, RunOptions};

/// Instantiates `def` for `args` under `rules`, lowers it to Mosaic text and runs the text
/// with mosaic-eval (which never sees the kernel IR).
pub fn mosaic_eval(
    def: &KernelDef,
    args: &[HostArray],
    rules: &TargetRules,
    options: &RunOptions,
) -> Result<Vec<HostArray>, EvalError> {
    let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
    let k = def
        .instantiate(&specs, rules)
        .unwrap_or_else(|e| panic!("{e}"));
    let m = mosaic::lower(&k).unwrap_or_else(|e| panic!("{e}"));
    let module = Module::parse(&m.text).unwrap_or_else(|e| panic!("{}: {e}\n{}", m.name, m.text));
    let outputs: Vec<OutputSpec> = m
        .results
        .iter()
        .map(|r| OutputSpec {
            dtype: r.dtype,
            shape: r.shape.clone(),
        })
        .collect();
    module.run_with(args, &outputs, options)
}

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
