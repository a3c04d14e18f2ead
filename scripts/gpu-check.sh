#!/usr/bin/env bash
# scripts/gpu-check.sh: the GPU check, as a bundle built here and run on a GPU machine that has
# the CUDA 13 runtime, NCCL and a driver but not this repository's Debian packages.
#
#   scripts/gpu-check.sh build    (here) configure BUILD_DIR (build/gpu: Release, sm_90, CUDA and
#                                 NCCL on, MPI off), build the GPU tests, ckpt-gpu-bench,
#                                 ckpt-verify and ckpt-inspect (JOBS, 2, at nice 10), and
#                                 collect them into BUNDLE_DIR (build/gpu-bundle); prints its size
#   scripts/gpu-check.sh collect BUILD DEST
#                                 only the collecting, from any build tree with CUDA and NCCL on
#   scripts/gpu-check.sh run      (there) run the bundle: the same as bash build/gpu-bundle/run.sh
#
# The bundle: bin/ (stripped), lib/ (every shared library they load but glibc, libcuda,
# libcudart and libnccl; libstdc++ and libgcc_s in lib/gcc/, used only where the machine's are
# too old; libcudart in lib/cuda/, used only where the machine has none), golden/ (a zstd checkpoint that ckpt-verify checks without a device), run.sh
# (scripts/gpu-bundle-run.sh). At most 40 MiB. run.sh first checks with ldd that every library
# of every bundled file resolves, from the bundle or from the machine's glibc, CUDA runtime,
# NCCL and C++ runtime (nothing else, e.g. no HDF5 of the host's), then runs, each under a
# timeout, in under 4 minutes: unit_device_test, gpu_link_test, nccl_bootstrap_test, ckpt-verify
# of the golden checkpoint, gpu_cuda_test (device save/load bit-exact with the host, resharding
# device -> host -> device, reused pinned staging, SaveAsync from device memory, the stats
# kernel), gpu_nccl_test (NCCL collectives and a 1-rank NCCL save), gpu_nccl_multi_test (2+ GPUs
# only), ckpt-gpu-bench (staging D2H/H2D against cudaMemcpy's pinned bandwidth, Save/Load from
# device vs host memory, SaveAsync's blocked time from device memory against a sync Save, host
# statistics against the stats kernel), ckpt-verify and ckpt-inspect of the checkpoint the bench
# saved from device memory. Without a device the GPU steps report SKIPPED. No MPI: the NCCL
# tests bootstrap in-process (a file or a host Comm, threads for several GPUs), so neither
# mpirun nor libmpi is needed.
#
# On the lent device machine, one call of the device tool's `run`:
#   command: bash build/gpu-bundle/run.sh    carry: ["build/gpu-bundle"]    timeout_s: 300
# The log is written to $OUT/gpu-check.log (and printed). cuFile is not a data path of ckpt
# (docs/training.md, GPU): nothing to compare.
set -euo pipefail
cd "$(dirname "$0")/.."
max_bytes=$((40 << 20))
# Provided by the CUDA image and its driver, never bundled.
machine_libs=" $(echo linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 \
  libresolv.so.2 libutil.so.1 libcuda.so.1 libcudart.so.13 libnccl.so.2) "
bins=(tests/unit/unit_device_test tests/cuda/gpu_link_test tests/cuda/nccl_bootstrap_test tests/cuda/gpu_cuda_test
  tests/cuda/gpu_nccl_test tests/cuda/gpu_nccl_multi_test tests/cuda/ckpt-gpu-bench tools/ckpt-verify tools/ckpt-inspect)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

collect() {  # build-dir dest
  local build=$1 dest=$2 b lib path
  for b in "${bins[@]}"; do
    [ -x "$build/$b" ] || { echo "gpu-check: $build/$b is not built" >&2; return 1; }
  done
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/lib/gcc" "$dest/lib/cuda" "$dest/golden"
  for b in "${bins[@]}"; do
    cp "$build/$b" "$dest/bin/"
  done
  # Every library the binaries load, found as the build tree finds them (libckpt*.so there).
  while read -r lib path; do
    # The CUDA runtime (0.7 MiB) as a fallback; NCCL (over 200 MiB) must be the machine's.
    [ "$lib" = libcudart.so.13 ] && [ "$path" != not ] && cp -L "$path" "$dest/lib/cuda/$lib"
    [[ $machine_libs == *" $lib "* ]] && continue
    if [ "$path" = "not" ]; then
      echo "gpu-check: $lib not found (ldd over $build)" >&2
      return 1
    fi
    case $lib in
      libstdc++.so.6 | libgcc_s.so.1) cp -L "$path" "$dest/lib/gcc/$lib" ;;
      *) cp -L "$path" "$dest/lib/$lib" ;;
    esac
  done < <(for b in "${bins[@]}"; do LD_LIBRARY_PATH=$build/libckpt ldd "$build/$b"; done |
    awk '$2 == "=>" {print $1, $3}' | sort -u)
  chmod u+w "$dest"/bin/* "$dest"/lib/*.so* "$dest"/lib/gcc/* "$dest"/lib/cuda/*
  strip --strip-unneeded "$dest"/bin/* "$dest"/lib/libckpt*.so*
  cp -r tests/golden/v1/zstd_w2 "$dest/golden/"
  cp scripts/gpu-bundle-run.sh "$dest/run.sh"
  chmod +x "$dest/run.sh"
  local bytes glibc
  bytes=$(du -sb "$dest" | cut -f1)
  glibc=$(objdump -T "$dest"/bin/* "$dest"/lib/*.so* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  echo "bundle $dest: $(find "$dest" -type f | wc -l) files, $((bytes >> 20)) MiB ($bytes bytes; limit 40 MiB), needs ${glibc:-GLIBC_?} or newer"
  (cd "$dest" && ls -1 bin lib lib/gcc lib/cuda | paste -sd' ')
  if ((bytes > max_bytes)); then
    echo "gpu-check: the bundle is over 40 MiB" >&2
    return 1
  fi
}

build() {
  local dir=${BUILD_DIR:-build/gpu} dest=${BUNDLE_DIR:-build/gpu-bundle}
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
  fi
  # The binaries find their libraries beside them in the bundle ($ORIGIN/../lib), not in the
  # build tree; run.sh also sets LD_LIBRARY_PATH.
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCKPT_WERROR=ON -DCKPT_WITH_CUDA=ON -DCKPT_WITH_NCCL=ON \
    -DCKPT_WITH_MPI=OFF -DCKPT_WITH_PYTHON=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DCKPT_BUILD_BENCH=OFF \
    -DCKPT_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN/../lib" \
    "${launcher[@]}" >/dev/null
  local targets=() b
  for b in "${bins[@]}"; do
    targets+=("$(basename "$b")")
  done
  SECONDS=0
  nice -n 10 cmake --build "$dir" -j"${JOBS:-2}" --target "${targets[@]}"
  echo "== built in ${SECONDS} s"
  collect "$dir" "$dest"
}

case ${1:-} in
  build) build ;;
  collect)
    [ $# = 3 ] || { usage >&2; exit 2; }
    collect "$2" "$3" ;;
  run)
    shift
    exec bash "${BUNDLE_DIR:-build/gpu-bundle}/run.sh" "$@" ;;
  -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac
