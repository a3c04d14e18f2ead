#!/usr/bin/env bash
# scripts/gpu-check.sh: the GPU check, for a machine with an NVIDIA GPU (and the packages of
# scripts/install-deps.sh). Builds ckpt::cuda, ckpt::nccl and their tests with warnings as
# errors, runs every GPU test (device save/load bit-exact with the host, resharding device ->
# host -> device, reused pinned staging, the stats kernel, NCCL collectives and a 1-rank NCCL
# save; with 2+ GPUs NCCL across devices and a rank failing mid-save), then ckpt-gpu-bench:
# staging D2H/H2D against cudaMemcpy's pinned bandwidth, Save/Load from device vs host memory,
# SaveAsync's blocked time from device memory against a sync Save, statistics on the host
# against the stats kernel. cuFile is not a data path of ckpt (README, GPU section): nothing
# to compare. Meant to finish in under 5 minutes on a 16-core machine (each step is bounded
# by a timeout). BUILD_DIR (build/gpu), BENCH_MIB (1024).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build/gpu}
command -v nvidia-smi >/dev/null && nvidia-smi -L
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_WERROR=ON -DCKPT_WITH_CUDA=ON -DCKPT_WITH_NCCL=ON \
  -DCKPT_BUILD_BENCH=OFF -DCKPT_BUILD_EXAMPLES=OFF "${launcher[@]}" >/dev/null
targets=(unit_device_test gpu_link_test gpu_cuda_test gpu_nccl_test gpu_nccl_multi_test nccl_bootstrap_test ckpt-gpu-bench)
SECONDS=0
timeout 300 cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}"
echo "== built in ${SECONDS} s"
echo "== GPU tests"
ctest --test-dir "$dir" -R '^(unit_device_test|gpu_.*|nccl_bootstrap_test)$' --output-on-failure --timeout 300
echo "== ckpt-gpu-bench"
timeout 120 "$dir/tests/cuda/ckpt-gpu-bench" --mib "${BENCH_MIB:-1024}"
echo "== gpu-check done in ${SECONDS} s"
