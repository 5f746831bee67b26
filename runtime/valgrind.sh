#!/usr/bin/env bash
# Runs tessera-runtime's FFI test binaries under valgrind memcheck. Fails on any memory error
# (invalid read/write/free, use of uninitialised values outside the suppressed plugin-internal
# protobuf noise, see valgrind.supp) and on any definitely lost block.
#
#   runtime/valgrind.sh                 # execute, collectives, topology, fake_plugin, plugin_override, donation
#   runtime/valgrind.sh collectives     # chosen test binaries
#
# Honours CARGO_TARGET_DIR. Each binary first runs natively (which also provisions the plugin,
# so pip and the unzip do not run under valgrind), then under valgrind with one test thread,
# without the libtpu tests (a 690 MB compiler under memcheck takes hours; the compile-only FFI
# they use is also exercised on the CPU plugin by `execute`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(execute collectives topology fake_plugin plugin_override donation)
fi
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 2; }
cd "$here"
# The binaries run outside cargo, so the environment of ../.cargo/config.toml (libtpu's
# compile-only variables) is set here.
export TPU_SKIP_MDS_QUERY=1 ALLOW_MULTIPLE_LIBTPU_LOAD=1 TPU_WORKER_HOSTNAMES=localhost \
  TPU_ACCELERATOR_TYPE=v5p-8
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
mapfile -t bins < <(cargo test -p tessera-runtime "${args[@]}" --no-run --message-format=json \
  | grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
[ ${#bins[@]} -gt 0 ] || { echo "no test binaries built" >&2; exit 2; }
logs="${TMPDIR:-/tmp}/tessera-valgrind"
mkdir -p "$logs"
status=0
for bin in "${bins[@]}"; do
  log="$logs/$(basename "$bin").log"
  echo "== native: $bin"
  "$bin" --test-threads=1 -q >/dev/null 2>&1 || { echo "native run failed: $bin" >&2; exit 1; }
  echo "== valgrind: $bin (log: $log)"
  rc=0
  valgrind --error-exitcode=1 --leak-check=full --show-leak-kinds=definite \
    --errors-for-leak-kinds=definite --suppressions="$here/valgrind.supp" --num-callers=40 \
    "$bin" --test-threads=1 --skip libtpu >"$log" 2>&1 || rc=$?
  grep -E '^==[0-9]+== +(ERROR SUMMARY|definitely lost|possibly lost)|^test result' "$log" || true
  if [ "$rc" -ne 0 ]; then
    echo "valgrind FAILED (exit $rc): $bin, see $log" >&2
    status=1
  fi
done
if [ $status -eq 0 ]; then echo "valgrind: clean (${#bins[@]} test binaries)"; fi
exit $status
