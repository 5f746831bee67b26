#!/usr/bin/env bash
# Paged attention and the in-kernel all-gather by libtpu's own measure (compile-only, no TPU):
# JAX's Pallas kernels (jax[tpu]==0.10.2, pinned, in a venv) beside tessera's at the same
# sizes, read from libtpu's bundles by one reader (tessera::tpu::cost). Writes
# scripts/memory_cost.json. Usage: scripts/memory_cost.sh   (a few minutes)
# The venv: $TESSERA_JAX_VENV, default ~/.cache/tessera/jax-tpu-0.10.2 (made on first use, as
# scripts/splash_cost.sh makes it). $TESSERA names a tessera binary to use instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TESSERA_JAX_VENV:-$HOME/.cache/tessera/jax-tpu-0.10.2}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import jax; assert jax.__version__ == "0.10.2"' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "jax[tpu]==0.10.2"
fi
if [ -z "${TESSERA:-}" ]; then
  cargo build -q --release --bin tessera
  export TESSERA="${CARGO_TARGET_DIR:-target}/release/tessera"
fi
exec "$venv/bin/python" scripts/memory_cost.py "$@"
