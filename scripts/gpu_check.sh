#!/usr/bin/env bash
# The GPU path, checked on a machine with an NVIDIA GPU and a CUDA PJRT plugin but no Rust and
# no registry (the lent GPU machine: its image has JAX with `jax-cuda13-pjrt`).
#
#   scripts/gpu_check.sh build    # here: release-builds what the run needs into target/gpu-check/
#   scripts/gpu_check.sh run      # there, from the checkout root with target/gpu-check/ copied
#                                 # in: runs the checks, logs into $OUT (default target/gpu-check/out)
#
# `run` finds the plugin (`TESSERA_GPU_PJRT_PLUGIN`, else the `xla_cuda_plugin.so` of the
# Python's `jax_plugins` packages) and runs, each with its own time limit and log:
#   1. `tessera demo --backend gpu`: every registered kernel against its f64 reference on the
#      GPU (cases needing more devices than the machine has are reported as skipped);
#   2. `tessera run matmul --backend gpu` on .npy inputs, checked against numpy in float64;
#   3. `tessera attention --backend gpu`, splash forward and backward (causal, H=4, S=512),
#      checked against a dense float64 attention written here with numpy;
#   4. the train example on one GPU (`--ici-context-parallelism 1`, 30 steps): the loss must
#      fall.
# It prints one summary line per check and exits non-zero when any check failed.
# `GPU_CHECK_BACKEND=cpu scripts/gpu_check.sh run` runs the same checks on the CPU plugin (a
# dry run of the script itself on a machine without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=target/gpu-check

build() {
  set -e
  cargo build --release --bin tessera --example train
  mkdir -p "$BUNDLE"
  cp target/release/tessera target/release/examples/train "$BUNDLE/"
  strip "$BUNDLE/tessera" "$BUNDLE/train"
  du -sh "$BUNDLE"
}

find_plugin() {
  if [ -n "${TESSERA_GPU_PJRT_PLUGIN:-}" ]; then
    echo "$TESSERA_GPU_PJRT_PLUGIN"
    return
  fi
  python3 - <<'EOF'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
found = sorted(p for r in roots for p in glob.glob(os.path.join(r, "jax_plugins", "*", "xla_cuda_plugin.so")))
if not found:
    sys.exit("no xla_cuda_plugin.so under " + ", ".join(roots))
print(found[-1])
EOF
}

FAILED=()
check() {  # check NAME LIMIT_S COMMAND...: runs COMMAND with its log in $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
    echo "ok      $name ($((SECONDS - start)) s)"
  else
    echo "FAILED  $name (exit $?, $((SECONDS - start)) s): last lines of $name.log:"
    tail -n 15 "$OUT/$name.log" | sed 's/^/    /'
    FAILED+=("$name")
  fi
}

run() {
  OUT=${OUT:-$BUNDLE/out}
  mkdir -p "$OUT"
  export TESSERA_CACHE_DIR="$OUT/cache"
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    python3 -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__)' || true
  } >"$OUT/machine.log" 2>&1
  cat "$OUT/machine.log"
  local backend=${GPU_CHECK_BACKEND:-gpu} plugin
  if [ "$backend" = gpu ]; then
    if ! plugin=$(find_plugin); then
      echo "FAILED  no CUDA PJRT plugin found; set TESSERA_GPU_PJRT_PLUGIN"
      return 1
    fi
    export TESSERA_GPU_PJRT_PLUGIN=$plugin
    echo "plugin  $plugin"
  else
    unset TESSERA_CACHE_DIR  # the CPU plugin from the usual cache
  fi
  local tessera=$BUNDLE/tessera

  check demo 300 "$tessera" demo --backend $backend

  local data=$OUT/data
  mkdir -p "$data"
  python3 - "$data" <<'EOF'
import sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
np.save(f"{d}/x.npy", rng.standard_normal((256, 512), dtype=np.float32))
np.save(f"{d}/y.npy", rng.standard_normal((512, 384), dtype=np.float32))
for name, heads in [("q", 4), ("k", 4), ("v", 4), ("dout", 4)]:
    np.save(f"{d}/{name}.npy", rng.standard_normal((1, heads, 512, 64), dtype=np.float32))
EOF
  check run_matmul 120 bash -c "'$tessera' run matmul -i '$data/x.npy' -i '$data/y.npy' \
      -o '$data/xy.npy' --backend $backend && python3 - '$data' <<'EOF'
import sys
import numpy as np
d = sys.argv[1]
x, y, got = (np.load(f'{d}/{n}.npy') for n in ('x', 'y', 'xy'))
err = np.abs(got.astype(np.float64) - x.astype(np.float64) @ y.astype(np.float64)).max()
print(f'matmul 256x512x384 on $backend: max |err| vs float64 numpy {err:.2e}')
sys.exit(0 if err < 1e-3 else 1)
EOF"

  check attention 180 bash -c "'$tessera' attention --q '$data/q.npy' --k '$data/k.npy' \
      --v '$data/v.npy' --mask causal --dout '$data/dout.npy' --out '$data/o.npy' \
      --lse '$data/lse.npy' --dq '$data/dq.npy' --dk '$data/dk.npy' --dv '$data/dv.npy' \
      --backend $backend --stats && python3 - '$data' <<'EOF'
import sys
import numpy as np
d = sys.argv[1]
q, k, v, do = (np.load(f'{d}/{n}.npy').astype(np.float64)[0] for n in ('q', 'k', 'v', 'dout'))
s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
m = s.max(-1, keepdims=True)
p = np.exp(s - m)
l = p.sum(-1, keepdims=True)
p /= l
o = p @ v
dv = p.transpose(0, 2, 1) @ do
dp = do @ v.transpose(0, 2, 1)
ds = p * (dp - (do * o).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
want = {'o': o, 'lse': (m + np.log(l))[..., 0], 'dq': ds @ k, 'dk': ds.transpose(0, 2, 1) @ q, 'dv': dv}
worst = 0.0
for name, w in want.items():
    err = np.abs(np.load(f'{d}/{name}.npy').astype(np.float64)[0] - w).max()
    worst = max(worst, err)
    print(f'splash {name} on $backend: max |err| vs dense float64 {err:.2e}')
sys.exit(0 if worst < 1e-3 else 1)
EOF"

  check train 300 bash -c "'$BUNDLE/train' --backend $backend --ici-context-parallelism 1 --steps 30 \
      --log-json '$OUT/train.jsonl' && python3 - '$OUT/train.jsonl' <<'EOF'
import json, sys
losses = [json.loads(line)['loss'] for line in open(sys.argv[1])]
print(f'train on one $backend device: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}')
sys.exit(0 if len(losses) == 30 and losses[-1] < losses[0] - 0.5 else 1)
EOF"

  if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu check: ${#FAILED[@]} failed: ${FAILED[*]} (logs in $OUT)"
    return 1
  fi
  echo "gpu check: every check passed (logs in $OUT)"
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  *)
    echo "usage: scripts/gpu_check.sh build|run" >&2
    exit 2
    ;;
esac
