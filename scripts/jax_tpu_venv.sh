#!/usr/bin/env bash
# The Python of the venv the peer-measuring scripts run JAX in: jax[tpu]==0.12.0.1 (pinned,
# with its libtpu 0.0.50.1) in a Python 3.12 venv, made on first use with python3.12 from the
# PATH or pyenv's. Prints its interpreter's path.
# Usage: scripts/jax_tpu_venv.sh [REQUIREMENT...]   (pinned extras, e.g. tokamax==0.0.17,
# get a venv of their own beside it)
# The venv: $TESSERA_JAX_VENV, default ~/.cache/tessera/jax-tpu-0.12.0.1[+extras]. Used by
# cpu_twin.py and cpu_profile.py (on CPU; they set JAX_PLATFORMS=cpu) and by
# memory_cost.sh, splash_cost.sh and tokamax_cost.sh.
set -euo pipefail
suffix=""
for r in "$@"; do suffix="$suffix+$r"; done
venv="${TESSERA_JAX_VENV:-$HOME/.cache/tessera/jax-tpu-0.12.0.1$suffix}"
if [ ! -f "$venv/.complete" ] || ! "$venv/bin/python" -c 'import jax; assert jax.__version__ == "0.12.0.1"' 2>/dev/null; then
  # pyenv's shim answers `command -v python3.12` even where no 3.12 is selected; take it only
  # if it runs.
  python312=""
  if command -v python3.12 >/dev/null 2>&1 && python3.12 -c "" 2>/dev/null; then
    python312=$(command -v python3.12)
  else
    python312=$(ls "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12 2>/dev/null | tail -1 || true)
  fi
  if [ -z "$python312" ]; then
    echo "$0: jax 0.12 needs Python 3.12 (python3.12 on the PATH, or pyenv install 3.12); none was found" >&2
    exit 1
  fi
  "$python312" -m venv "$venv" >&2
  "$venv/bin/pip" install -q "jax[tpu]==0.12.0.1" "$@" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
