//! The tessera-jax package's tests, so that `cargo test --workspace` runs them: provisions the
//! pinned venv and installs the package into it (`python3 python/provision.py`, the
//! extension built with the dev profile into this workspace's target directory), then runs
//! pytest on python/tests (CPU: every registry kernel from JAX, splash attention and its
//! gradients against dense f64, the Ulysses layer on 4 virtual devices; compile-only for a
//! v5p topology through JAX with the libtpu tessera provisions). Fails, never skips, when the
//! venv cannot be provisioned.

use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn python_package_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var("TESSERA_PYTHON").unwrap_or_else(|_| "python3".into());
    let provisioned = Command::new(&python)
        .arg(root.join("python/provision.py"))
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{python} python/provision.py`: {e}"));
    assert!(
        provisioned.status.success(),
        "python/provision.py failed ({}); see its output above",
        provisioned.status
    );
    let stdout = String::from_utf8_lossy(&provisioned.stdout);
    let venv_python = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("python/provision.py printed no interpreter"))
        .trim()
        .to_string();
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
        "pytest failed ({status}); see its output above"
    );
}
