#!/usr/bin/env bash
# Paged attention and the in-kernel all-gather by libtpu's own measure (compile-only, no TPU):
# JAX's Pallas kernels (jax[tpu]==0.12.0.1, pinned, with its libtpu 0.0.50.1, in a Python 3.12
# venv) beside tessera's at the same sizes, compiled by the same libtpu (tessera's default)
# and read from libtpu's bundles by one reader (tessera::tpu::cost). Writes
# scripts/memory_cost.json. Usage: scripts/memory_cost.sh   (a few minutes; seconds once built)
# The venv: scripts/jax_tpu_venv.sh ($TESSERA_JAX_VENV, default
# ~/.cache/tessera/jax-tpu-0.12.0.1, made on first use). $TESSERA names a tessera binary to use instead
# of building.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/jax_tpu_venv.sh)
if [ -z "${TESSERA:-}" ]; then
  cargo build -q --release --bin tessera
  export TESSERA="${CARGO_TARGET_DIR:-target}/release/tessera"
fi
exec "$python" scripts/memory_cost.py "$@"
