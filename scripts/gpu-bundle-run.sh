#!/usr/bin/env bash
# run.sh of the GPU bundle: `scripts/gpu-check.sh build` copies this file to
# build/gpu-bundle/run.sh beside the bundle's bin/ (the GPU tests, ckpt-gpu-bench, ckpt-verify,
# ckpt-inspect), lib/ (every shared library they load that a bare CUDA image lacks) and golden/
# (a zstd-compressed checkpoint to verify without a device). It runs them from the bundle on a
# machine that has the CUDA 13 runtime, NCCL and a driver but none of Debian's HDF5, zstd,
# xxhash, OpenBLAS or OpenMPI, each step under `timeout` inside a budget of BUDGET_S (200) s,
# and writes the log to $LOG, else $OUT/gpu-check.log, else ./gpu-check.log.
# Exit 0: every step passed or was SKIPPED (no device, or fewer devices than a test needs).
#
# On the lent device machine (the device tool's `run`, repository root, no network):
#   command: bash build/gpu-bundle/run.sh    carry: ["build/gpu-bundle"]    timeout_s: 300
# Env: BENCH_MIB (1024: the bench's state size), BUDGET_S (200), LOG.
#
# Libraries: LD_LIBRARY_PATH is the bundle's lib/ only; libcudart.so.13, libnccl.so.2 and glibc
# come from the machine (found through ld.so.cache; where not, from the CUDA dirs or a Python's
# nvidia/*/lib wheels), libstdc++/libgcc_s from the machine where they are new enough, else from
# lib/gcc/; libcudart from lib/cuda/ where the machine has none. Every library any bundled file
# resolves outside the bundle must be one of those, else nothing runs. HDF5 loads no plugin from
# the machine: libckpt turns plugin loading off (H5PLset_loading_state) and registers its own
# zstd filter, and run.sh sets HDF5_PLUGIN_PRELOAD=:: for any HDF5 call before that.
set -uo pipefail
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log=${LOG:-${OUT:+$OUT/gpu-check.log}}
log=${log:-$PWD/gpu-check.log}
budget=${BUDGET_S:-200}
# What may resolve outside the bundle: glibc, the driver, the CUDA runtime, NCCL, and the
# machine's C++ runtime when it is new enough.
machine_libs=" $(echo linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 \
  libresolv.so.2 libutil.so.1 libcuda.so.1 libcudart.so.13 libnccl.so.2 libstdc++.so.6 libgcc_s.so.1) "

elves() { ls "$bundle"/bin/* "$bundle"/lib/*.so* "$bundle"/lib/gcc/*.so* "$bundle"/lib/cuda/*.so* 2>/dev/null; }
# ldd over every bundled file, kept in $scanned: "file: name => path" lines and the loader's
# complaints ("version ... not found").
scan() {
  local f
  scanned=$(for f in $(elves); do ldd "$f" 2>&1 | sed "s|^|${f#"$bundle"/}: |"; done)
}
# Every line but a resolved library ("name => /path (0x...)", "name (0x...)") is a problem:
# "not found", "version ... not found", "error while loading shared libraries: ...".
unresolved() { grep -vE ': ([^ ]+ => /[^ ]+|[^ ]+) \(0x[0-9a-f]+\)$' <<<"$scanned" | sort -u; }
resolved() { awk '$3 == "=>" && $4 ~ /^\// {print $1, $2, $4}' <<<"$scanned"; }

# Dirs that hold a library the machine's loader cannot find: CUDA's own, then Python wheels.
search_dirs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
      /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/local/lib; do
    [ -d "$d" ] && echo "$d"
  done
  local py
  for py in python3 /usr/bin/python3 /opt/conda/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" - <<'EOF' 2>/dev/null
import glob, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
seen = set()
for r in roots:
    for d in sorted(glob.glob(r + "/nvidia/*/lib")) + sorted(glob.glob(r + "/torch/lib")):
        if d not in seen:
            seen.add(d)
            print(d)
EOF
  done
}

libraries() {
  echo "== libraries"
  export LD_LIBRARY_PATH=$bundle/lib
  export HDF5_PLUGIN_PRELOAD=:: HDF5_PLUGIN_PATH=$bundle/no-hdf5-plugins
  scan
  if unresolved | grep -qE "libstdc\+\+|libgcc_s|GLIBCXX|CXXABI|GCC_"; then
    echo "the machine's libstdc++/libgcc_s are missing or too old: using the bundle's lib/gcc"
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$bundle/lib/gcc
    scan
  fi
  local name d dir added=0
  for name in $(unresolved | awk '$3 == "=>" {print $2}' | sort -u); do
    dir=""
    for d in $(search_dirs); do
      if [ -s "$d/$name" ]; then
        dir=$d
        break
      fi
    done
    if [ -n "$dir" ]; then
      echo "$name: not in the loader's cache, found in $dir"
      LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$dir
      added=1
    fi
  done
  [ $added = 0 ] || scan
  if unresolved | grep -q "libcudart"; then
    echo "no usable libcudart.so.13 on the machine: using the bundle's lib/cuda"
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$bundle/lib/cuda
    scan
  fi
  if [ -n "$(unresolved)" ]; then
    echo "FAIL: libraries not found:"
    unresolved
    return 1
  fi
  # Anything loaded from outside the bundle must be one of the machine's libraries.
  local outside=0 file lib path
  while read -r file lib path; do
    case $path in
      "$bundle"/*) ;;
      *)
        if [[ $machine_libs != *" $lib "* ]]; then
          echo "FAIL: $file loads $lib from $path, outside the bundle"
          outside=1
        fi
        ;;
    esac
  done < <(resolved)
  echo "from the bundle: $(resolved | awk '{print $3}' | grep -c "^$bundle/" || true) resolutions of" \
    "$(resolved | awk '{print $3}' | grep "^$bundle/" | sort -u | wc -l) libraries"
  echo "from the machine:"
  resolved | awk '{print "  " $2 " => " $3}' | grep -v " $bundle/" | sort -u
  [ $outside = 0 ] || return 1
  echo "libraries: every one resolved, from the bundle or the machine's CUDA/NCCL/glibc/C++ runtime"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

facts() {
  echo "== machine ($(date -u +%FT%TZ))"
  echo "host $(cat /proc/sys/kernel/hostname) kernel $(uname -r) cores $(nproc) $(grep MemTotal /proc/meminfo)"
  grep -m1 "model name" /proc/cpuinfo || true
  [ -r /etc/os-release ] && grep PRETTY_NAME /etc/os-release
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max,clocks.max.sm \
      --format=csv 2>&1 || true
    nvidia-smi topo -m 2>/dev/null | head -5 || true
  else
    echo "no nvidia-smi here"
  fi
  df -h /dev/shm /tmp 2>/dev/null || true
  echo "bundle $bundle: $(du -sh "$bundle" | cut -f1)"
}

results=()
failed=0
step() {  # name limit-seconds command...
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit < 5)); then
    echo "== $name: not run, the ${budget} s budget is spent"
    results+=("$(printf '%-20s NOT RUN (budget spent)' "$name")")
    failed=1
    return
  fi
  echo "== $name (timeout ${limit} s): ${*#"$bundle"/}"
  local t0=$SECONDS rc=0 status
  timeout -k 5 "$limit" "$@" || rc=$?
  case $rc in
    0) status=PASS ;;
    77) status=SKIPPED ;;
    124 | 137) status="TIMEOUT after ${limit} s"; failed=1 ;;
    *) status="FAIL (exit $rc)"; failed=1 ;;
  esac
  echo "== $name: $status"
  results+=("$(printf '%-20s %s (%d s)' "$name" "$status" $((SECONDS - t0)))")
}

main() {
  SECONDS=0
  chmod +x "$bundle"/bin/* 2>/dev/null || true  # in case a copy lost the modes
  facts
  libraries || { echo "gpu-check: FAIL (libraries) in ${SECONDS} s"; return 1; }
  # Globals, for the EXIT trap: the tests' temp dirs and the bench's dir.
  work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-gpu-check.XXXXXX")
  bench_dir=$work
  trap 'rm -rf "$work" "$bench_dir"' EXIT
  export CKPT_TEST_TMP=$work/tests NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  local b=$bundle/bin mib=${BENCH_MIB:-1024}
  # Without a device: the host-side tests, and a checkpoint through HDF5 + zstd + xxhash.
  step unit_device_test 30 "$b/unit_device_test"
  step gpu_link_test 20 "$b/gpu_link_test"
  step nccl_bootstrap_test 30 "$b/nccl_bootstrap_test"
  step verify-golden 20 "$b/ckpt-verify" "$bundle/golden/zstd_w2"
  # On a device (SKIPPED, exit 77, without one; the multi test needs 2 GPUs).
  step gpu_cuda_test 60 "$b/gpu_cuda_test"
  step gpu_nccl_test 60 "$b/gpu_nccl_test"
  step gpu_nccl_multi_test 60 "$b/gpu_nccl_multi_test"
  # The bench on /dev/shm where it holds 3 states (an overwrite plus the kept one), else on disk.
  local avail
  avail=$(df -Pm /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
  if [ -n "$avail" ] && ((avail > 3 * mib + 256)); then
    bench_dir=$(mktemp -d /dev/shm/ckpt-gpu-check.XXXXXX)
  fi
  step ckpt-gpu-bench 120 "$b/ckpt-gpu-bench" --mib "$mib" --dir "$bench_dir" --keep "$bench_dir/kept"
  if [ -e "$bench_dir/kept/metadata.json" ]; then
    step verify-kept 60 "$b/ckpt-verify" --check-finite "$bench_dir/kept"
    step inspect-kept 20 "$b/ckpt-inspect" "$bench_dir/kept"
  fi
  echo "== summary"
  printf '%s\n' "${results[@]}"
  if [ $failed = 0 ]; then
    echo "gpu-check: OK in ${SECONDS} s"
  else
    echo "gpu-check: FAIL in ${SECONDS} s"
  fi
  return $failed
}

mkdir -p "$(dirname "$log")"
main "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "log: $log"
exit "$rc"
