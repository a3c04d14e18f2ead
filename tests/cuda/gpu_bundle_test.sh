#!/usr/bin/env bash
# gpu_bundle_test (CTest, label gpu-bundle): collects the GPU bundle of scripts/gpu-check.sh
# from this build tree and runs its run.sh in a bare environment (env -i: no LD_LIBRARY_PATH,
# no HDF5_PLUGIN_PATH). It must start and find every library in the bundle or among the
# machine's glibc/CUDA/NCCL ones (run.sh fails on any other library resolved outside it, e.g.
# Debian's HDF5), pass the host-side steps (verifying a zstd checkpoint through the bundled
# HDF5, zstd and xxhash), and, where there is no GPU, report every GPU step SKIPPED.
# Usage: gpu_bundle_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1 build=$2 work=$3
fail() {
  echo "gpu_bundle_test: $*" >&2
  exit 1
}
rm -rf "$work"
mkdir -p "$work"
bash "$src/scripts/gpu-check.sh" collect "$build" "$work/bundle"
log=$work/gpu-check.log
rc=0
env -i PATH=/usr/bin:/bin HOME="$work" TMPDIR="$work" LOG="$log" BENCH_MIB=64 bash "$work/bundle/run.sh" >/dev/null || rc=$?
cat "$log"
[ "$rc" = 0 ] || fail "run.sh exited $rc"
grep -q "^libraries: every one resolved" "$log" || fail "run.sh did not resolve its libraries"
for s in unit_device_test gpu_link_test nccl_bootstrap_test verify-golden; do
  grep -qE "^$s +PASS" "$log" || fail "$s did not pass"
done
if ! nvidia-smi -L >/dev/null 2>&1; then
  for s in gpu_cuda_test gpu_nccl_test gpu_nccl_multi_test ckpt-gpu-bench; do
    grep -qE "^$s +SKIPPED" "$log" || fail "$s is not SKIPPED without a GPU"
  done
fi
echo "gpu_bundle_test: OK"
