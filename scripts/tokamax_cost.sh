#!/usr/bin/env bash
# tokamax 0.0.17's splash by libtpu's own measure (compile-only, no TPU): its forward with its
# causal-diagonal skip, without and with residuals, and its fused backward as MaxText 0.2.5
# calls it and with the skip, beside tessera's in scripts/splash_cost.tessera.tsv: see
# scripts/tokamax_cost.py. Writes scripts/tokamax_cost.tsv. Usage: scripts/tokamax_cost.sh
# [--residuals | --fused] (about 40 minutes on 2 cores; --residuals: only the forward with
# residuals, about 7; --fused: only the fused backward, about 20). The venv:
# scripts/jax_tpu_venv.sh tokamax==0.0.17.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/jax_tpu_venv.sh tokamax==0.0.17)
cargo build -q --release --bin tessera
TESSERA="${CARGO_TARGET_DIR:-target}/release/tessera" exec "$python" scripts/tokamax_cost.py "$@"
