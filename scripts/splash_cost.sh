#!/usr/bin/env bash
# Splash attention's kernels by libtpu's own measure (compile-only, no TPU): JAX's splash
# (jax[tpu]==0.10.2, pinned, in a venv) beside tessera's at the same configurations, read from
# libtpu's bundles by one reader (tessera::tpu::cost). Writes scripts/splash_cost.jax.tsv,
# scripts/splash_cost.tessera.tsv and scripts/splash_cost.ratios.tsv (tessera / JAX).
# Usage: scripts/splash_cost.sh [--quick] [--only jax|tessera]   (about an hour on 2 cores)
# The venv: $TESSERA_JAX_VENV, default ~/.cache/tessera/jax-tpu-0.10.2 (made on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TESSERA_JAX_VENV:-$HOME/.cache/tessera/jax-tpu-0.10.2}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import jax; assert jax.__version__ == "0.10.2"' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "jax[tpu]==0.10.2"
fi
cargo build -q --release --bin tessera
TESSERA="${CARGO_TARGET_DIR:-target}/release/tessera" exec "$venv/bin/python" scripts/splash_cost.py "$@"
