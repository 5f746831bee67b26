#!/usr/bin/env bash
# Long context on many chips: llama3.1-8b with the context axis over all 64 chips of a
# v5p:4x4x4 (global batch 1: --per-device-batch-size 0.015625), 64K and 128K tokens, every
# strategy, balanced or not, each compiled by libtpu (compile-only) with MaxText's defaults
# (bf16, the weights split over the context axis). One row per cell in scripts/usp_cells.tsv:
# the per-device memory libtpu reports, the state each device holds, the step-time model's
# prediction, or the sentence refusing the cell. Usage: scripts/usp_cells.sh   (about 1-2
# minutes a cell on 2 cores). $TESSERA names a tessera binary to use instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TESSERA:-}" ]; then
  cargo build -q --release --bin tessera
  TESSERA="${CARGO_TARGET_DIR:-target}/release/tessera"
fi
out=scripts/usp_cells.tsv
printf 'tokens\tstrategy\tload_balance\tper_device_GiB\tstate_GiB\ttemporaries_GiB\tcompile_s\tpredicted_step_s\tpredicted_mfu\tnote\n' > "$out"
for tokens in 65536 131072; do
  for cell in ulysses:false all_gather:false all_gather:true ring:false ring:true usp:4x16:false; do
    strategy=${cell%:*}
    balance=${cell##*:}
    echo "== $tokens tokens, $strategy, load balance $balance" >&2
    set +e
    line=$("$TESSERA" compile --target tpu:v5p:4x4x4 train --model llama3.1-8b \
      --max-target-length "$tokens" --per-device-batch-size 0.015625 \
      --ici-context-parallelism 64 --context-parallel-strategy "$strategy" \
      --context-parallel-load-balance="$balance" --no-step-estimate 2>/tmp/usp_cell.err | tail -1)
    status=$?
    set -e
    TOKENS=$tokens STRATEGY=$strategy BALANCE=$balance STATUS=$status LINE="$line" \
      python3 - "$out" <<'EOF'
import json, os, sys
env = os.environ
row = [env["TOKENS"], env["STRATEGY"], env["BALANCE"]]
if env["STATUS"] != "0":
    err = open("/tmp/usp_cell.err").read().strip().splitlines()
    row += [""] * 6 + [(err[-1] if err else "exit " + env["STATUS"]).replace("\t", " ")]
else:
    d = json.loads(env["LINE"])
    gib = lambda b: f"{b / 2**30:.2f}"
    step, mfu = d.get("predicted_step_s"), d.get("predicted_mfu")
    row += [gib(d["per_device_bytes"]), gib(d["state_bytes_per_device"]), gib(d["temp_bytes"]),
            f"{d['compile_s']:.0f}",
            "" if step is None else f"{step:.3f}",
            "" if mfu is None else f"{mfu:.3f}",
            "" if step is not None else f"no prediction: {d.get('prediction', '')}"]
with open(sys.argv[1], "a") as f:
    f.write("\t".join(row) + "\n")
print("\t".join(row))
EOF
  done
done
