#!/bin/sh
# bench/python/run.sh: the Python benchmark in one command (issue 12). Builds ckpt's Python
# package and ckpt-bench-resave in a Release tree with the Python of scripts/test.sh's venv,
# then runs save_load.py (gpt2s by default: ckpt.save/load, the C++ API on the same bytes,
# torch.save, safetensors, DCP's FileSystemWriter and dcp.save through ckpt.torch), printing
# the machine's facts first. Arguments go to save_load.py (--workload many-small, --repeat N,
# --warm, --json FILE).
#
# Environment: CKPT_BENCH_PY_BUILD (build dir, default build-bench-python), CKPT_BENCH_DIR
# (scratch, default <build>/scratch; gpt2s needs ~9 GB free), CKPT_VENV (default
# ~/.cache/ckpt-venv: numpy, nanobind, safetensors, torch), CKPT_BUILD_JOBS.
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${CKPT_BENCH_PY_BUILD:-$repo/build-bench-python}
venv=${CKPT_VENV:-$HOME/.cache/ckpt-venv}
scratch=${CKPT_BENCH_DIR:-$build/scratch}
if [ ! -x "$venv/bin/python" ]; then
  echo "bench/python/run.sh: no venv at $venv (scripts/test.sh makes it)" >&2
  exit 2
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF -DCKPT_WITH_PYTHON=ON \
    "-DPython_EXECUTABLE=$venv/bin/python"
fi
cmake --build "$build" -j "${CKPT_BUILD_JOBS:-$(nproc)}" --target ckpt_python ckpt-bench-resave
mkdir -p "$scratch"
PYTHONPATH="$build/python" OMP_NUM_THREADS=1 exec "$venv/bin/python" "$repo/bench/python/save_load.py" \
  --dir "$scratch" --bin "$build" "$@"
