#!/usr/bin/env bash
# Splash attention's kernels by libtpu's own measure (compile-only, no TPU): JAX's splash
# (jax[tpu]==0.12.0.1, pinned, with its libtpu 0.0.50.1, tessera's default) beside tessera's at
# the same configurations, read from libtpu's bundles by one reader (tessera::tpu::cost).
# Writes scripts/splash_cost.jax.tsv, scripts/splash_cost.tessera.tsv and
# scripts/splash_cost.ratios.tsv (tessera / JAX).
# Usage: scripts/splash_cost.sh [--quick] [--only jax|tessera]   (about an hour on 2 cores)
# The venv: scripts/jax_tpu_venv.sh ($TESSERA_JAX_VENV, default
# ~/.cache/tessera/jax-tpu-0.12.0.1, made on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/jax_tpu_venv.sh)
cargo build -q --release --bin tessera
TESSERA="${CARGO_TARGET_DIR:-target}/release/tessera" exec "$python" scripts/splash_cost.py "$@"
