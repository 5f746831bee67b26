#!/usr/bin/env bash
# Runs tessera-runtime's FFI test binaries under valgrind memcheck and fails on any memory error
# except uninitialised values that the PJRT plugin itself created and branches on (checked by
# their origin, see valgrind_check.py), and on any definitely lost block.
#
#   runtime/valgrind.sh                 # execute, collectives, topology, fake_plugin, plugin_override, donation
#   runtime/valgrind.sh collectives     # chosen test binaries
#   runtime/valgrind.sh --self-test     # only the check of the checker (seconds)
#
# First it checks the checker: a tiny fake plugin under a `pjrt-plugins/` directory and a
# program that calls it, built with the system C compiler, where the plugin branches on memory
# it allocated (must pass) and on memory the program hands it uninitialised (must fail).
#
# Honours CARGO_TARGET_DIR. Each binary first runs natively (which also provisions the plugin,
# so pip and the unzip do not run under valgrind), then under valgrind with one test thread,
# without the libtpu tests (a 690 MB compiler under memcheck takes hours; the compile-only FFI
# they use is also exercised on the CPU plugin by `execute`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
self_test_only=false
tests=()
for a in "$@"; do
  if [ "$a" = "--self-test" ]; then self_test_only=true; else tests+=("$a"); fi
done
if [ ${#tests[@]} -eq 0 ]; then
  tests=(execute collectives topology fake_plugin plugin_override donation)
fi
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 not found (it reads valgrind's XML report)" >&2; exit 2; }
logs="${TMPDIR:-/tmp}/tessera-valgrind"
mkdir -p "$logs"

memcheck() { # memcheck XML BINARY ARGS...: the client's exit status
  local xml="$1"
  shift
  valgrind --xml=yes --xml-file="$xml" --track-origins=yes --leak-check=full \
    --show-leak-kinds=definite --errors-for-leak-kinds=definite --num-callers=40 "$@"
}

echo "== self-test of the check"
st="$(mktemp -d "$logs/self-test.XXXXXX")"
mkdir -p "$st/pjrt-plugins"
cat >"$st/plugin.c" <<'EOF'
#include <stdlib.h>
int branch_on(const int* p) { return *p > 0 ? 1 : 2; }
int own_garbage(void) { int* p = malloc(sizeof(int)); int r = branch_on(p); free(p); return r; }
EOF
cat >"$st/main.c" <<'EOF'
#include <stdlib.h>
int branch_on(const int* p);
int own_garbage(void);
int main(int argc, char** argv) {
  int r = own_garbage();                 /* the plugin's own uninitialised value */
  if (argc > 1) {                        /* an uninitialised value handed to the plugin */
    int* p = malloc(sizeof(int)); r += branch_on(p); free(p);
    p = malloc(16); p = 0;               /* and a block definitely lost */
  }
  return r > 100;
}
EOF
cc="${CC:-cc}"
"$cc" -g -O0 -shared -fPIC -o "$st/pjrt-plugins/libfake.so" "$st/plugin.c"
"$cc" -g -O0 -o "$st/main" "$st/main.c" "$st/pjrt-plugins/libfake.so" -Wl,-rpath,"$st/pjrt-plugins"
memcheck "$st/clean.xml" "$st/main" >/dev/null 2>&1
python3 "$here/valgrind_check.py" "$st/clean.xml" >"$st/clean.txt" \
  || { cat "$st/clean.txt"; echo "self-test: the plugin's own uninitialised value was not accepted" >&2; exit 1; }
memcheck "$st/handed.xml" "$st/main" handed >/dev/null 2>&1
if python3 "$here/valgrind_check.py" "$st/handed.xml" >"$st/handed.txt"; then
  cat "$st/handed.txt"
  echo "self-test: an uninitialised value handed to the plugin was not reported" >&2
  exit 1
fi
grep -q "UninitCondition.*" "$st/handed.txt" && grep -q "main.c:7" "$st/handed.txt" \
  || { cat "$st/handed.txt"; echo "self-test: the report does not name the caller" >&2; exit 1; }
grep -q "Leak_DefinitelyLost" "$st/handed.txt" \
  || { cat "$st/handed.txt"; echo "self-test: a definitely lost block was not reported" >&2; exit 1; }
echo "self-test: the plugin's own uninitialised value accepted; one handed to it and a lost block reported"
rm -rf "$st"
if $self_test_only; then exit 0; fi

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
status=0
for bin in "${bins[@]}"; do
  name="$(basename "$bin")"
  log="$logs/$name.log"
  xml="$logs/$name.xml"
  echo "== native: $bin"
  "$bin" --test-threads=1 -q >/dev/null 2>&1 || { echo "native run failed: $bin" >&2; exit 1; }
  echo "== valgrind: $bin (log: $log, report: $xml)"
  rc=0
  memcheck "$xml" "$bin" --test-threads=1 --skip libtpu >"$log" 2>&1 || rc=$?
  grep -E '^test result' "$log" || true
  if [ "$rc" -ne 0 ]; then
    echo "the tests FAILED under valgrind (exit $rc): $bin, see $log" >&2
    status=1
  fi
  python3 "$here/valgrind_check.py" "$xml" || {
    echo "valgrind FAILED: $bin, see $xml" >&2
    status=1
  }
done
if [ $status -eq 0 ]; then echo "valgrind: clean (${#bins[@]} test binaries)"; fi
exit $status
