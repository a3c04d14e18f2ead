#!/usr/bin/env bash
# gpu_bundle_test (CTest, label gpu-bundle): collects the GPU bundle of scripts/gpu-check.sh
# from this build tree and runs its run.sh in a bare environment (env -i: no LD_LIBRARY_PATH,
# no HDF5_PLUGIN_PATH). It must start and find every library in the bundle or among the
# machine's glibc/CUDA/NCCL ones (run.sh fails on any other library resolved outside it, e.g.
# Debian's HDF5), pass the host-side steps (verifying a zstd checkpoint through the bundled
# HDF5, zstd and xxhash), and, where there is no GPU, report every GPU step SKIPPED.
# Where a private mount namespace can be made (unshare -m, as root), it runs the bundle once
# more with every copy on this machine of a library the bundle carries (HDF5, zstd, xxhash,
# curl, libstdc++, the fallback libcudart) made an empty file: the bundle must still pass, on
# its own copies.
# Usage: gpu_bundle_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
fail() {
  echo "gpu_bundle_test: $*" >&2
  exit 1
}
bare_run() {  # bundle log
  env -i PATH=/usr/bin:/bin HOME="$(dirname "$2")" TMPDIR="$(dirname "$2")" LOG="$2" BENCH_MIB=64 \
    bash "$1/run.sh" >/dev/null
}
if [ "${1:-}" = hidden ]; then  # (inside the namespace) hidden BUNDLE LOG
  n=0
  for f in "$2"/lib/*.so* "$2"/lib/gcc/*.so* "$2"/lib/cuda/*.so*; do
    for p in $(ldconfig -p | awk -v n="$(basename "$f")" '$1 == n {print $NF}'); do
      mount --bind /dev/null "$(readlink -f "$p")"
      n=$((n + 1))
    done
  done
  echo "hid $n copies on this machine of the bundle's libraries"
  bare_run "$2" "$3"
  exit
fi
src=$1 build=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
bash "$src/scripts/gpu-check.sh" collect "$build" "$work/bundle"
log=$work/gpu-check.log
check() {  # log rc
  cat "$1"
  [ "$2" = 0 ] || fail "run.sh exited $2"
  grep -q "^libraries: every one resolved" "$1" || fail "run.sh did not resolve its libraries"
  local s
  for s in unit_device_test gpu_link_test nccl_bootstrap_test verify-golden; do
    grep -qE "^$s +PASS" "$1" || fail "$s did not pass"
  done
  if ! nvidia-smi -L >/dev/null 2>&1; then
    for s in gpu_cuda_test gpu_nccl_test gpu_nccl_multi_test ckpt-gpu-bench; do
      grep -qE "^$s +SKIPPED" "$1" || fail "$s is not SKIPPED without a GPU"
    done
  fi
}
rc=0
bare_run "$work/bundle" "$log" || rc=$?
check "$log" "$rc"
: >"$work/probe"
if unshare -m --propagation private sh -c 'mount --bind /dev/null "$1"' _ "$work/probe" 2>/dev/null; then
  echo "== again, with this machine's copies of the bundled libraries hidden"
  mkdir -p "$work/hidden"
  rc=0
  unshare -m --propagation private bash "$0" hidden "$work/bundle" "$work/hidden/gpu-check.log" || rc=$?
  check "$work/hidden/gpu-check.log" "$rc"
  grep -q "using the bundle's lib/gcc" "$work/hidden/gpu-check.log" || fail "the bundle's libstdc++ was not used"
  grep -q "using the bundle's lib/cuda" "$work/hidden/gpu-check.log" || fail "the bundle's libcudart was not used"
else
  echo "(no private mount namespace here: the run with the machine's copies hidden is left out)"
fi
echo "gpu_bundle_test: OK"
