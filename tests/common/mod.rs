//! Naive host references (f64, written for clarity, separately from the kernels) and helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

use tessera::dsl::{
    mosaic, ArgSpec, CallFacts, DeviceAxis, HostArray, Kernel, KernelDef, KernelRules, Lowering,
};
use tessera::npy::write_npy;
use tessera_mosaic_eval::{EvalError, Module, OutputSpec, RunOptions};

pub use tessera::reference::*;

/// A kernel case of a test: its name, definition, arguments and the f64 reference of its
/// first output.
pub type Case = (&'static str, KernelDef, Vec<HostArray>, Vec<f64>);

/// `args` with element `at` (row-major) of the i32 argument `arg` set to `value`.
pub fn with_i32(args: &[HostArray], arg: usize, at: usize, value: i32) -> Vec<HostArray> {
    let mut args = args.to_vec();
    let mut data: Vec<i32> = args[arg].to_f64_vec().iter().map(|&x| x as i32).collect();
    data[at] = value;
    args[arg] = HostArray::i32(args[arg].shape().to_vec(), data).unwrap();
    args
}

/// Runs each case on every backend (under the TPU rules) against its reference.
pub fn cases_on_every_backend(cases: Vec<Case>, tol: f64) {
    use tessera::backend::{run, Backend};
    for (name, def, args, want) in cases {
        for backend in Backend::everywhere() {
            let out = run(&def, &args, backend, &KernelRules::tpu())
                .unwrap_or_else(|e| panic!("{name} on {backend}: {e}"));
            assert_close(
                &out[0].to_f64_vec(),
                &want,
                tol,
                &format!("{name} on {backend}"),
            );
        }
    }
}

/// Runs each case's Mosaic text (TPU rules) through mosaic-eval, two cores and the
/// parallel-state check, against its reference.
pub fn cases_on_mosaic_eval(cases: Vec<Case>, tol: f64) {
    for (name, def, args, want) in cases {
        let out = mosaic_eval(&def, &args, &KernelRules::tpu(), &RunOptions::default())
            .unwrap_or_else(|e| panic!("{name} on mosaic-eval: {e}"));
        assert_close(
            &out[0].to_f64_vec(),
            &want,
            tol,
            &format!("{name} on mosaic-eval"),
        );
    }
}

/// Compiles each case's kernel with libtpu for `topology` (e.g. `tpu:v5p:2x2x1`).
pub fn cases_compile_for(topology: &str, cases: Vec<Case>) {
    let target = tessera::tpu::TpuTopology::parse(topology).unwrap();
    for (name, def, args, _) in cases {
        let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
        let report = target
            .compile_kernel(&def, &specs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.kernels, [name]);
    }
}

/// Instantiates `def` for `args` under `rules`, lowers it to Mosaic text and runs the text
/// with mosaic-eval (which never sees the kernel IR).
pub fn mosaic_eval(
    def: &KernelDef,
    args: &[HostArray],
    rules: &KernelRules,
    options: &RunOptions,
) -> Result<Vec<HostArray>, EvalError> {
    let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
    let k = def
        .instantiate(&specs, rules)
        .unwrap_or_else(|e| panic!("{e}"));
    let (module, outputs) = parsed_mosaic(&k);
    let mut got = module.run_with(&with_flags_init(&k, args), &outputs, options)?;
    checked(&k, &mut got)?;
    Ok(got)
}

/// `args` and, for a kernel with run-time checks, the zeros its check flags start from (the
/// last operand of its custom call, which the caller makes).
pub fn with_flags_init(k: &Kernel, args: &[HostArray]) -> Vec<HostArray> {
    let mut args = args.to_vec();
    args.extend(tessera::dsl::checks::flags_init(k));
    args
}

/// Takes the check flags out of mosaic-eval's outputs of `k` and turns a failed check into
/// an error, as the runtime does after a run (the kernel line, the values, the grid step).
pub fn checked(k: &Kernel, outputs: &mut Vec<HostArray>) -> Result<(), EvalError> {
    tessera::dsl::checks::take_failure(k, outputs).map_err(|e| EvalError::Run {
        loc: "check flags".into(),
        message: e.to_string(),
    })
}

/// `k`'s Mosaic text parsed by mosaic-eval, and the specs of its outputs (with the operands
/// their custom call aliases).
fn parsed_mosaic(k: &Kernel) -> (Module, Vec<OutputSpec>) {
    let m = mosaic::lower(k).unwrap_or_else(|e| panic!("{e}"));
    let module = Module::parse(&m.text).unwrap_or_else(|e| panic!("{}: {e}\n{}", m.name, m.text));
    let call = Lowering::tpu()
        .mosaic_call(k, CallFacts::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let aliases = &call.call.output_operand_aliases;
    let outputs = m
        .results
        .iter()
        .enumerate()
        .map(|(i, r)| OutputSpec {
            dtype: r.dtype,
            shape: r.shape.clone(),
            aliases: aliases.iter().find(|a| a.output == i).map(|a| a.operand),
        })
        .collect();
    (module, outputs)
}

/// Lowers the instantiated kernel `k` to Mosaic text and runs the text with mosaic-eval on
/// `k`'s devices (`per_device[d]`: device `d`'s arguments in declaration order; one list for
/// a one-device kernel), each device on two cores with the parallel-state check; returns
/// each device's outputs.
pub fn mosaic_eval_on_devices(
    k: &Kernel,
    per_device: &[Vec<HostArray>],
) -> Result<Vec<Vec<HostArray>>, EvalError> {
    let (module, outputs) = parsed_mosaic(k);
    let args: Vec<Vec<HostArray>> = per_device
        .iter()
        .map(|a| mosaic::call_order(k, &with_flags_init(k, a)))
        .collect();
    let mut got = module.run_on_devices(&args, &outputs)?;
    for device in &mut got {
        checked(k, device)?;
    }
    Ok(got)
}

/// [`mosaic_eval_on_devices`] of `def` instantiated on `mesh` (empty: one device) for
/// device 0's argument specs under the TPU rules; panics on an error.
pub fn mosaic_eval_on_mesh(
    def: &KernelDef,
    mesh: &[DeviceAxis],
    per_device: &[Vec<HostArray>],
) -> Vec<Vec<HostArray>> {
    let specs: Vec<ArgSpec> = per_device[0].iter().map(ArgSpec::of).collect();
    let k = def
        .instantiate_on(&specs, mesh, &KernelRules::tpu())
        .unwrap_or_else(|e| panic!("{e}"));
    mosaic_eval_on_devices(&k, per_device).unwrap_or_else(|e| panic!("{}: {e}", k.name))
}

/// The largest `|got - want|` over an array's elements ([`max_abs_diff`]); a NaN
/// difference counts as infinite, so it survives a later `f64::max`.
pub fn max_error(got: &HostArray, want: &[f64]) -> f64 {
    let (err, _) = max_abs_diff(&got.to_f64_vec(), want);
    if err.is_nan() {
        f64::INFINITY
    } else {
        err
    }
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

/// A scratch directory of a test, removed when dropped.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("tessera-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    pub fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }

    pub fn save(&self, name: &str, a: &HostArray) -> String {
        let p = self.path(name);
        write_npy(Path::new(&p), a).unwrap();
        p
    }

    /// The files in the directory (temporary files included).
    pub fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Asserts `out` is a failure with exactly one stderr line, `error: ...` containing `want`.
pub fn assert_one_line_error(args: &[String], out: &Output, want: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(out.status.code().is_some(), "{args:?}: killed by a signal");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
    assert!(
        lines[0].contains(want),
        "{args:?}: want `{want}` in {}",
        lines[0]
    );
}

/// Asserts `out` is a refusal as a user should see one: an exit status from 1 to 123 (not a
/// signal, not a timeout's), no panic or backtrace, at most 6 lines on stderr, the first
/// `error: ...` and the whole containing `want`.
pub fn assert_refused(what: &str, out: &Output, want: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    assert!(
        matches!(code, Some(1..=123)),
        "{what}: exit {code:?}\n{stderr}"
    );
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!stderr.contains(bad), "{what}: {stderr}");
    }
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        (1..=6).contains(&lines.len()),
        "{what}: {} lines\n{stderr}",
        lines.len()
    );
    assert!(lines[0].starts_with("error: "), "{what}: {stderr}");
    assert!(stderr.contains(want), "{what}: want `{want}` in\n{stderr}");
}

/// The train example's binary, which `cargo test` builds with the tests (beside them in
/// `target/<profile>/examples`).
pub fn train_example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let path = profile.join("examples").join("train");
    assert!(
        path.is_file(),
        "{} is not built; `cargo test` builds it (or `cargo build --example train`)",
        path.display()
    );
    path
}
