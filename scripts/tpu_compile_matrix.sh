#!/usr/bin/env bash
# The full TPU compile matrix of splash attention and the context-parallel programs, through
# `tessera compile` (libtpu compile-only; provisioned on first use). CI runs a covering subset
# (tests/tpu_compile.rs); this runs every combination and prints one row per compile:
#   chip dtype blocks mask pass ok|FAIL seconds argument/output/temp bytes | first error line
# Usage: scripts/tpu_compile_matrix.sh [OUT.tsv]   (about 15 minutes on 2 cores)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-/dev/stdout}"
cargo build -q --bin tessera
tessera="${CARGO_TARGET_DIR:-target}/debug/tessera"
json_field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" <<<"$2"; }
run() {
  local label="$1"; shift
  local log rc last
  log="$("$tessera" compile "$@" 2>&1)"; rc=$?
  last="$(tail -n 1 <<<"$log")"
  if [ $rc -eq 0 ]; then
    printf '%s\tok\t%s\t%s\t%s\t%s\n' "$label" "$(json_field compile_seconds "$last")" \
      "$(json_field argument_bytes "$last")" "$(json_field output_bytes "$last")" \
      "$(json_field temp_bytes "$last")" >>"$out"
  else
    printf '%s\tFAIL\t%s\n' "$label" "$(grep -m1 -v '^\s*$' <<<"$log" | cut -c1-300)" >>"$out"
  fi
}
printf 'case\tresult\tcompile_s\targument_bytes\toutput_bytes\ttemp_bytes\n' >>"$out"
for chip in v5p:2x2x1 v5e:2x2; do
  for dtype in bf16 f32; do
    for blocks in 128:128 512:512 512:1024; do
      bq=${blocks%:*}; bkv=${blocks#*:}
      for mask in causal local:256:0 segments; do
        m=$mask; seg=()
        if [ "$mask" = segments ]; then m=causal; seg=(--segment-ids); fi
        common=(--target "tpu:$chip" attention --heads 2 --seq-len 2048 --dtype "$dtype"
                --mask "$m" --block-q "$bq" --block-kv "$bkv" "${seg[@]}")
        run "$chip $dtype $blocks $mask forward" "${common[@]}" --pass forward
        run "$chip $dtype $blocks $mask dq+dkv" "${common[@]}" --pass backward
        run "$chip $dtype $blocks $mask fused-bwd" "${common[@]}" --pass backward --fused-bwd
      done
    done
  done
  for strategy in ulysses all-gather ring usp:2x2; do
    for pass in forward backward; do
      run "$chip bf16 256:256 causal $strategy/4 $pass" --target "tpu:$chip" attention \
        --heads 4 --seq-len 4096 --block-q 256 --block-kv 256 --segment-ids \
        --strategy "$strategy" --devices 4 --pass "$pass"
    done
  done
done
