#!/bin/sh
# bench/run.sh: the one benchmark command (issue 10). Builds a Release tree if needed, makes
# the peers' venv if needed, then runs N interleaved rounds: one round of bench/core (raw,
# HDF5 C, ckpt), one of bench/core's MPI driver (gpt2s by 4 processes under mpirun: raw and
# ckpt) and one of bench/peers (safetensors, torch.save, DCP, merge) in turn, each timed phase
# from a dropped page cache; then bench/report.py prints the tables and targets.
#
#   bench/run.sh                          scratch under build-bench/scratch (on the repo's disk)
#   CKPT_BENCH_DIR=/mnt/x bench/run.sh    measure another disk (needs ~12 GB free: every gpt2s method's files are kept until its loads)
#
# Environment: CKPT_BENCH_BUILD (build dir, default build-bench), CKPT_BENCH_DIR,
# CKPT_BENCH_ROUNDS (default 5), CKPT_BENCH_VENV (default ~/.cache/ckpt-bench-venv: outside the
# repo, reused when present; numpy, h5py, safetensors and torch from PyPI, about 2 min and
# 4 GB for torch's wheels; CKPT_BENCH_TORCH=0 skips torch and its rows), CKPT_BENCH_PEERS=0
# (no peers), CKPT_BENCH_MPI=0 (not the 4-process rows, ckpt-bench-mpi under mpirun; skipped
# anyway where the build has no MPI backend or mpirun is not on PATH; with Open MPI it runs
# with --oversubscribe, shared-memory transport and, as root, --allow-run-as-root),
# CKPT_BENCH_SCALE=0 (not the metadata-scale benchmark, bench/core/bench_scale:
# 64 to 16,384 simulated ranks x 1,000 tensors, a few minutes and ~1.5 GB of RAM),
# CKPT_BENCH_EXTRA=1 (also the plan, tools and runtime benchmarks),
# CKPT_BUILD_JOBS (parallel build jobs, default nproc). Cold phases need root for
# drop_caches; otherwise the benchmark falls back to posix_fadvise and says so.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${CKPT_BENCH_BUILD:-$repo/build-bench}
scratch=${CKPT_BENCH_DIR:-$build/scratch}
jobs=${CKPT_BUILD_JOBS:-$(nproc)}
rounds=${CKPT_BENCH_ROUNDS:-5}
venv=${CKPT_BENCH_VENV:-$HOME/.cache/ckpt-bench-venv}

if [ -x "$repo/scripts/install-deps.sh" ] && [ ! -f "$build/CMakeCache.txt" ]; then
  "$repo/scripts/install-deps.sh"
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF
fi
cmake --build "$build" -j "$jobs"

peers=${CKPT_BENCH_PEERS:-1}
mpi=${CKPT_BENCH_MPI:-1}
mpi_bin=$build/bench/core/ckpt-bench-mpi
mpirun=$(command -v mpirun || true)
mpi_flags=""
if [ "$mpi" = 1 ] && { [ ! -x "$mpi_bin" ] || [ -z "$mpirun" ]; }; then
  echo "== no $mpi_bin (built without MPI) or no mpirun on PATH: the 4-process rows are skipped"
  mpi=0
fi
if [ "$mpi" = 1 ] && "$mpirun" --version 2>/dev/null | grep -q "Open MPI"; then
  # 4 ranks on fewer cores; shared memory without CMA (containers forbid it); the commit to the ranks.
  mpi_flags="--oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none -x CKPT_BENCH_COMMIT"
  if [ "$(id -u)" = 0 ]; then mpi_flags="--allow-run-as-root $mpi_flags"; fi
fi
if [ "$peers" = 1 ] && [ ! -x "$venv/bin/python" ]; then
  echo "== making the peers' venv at $venv (PyPI)"
  t0=$(date +%s)
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q numpy h5py safetensors
  if [ "${CKPT_BENCH_TORCH:-1}" = 1 ]; then
    "$venv/bin/pip" install -q torch || echo "torch did not install: its rows are skipped"
  fi
  echo "   venv ready in $(( $(date +%s) - t0 )) s"
fi

commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then commit="$commit+dirty"; fi
export CKPT_BENCH_COMMIT="$commit" CKPT_BENCH_BUILD="$build" CKPT_BENCH_DIR="$scratch"
mkdir -p "$scratch"
results="$scratch/results-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
echo "== $rounds interleaved rounds, commit $commit; results in $results"
i=0
while [ "$i" -lt "$rounds" ]; do
  "$build/bench/core/ckpt-bench-core" --dir "$scratch" --round-index "$i" --json "$results"
  if [ "$mpi" = 1 ]; then
    # shellcheck disable=SC2086  # mpi_flags: several words
    "$mpirun" $mpi_flags -np 4 "$mpi_bin" --dir "$scratch" --round-index "$i" --json "$results"
  fi
  if [ "$peers" = 1 ]; then
    only=safetensors,torch,dcp,merge
    [ "${CKPT_BENCH_TORCH:-1}" = 1 ] || only=safetensors,merge
    "$venv/bin/python" "$repo/bench/peers/peers.py" --dir "$scratch" --json "$results" --round "$i" \
      --bin "$build" --only "$only"
  fi
  i=$((i + 1))
done
echo
echo "== report"
python3 "$repo/bench/report.py" "$results"

if [ "${CKPT_BENCH_SCALE:-1}" = 1 ]; then
  echo
  echo "== bench/core: metadata that scales (up to 16,384 simulated ranks x 1,000 tensors)"
  "$build/bench/core/ckpt-bench-scale" --ranks 64,256,1024,16384 --inspect "$build/tools/ckpt-inspect" \
    --dir "$scratch/scale"
fi

if [ "${CKPT_BENCH_EXTRA:-0}" = 1 ]; then
  echo
  echo "== bench/core: the save's coordination (plan for simulated ranks; many small tensors)"
  "$build/bench/core/ckpt-bench-plan" plan
  "$build/bench/core/ckpt-bench-plan" save --dir "$scratch/plan"
  for sub in tools runtime; do
    if [ -f "$repo/bench/$sub/run.sh" ]; then
      echo
      echo "== bench/$sub"
      sh "$repo/bench/$sub/run.sh"
    fi
  done
fi
