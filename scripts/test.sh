#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds with warnings as errors, runs
# every test through CTest, then builds again with AddressSanitizer + UndefinedBehavior-
# Sanitizer and runs the suite once more. CKPT_SKIP_SANITIZE=1 skips the second pass.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)

run_suite() {  # build-dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCKPT_WERROR=ON -DCKPT_BUILD_BENCH=OFF "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
  ctest --test-dir "$dir" -j"$jobs" --output-on-failure --timeout 900
}

echo "== build and test (RelWithDebInfo, -Werror)"
run_suite build/test -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ "${CKPT_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== build and test under AddressSanitizer + UndefinedBehaviorSanitizer"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp
  run_suite build/asan -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=ON
fi
