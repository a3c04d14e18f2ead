#!/bin/sh
# bench/run.sh: the one benchmark command. Builds a Release tree if needed, then runs the core
# benchmark (bench/core) and, when present, bench/tools/run.sh and bench/runtime/run.sh.
#
#   bench/run.sh                 scratch data under build-bench/scratch (on the repo's disk)
#   CKPT_BENCH_DIR=/mnt/x bench/run.sh    measure another disk (needs ~4.5 GB free)
#
# Environment: CKPT_BENCH_BUILD (build dir, default build-bench), CKPT_BENCH_DIR,
# CKPT_BUILD_JOBS (parallel build jobs, default nproc). Cold reads need root for drop_caches;
# otherwise the benchmark falls back to posix_fadvise and says so.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${CKPT_BENCH_BUILD:-$repo/build-bench}
scratch=${CKPT_BENCH_DIR:-$build/scratch}
jobs=${CKPT_BUILD_JOBS:-$(nproc)}

if [ -x "$repo/scripts/install-deps.sh" ] && [ ! -f "$build/CMakeCache.txt" ]; then
  "$repo/scripts/install-deps.sh"
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF
fi
cmake --build "$build" -j "$jobs"
export CKPT_BENCH_BUILD="$build" CKPT_BENCH_DIR="$scratch"

echo "== bench/core"
"$build/bench/core/ckpt-bench-core" --dir "$scratch"
echo
echo "== bench/core: the save's coordination (plan for simulated ranks; many small tensors)"
"$build/bench/core/ckpt-bench-plan" plan
"$build/bench/core/ckpt-bench-plan" save --dir "$scratch/plan"
echo
echo "== bench/core: metadata that scales (up to 16,384 simulated ranks x 1,000 tensors: minutes, ~1.5 GB of RAM)"
"$build/bench/core/ckpt-bench-scale" --ranks 64,256,1024,16384 --inspect "$build/tools/ckpt-inspect" --dir "$scratch/scale"
for sub in tools runtime; do
  if [ -f "$repo/bench/$sub/run.sh" ]; then
    echo
    echo "== bench/$sub"
    sh "$repo/bench/$sub/run.sh"
  fi
done
