#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds with warnings as errors, runs
# every test through CTest, builds libckpt static (BUILD_SHARED_LIBS=OFF) and runs the
# consumer test against it, then builds again with AddressSanitizer + UndefinedBehavior-
# Sanitizer and runs the suite once more. CKPT_SKIP_SANITIZE=1 skips the last pass,
# CKPT_SKIP_STATIC=1 the static build. ccache is used when installed (install-deps.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths relative to the checkout, and no working directory in the hash: the static build
  # (build/static) then reuses the objects compiled for build/test.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
fi

run_suite() {  # build-dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCKPT_WERROR=ON -DCKPT_BUILD_BENCH=OFF "${launcher[@]}" "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
  ctest --test-dir "$dir" -j"$jobs" --output-on-failure --timeout 900
}

# libckpt alone (core, ops, MPI backend), static, with the same flags as build/test; then
# tests/consumer's find_package and pkg-config consumers against its installed package.
run_static() {
  local dir=build/static
  cmake -S . -B "$dir" -DBUILD_SHARED_LIBS=OFF -DCKPT_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCKPT_BUILD_TESTS=OFF -DCKPT_BUILD_TOOLS=OFF -DCKPT_BUILD_EXAMPLES=OFF -DCKPT_BUILD_BENCH=OFF \
    -DCKPT_BUILD_RUNTIME=OFF "${launcher[@]}" >/dev/null
  cmake --build "$dir" -j"$jobs"
  cmake -DBUILD_DIR="$dir" -DWORK_DIR="$PWD/$dir/consumer" -DPROJECT_DIR="$PWD/tests/consumer/project" \
    -P tests/consumer/consumer_test.cmake
}

echo "== build and test (RelWithDebInfo, -Werror)"
run_suite build/test -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ "${CKPT_SKIP_STATIC:-0}" != 1 ]; then
  echo "== static libckpt (BUILD_SHARED_LIBS=OFF): install and build a consumer against it"
  run_static
fi
if [ "${CKPT_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== build and test under AddressSanitizer + UndefinedBehaviorSanitizer"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp
  # Without the CUDA/NCCL backends: nvcc's objects and the CUDA runtime are not instrumented,
  # and the GPU tests skip here anyway. The device seam itself (unit_device_test, a fake
  # backend) is part of the core and runs under the sanitizers.
  run_suite build/asan -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=ON -DCKPT_WITH_CUDA=OFF -DCKPT_WITH_NCCL=OFF
fi
