//! The tessera-jax package's tests, so that `cargo test --workspace` runs them, at both ends of
//! the JAX versions the package is tested with: jax 0.10.2 on Python 3.11 and the current
//! jax 0.12.0.1 on Python 3.12 (JAX needs Python >= 3.12 since 0.11). Each provisions its
//! pinned venv and installs the package into it (`python/provision.py` run by that Python:
//! python/requirements.txt or python/requirements-py3.12.txt, the extension built with the
//! dev profile into this workspace's target directory), then runs pytest on python/tests
//! (CPU: every registry kernel from JAX, splash attention and its gradients against dense
//! f64, the Ulysses layer on 4 virtual devices and on 2 processes x 2 devices; compile-only
//! for a v5p topology through JAX with the libtpu that JAX requires, provisioned by tessera).
//! Fails, never skips, when an interpreter is missing or a venv cannot be provisioned.

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

fn python_package_tests(python_version: &str, jax_version: &str) {
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
