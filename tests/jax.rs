//! The tessera-jax package's tests, so that `cargo test --workspace` runs them, at both ends of
//! the JAX versions the package is tested with: jax 0.10.2 on Python 3.11 and the current
//! jax 0.12.0.1 on Python 3.12 (JAX needs Python >= 3.12 since 0.11). Each provisions its
//! pinned venv and installs the package into it (`python/provision.py` run by that Python:
//! python/requirements.txt or python/requirements-py3.12.txt, the extension built with the
//! dev profile into this workspace's target directory), then runs pytest on python/tests
//! (CPU: every registry kernel from JAX, splash attention and its gradients against dense
//! f64, the Ulysses layer on 4 virtual devices and on 2 processes x 2 devices; compile-only
//! for a v5p topology through JAX with the libtpu that JAX requires, provisioned by tessera).
//! The same jax 0.12.0.1 venv runs the CPU comparison scripts once, shortened
//! (`scripts/cpu_twin.py`, the train example against its JAX twin; `scripts/cpu_profile.py`,
//! the train step's time per op class), so that what docs/training.md reports from them keeps
//! running. Fails, never skips, when an interpreter is missing or a venv cannot be provisioned.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[test]
fn python_package_tests_on_jax_0_10_2_and_python_3_11() {
    python_package_tests("3.11", "0.10.2");
}

#[test]
fn python_package_tests_on_jax_0_12_0_1_and_python_3_12() {
    python_package_tests("3.12", "0.12.0.1");
}

/// `python{version}` on the PATH, else pyenv's (`$PYENV_ROOT`, default `~/.pyenv`), else a
/// failure saying how to provide it.
fn python(version: &str) -> PathBuf {
    let runs_as = |candidate: &Path| {
        Command::new(candidate)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == version
            })
    };
    let on_path = PathBuf::from(format!("python{version}"));
    if runs_as(&on_path) {
        return on_path;
    }
    let pyenv_root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    let mut installed: Vec<PathBuf> = pyenv_root
        .and_then(|root| std::fs::read_dir(root.join("versions")).ok())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(version)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .map(|e| e.path().join("bin").join(format!("python{version}")))
        .filter(|p| runs_as(p))
        .collect();
    installed.sort();
    installed.pop().unwrap_or_else(|| {
        panic!(
            "tessera-jax's tests need Python {version} (python{version} on the PATH, or \
             pyenv's: `pyenv install {version}`); none was found"
        )
    })
}

/// `python/provision.py` run by Python `python_version`: the path of its venv's interpreter,
/// checked to hold `jax_version`.
fn provisioned_venv(python_version: &str, jax_version: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = python(python_version);
    let provisioned = Command::new(&python)
        .arg(root.join("python/provision.py"))
        .env("TESSERA_PYTHON", &python)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{} python/provision.py`: {e}", python.display()));
    assert!(
        provisioned.status.success(),
        "python/provision.py with Python {python_version} failed ({}); see its output above",
        provisioned.status
    );
    let stdout = String::from_utf8_lossy(&provisioned.stdout);
    let venv_python = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("python/provision.py printed no interpreter"))
        .trim()
        .to_string();
    let jax = Command::new(&venv_python)
        .args([
            "-c",
            "from importlib.metadata import version; print(version('jax'))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {venv_python}: {e}"));
    assert_eq!(
        String::from_utf8_lossy(&jax.stdout).trim(),
        jax_version,
        "the venv of Python {python_version} ({venv_python}) has another JAX than its pins"
    );
    venv_python
}

fn python_package_tests(python_version: &str, jax_version: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv_python = provisioned_venv(python_version, jax_version);
    let status = Command::new(&venv_python)
        .args([
            "-m",
            "pytest",
            "python/tests",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
        ])
        .current_dir(root)
        .status()
        .unwrap_or_else(|e| panic!("cannot run pytest with {venv_python}: {e}"));
    assert!(
        status.success(),
        "pytest on jax {jax_version} (Python {python_version}) failed ({status}); see its \
         output above"
    );
}

/// Runs `python script args` in the workspace root; its stdout, after checking it succeeded.
fn run_script(python: &str, script: &str, args: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python)
        .arg(root.join("scripts").join(script))
        .args(args)
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {script} with {python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The number after `prefix` on the first line of `text` that starts with it.
fn number_after(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.trim_end_matches('x').parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` number in:\n{text}"))
}

#[test]
fn cpu_twin_and_profile_scripts_on_jax_0_12_0_1() {
    let python = provisioned_venv("3.12", "0.12.0.1");
    let dir = common::Dir::new("cpu-scripts");
    let step = dir.path("step.mlir");
    let train = common::train_example();
    let dumped = Command::new(&train)
        .args([
            "--steps",
            "1",
            "--dump-hlo",
            &step,
            "--plot",
            &dir.path("loss.svg"),
        ])
        .output()
        .unwrap();
    assert!(
        dumped.status.success(),
        "the train example failed: {}",
        String::from_utf8_lossy(&dumped.stderr)
    );

    // The tiny step's time per op class: it has matmuls and (Ulysses on 4 devices) collectives.
    let profile = run_script(
        &python,
        "cpu_profile.py",
        &["stablehlo", &step, "--runs", "1"],
    );
    for class in ["matmul", "collective", "elementwise"] {
        let ms = number_after(&profile, class);
        assert!(ms > 0.0, "{class} took {ms} ms in\n{profile}");
    }

    // One short round of the train example against its twin: both ran and gave a ratio.
    let twin = run_script(
        &python,
        "cpu_twin.py",
        &[
            "train",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--train-bin",
            train.to_str().unwrap(),
        ],
    );
    let ratio = number_after(&twin, "median over rounds: ratio");
    assert!(ratio.is_finite() && ratio > 0.0, "ratio {ratio} in\n{twin}");
}
