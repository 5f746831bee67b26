#!/usr/bin/env bash
# tokamax 0.0.17's splash forward with its causal-diagonal skip by libtpu's own measure
# (compile-only, no TPU), without and with residuals, beside tessera's forward in
# scripts/splash_cost.tessera.tsv: see scripts/tokamax_cost.py. Writes
# scripts/tokamax_cost.tsv. Usage: scripts/tokamax_cost.sh [--residuals] (about 15 minutes
# on 2 cores; --residuals: only the rows with residuals, about 7). The venv:
# scripts/jax_tpu_venv.sh tokamax==0.0.17.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/jax_tpu_venv.sh tokamax==0.0.17)
cargo build -q --release --bin tessera
TESSERA="${CARGO_TARGET_DIR:-target}/release/tessera" exec "$python" scripts/tokamax_cost.py "$@"
