#!/bin/sh
# bench/runtime/run.sh: the runtime benchmark (issue 4). Run by bench/run.sh, or alone:
#
#   sh bench/runtime/run.sh            builds build-bench (Release) if needed, then runs
#
# Environment: CKPT_BENCH_BUILD (build dir, default build-bench), CKPT_BENCH_DIR (scratch,
# default <build>/scratch; needs ~700 MB), CKPT_BUILD_JOBS, CKPT_BENCH_RUNTIME_ARGS (extra
# flags for ckpt-bench-runtime, e.g. "--world 2 --strategy ddp").
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${CKPT_BENCH_BUILD:-$repo/build-bench}
scratch=${CKPT_BENCH_DIR:-$build/scratch}
bin=$build/bench/runtime/ckpt-bench-runtime
if [ ! -x "$bin" ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF
  fi
  cmake --build "$build" -j "${CKPT_BUILD_JOBS:-$(nproc)}" --target ckpt-bench-runtime
fi
# Ranks are threads: one BLAS thread per rank avoids oversubscribing the cores.
export OPENBLAS_NUM_THREADS=1
# shellcheck disable=SC2086
"$bin" --dir "$scratch/runtime" ${CKPT_BENCH_RUNTIME_ARGS:-}
