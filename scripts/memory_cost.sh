#!/usr/bin/env bash
# Paged attention and the in-kernel all-gather by libtpu's own measure (compile-only, no TPU):
# JAX's Pallas kernels (jax[tpu]==0.12.0.1, pinned, with its libtpu 0.0.50.1, in a Python 3.12
# venv) beside tessera's at the same sizes, compiled by the same libtpu (tessera's default)
# and read from libtpu's bundles by one reader (tessera::tpu::cost). Writes
# scripts/memory_cost.json. Usage: scripts/memory_cost.sh   (a few minutes; seconds once built)
# The venv: $TESSERA_JAX_VENV, default ~/.cache/tessera/jax-tpu-0.12.0.1 (made on first use
# with python3.12 from the PATH or pyenv's). $TESSERA names a tessera binary to use instead
# of building.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TESSERA_JAX_VENV:-$HOME/.cache/tessera/jax-tpu-0.12.0.1}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import jax; assert jax.__version__ == "0.12.0.1"' 2>/dev/null; then
  python312=$(command -v python3.12 || ls "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12 2>/dev/null | tail -1 || true)
  if [ -z "$python312" ]; then
    echo "memory_cost.sh: jax 0.12 needs Python 3.12 (python3.12 on the PATH, or pyenv install 3.12); none was found" >&2
    exit 1
  fi
  "$python312" -m venv "$venv"
  "$venv/bin/pip" install -q "jax[tpu]==0.12.0.1"
fi
if [ -z "${TESSERA:-}" ]; then
  cargo build -q --release --bin tessera
  export TESSERA="${CARGO_TARGET_DIR:-target}/release/tessera"
fi
exec "$venv/bin/python" scripts/memory_cost.py "$@"
