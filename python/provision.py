"""Installs tessera-jax into a venv: the pinned requirements (python/requirements.txt) into a
venv created on first use in tessera's cache, then the package itself from python/ (its Rust
extension built by maturin, through pip). Prints the venv's interpreter last.

    python3 python/provision.py            # the package built with cargo's dev profile
    python3 python/provision.py --release  # built optimised (what `pip install ./python` does)
    python3 python/provision.py --venv DIR # into the venv DIR (created if missing)

The venv is `$TESSERA_CACHE_DIR/jax-venv/<python version>-<hash of the requirements>`
(`TESSERA_CACHE_DIR` defaults to `$XDG_CACHE_HOME/tessera` or `~/.cache/tessera`, as for
tessera's PJRT plugins), so a change of the pins makes a new one. A file lock serialises
concurrent runs; a venv is used only once complete (a marker written last), so an
interrupted run is redone. `TESSERA_PYTHON` chooses the interpreter the venv is made from
(default: the one running this script). The dev profile shares the workspace's compiled
crates (maturin builds into its target directory).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
REQUIREMENTS = PACKAGE / "requirements.txt"
COMPLETE = ".tessera-jax-venv-complete"


def cache_root() -> Path:
    if os.environ.get("TESSERA_CACHE_DIR"):
        return Path(os.environ["TESSERA_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "tessera"
    return Path.home() / ".cache" / "tessera"


def base_python() -> str:
    return os.environ.get("TESSERA_PYTHON") or sys.executable


def default_venv() -> Path:
    version = subprocess.run(
        [base_python(), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    pins = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return cache_root() / "jax-venv" / f"py{version}-{pins}"


def run(command: list[str], what: str, env: dict | None = None) -> None:
    print(f"provision: {what}", file=sys.stderr, flush=True)
    done = subprocess.run(command, env=env, stdout=sys.stderr)
    if done.returncode != 0:
        sys.exit(f"provision: {what} failed (exit status {done.returncode}): {' '.join(command)}")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def create(venv: Path, cached: bool) -> None:
    """The venv with the pinned requirements. A `cached` venv (tessera's own) is made once
    and reused when complete, remade after an interrupted run; a venv the user names is
    created if missing and gets the requirements installed (pip skips those present)."""
    if cached and (venv / COMPLETE).exists():
        return
    if cached and venv.exists():
        shutil.rmtree(venv)  # an interrupted run's
    if not venv_python(venv).exists():
        run([base_python(), "-m", "venv", str(venv)], f"creating {venv}")
    pip = [str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run([*pip, "install", "-r", str(REQUIREMENTS)], f"installing {REQUIREMENTS.name}")
    if cached:
        (venv / COMPLETE).write_text(REQUIREMENTS.read_text())


def install(venv: Path, release: bool) -> None:
    """The package from python/, rebuilt (its sources may have changed)."""
    env = dict(os.environ)
    # The build backend runs the venv's `maturin` (no build isolation: it is pinned there).
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    if not release:
        env["MATURIN_PEP517_ARGS"] = "--profile dev"
    pip = [str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "--force-reinstall", str(PACKAGE)],
        f"building and installing tessera-jax ({'release' if release else 'dev'} profile)",
        env,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="store_true", help="build the extension optimised")
    parser.add_argument("--venv", type=Path, help="the venv to install into")
    a = parser.parse_args()
    venv = (a.venv or default_venv()).resolve()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        create(venv, cached=a.venv is None)
        install(venv, a.release)
    print(venv_python(venv))


if __name__ == "__main__":
    main()
