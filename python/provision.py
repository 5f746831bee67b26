"""Installs tessera-jax into a venv: the pinned requirements into a venv created on first use
in tessera's cache, then the package itself from python/ (its Rust extension built by
maturin, through pip). Prints the venv's interpreter last. The pins follow the interpreter:
python/requirements.txt (jax 0.10.2, the oldest JAX tessera-jax is tested with) on Python
3.11, python/requirements-py3.12.txt (jax 0.12.0.1, the current release, which needs Python
>= 3.12) on Python 3.12 and later.

    python3 python/provision.py            # the package built with cargo's dev profile
    python3 python/provision.py --release  # built optimised (what `pip install ./python` does)
    python3 python/provision.py --venv DIR # into the venv DIR (created if missing)

The venv is `$TESSERA_CACHE_DIR/jax-venv/<python version>-<hash of the requirements>`
(`TESSERA_CACHE_DIR` defaults to `$XDG_CACHE_HOME/tessera` or `~/.cache/tessera`, as for
tessera's PJRT plugins), so a change of the pins makes a new one. A file lock serialises
concurrent runs; a venv is used only once complete (a marker written last), so an
interrupted run is redone. `TESSERA_PYTHON` chooses the interpreter the venv is made from
(default: the one running this script): `TESSERA_PYTHON=python3.12 python3
python/provision.py` provisions the current-JAX venv. The dev profile shares the workspace's compiled
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
# The pins for each Python: the oldest (3.11, jax 0.10.2) and the current JAX (3.12 and later).
REQUIREMENTS_OLDEST = PACKAGE / "requirements.txt"
REQUIREMENTS_CURRENT = PACKAGE / "requirements-py3.12.txt"
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


def base_version() -> tuple[int, int]:
    """The (major, minor) version of the interpreter the venv is made from."""
    command = [base_python(), "-c", "import sys; print('%d %d' % sys.version_info[:2])"]
    try:
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"provision: cannot run the interpreter {base_python()!r} (TESSERA_PYTHON): {e}")
    major, minor = (int(x) for x in out.split())
    if (major, minor) < (3, 11):
        sys.exit(
            f"provision: tessera-jax needs Python >= 3.11, but {base_python()!r} is "
            f"{major}.{minor}; set TESSERA_PYTHON to a newer interpreter"
        )
    return major, minor


def requirements(version: tuple[int, int]) -> Path:
    """The pins for an interpreter of `version`."""
    return REQUIREMENTS_OLDEST if version < (3, 12) else REQUIREMENTS_CURRENT


def default_venv(version: tuple[int, int]) -> Path:
    pins = hashlib.sha256(requirements(version).read_bytes()).hexdigest()[:12]
    return cache_root() / "jax-venv" / f"py{version[0]}.{version[1]}-{pins}"


def run(command: list[str], what: str, env: dict | None = None) -> None:
    print(f"provision: {what}", file=sys.stderr, flush=True)
    done = subprocess.run(command, env=env, stdout=sys.stderr)
    if done.returncode != 0:
        sys.exit(f"provision: {what} failed (exit status {done.returncode}): {' '.join(command)}")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def create(venv: Path, cached: bool, pins: Path) -> None:
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
    run([*pip, "install", "-r", str(pins)], f"installing {pins.name}")
    if cached:
        (venv / COMPLETE).write_text(pins.read_text())


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
    version = base_version()
    venv = (a.venv or default_venv(version)).resolve()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        create(venv, cached=a.venv is None, pins=requirements(version))
        install(venv, a.release)
    print(venv_python(venv))


if __name__ == "__main__":
    main()
