#!/bin/sh
# bench/tools/run.sh: the tools benchmark (see bench.py). Run by bench/run.sh, or alone:
#   bench/tools/run.sh [--keys N] builds build-bench (Release) if needed; scratch in build-bench/scratch
# Environment: CKPT_BENCH_BUILD (build dir), CKPT_BENCH_DIR (scratch dir; needs ~6 GB free).
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${CKPT_BENCH_BUILD:-$repo/build-bench}
scratch=${CKPT_BENCH_DIR:-$build/scratch}
if [ ! -x "$build/tools/ckpt-merge" ] || [ ! -x "$build/bench/tools/ckpt-bench-tools-gen" ]; then
  [ -f "$build/CMakeCache.txt" ] || cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF
  cmake --build "$build" -j "${CKPT_BUILD_JOBS:-2}" --target ckpt-inspect ckpt-verify ckpt-merge ckpt-diff \
    ckpt-convert ckpt-bench-tools-gen
fi
exec /usr/bin/python3 "$repo/bench/tools/bench.py" --bin "$build/tools" \
  --gen "$build/bench/tools/ckpt-bench-tools-gen" --dir "$scratch" "$@"
