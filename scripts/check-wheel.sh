#!/usr/bin/env bash
# scripts/check-wheel.sh [WHEEL]: the wheel of scripts/build-wheel.sh (default dist/ckpt-*.whl)
# runs on a machine without Debian's HDF5 (and zstd, xxhash, ... : whatever it bundles).
# Installs it into a fresh venv, build/wheel-fresh (pip: the wheel, numpy and pytest, nothing
# else: no torch), then, in a private mount namespace (unshare -m: root) where /dev/null is
# bound over every libhdf5* file of the system and over the system's copy of each library in
# the wheel's ckpt.libs, runs scripts/wheel_check.py and tests/python/test_api.py there with
# LD_LIBRARY_PATH empty (test_api.py's S3 tests reach libcurl: the wheel's copy). As a control, the same namespace must refuse to import a ckpt built
# against the system's libraries (CKPT_CHECK_CONTROL=<python with such a ckpt>, optional).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=${1:-$(ls dist/ckpt-*.whl)}
py=${CKPT_VENV:-$HOME/.cache/ckpt-venv}/bin/python
fresh=build/wheel-fresh
rm -rf "$fresh"
"$py" -m venv "$fresh"
"$fresh/bin/python" -m pip install -q "$wheel" pytest
libs=$("$fresh/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/ckpt.libs
sysdir=/usr/lib/x86_64-linux-gnu
hide=$(ls "$sysdir"/libhdf5* 2>/dev/null || true)
for f in "$libs"/*; do  # auditwheel's name: the system's with -<8 hex digits> inserted
  orig=$(basename "$f" | sed -E 's/-[0-9a-f]{8}//')
  [ -e "$sysdir/$orig" ] && hide="$hide $sysdir/$orig"
done
echo "== hiding $(echo $hide | wc -w) system files: $(for h in $hide; do basename "$h"; done | sort -u | tr '\n' ' ')"
export LD_LIBRARY_PATH=
# Built where libcurl and OpenSSL are found, the wheel has the S3 client: wheel_check.py insists.
export CKPT_WHEEL_EXPECT_S3=${CKPT_WHEEL_EXPECT_S3:-$(pkg-config --exists libcurl libcrypto && echo 1 || echo 0)}
unshare -m bash -euo pipefail -c '
  for h in '"$(echo $hide)"'; do mount --bind /dev/null "$(readlink -f "$h")"; done
  if [ -n "${CKPT_CHECK_CONTROL:-}" ]; then
    if "$CKPT_CHECK_CONTROL" -c "import ckpt" 2>/dev/null; then
      echo "control: a ckpt linked to the system libraries still imports: nothing is hidden" >&2; exit 1
    fi
    echo "== control: the system-linked ckpt ($CKPT_CHECK_CONTROL) does not import here"
  fi
  ldd "'"$fresh"'"/lib/python3*/site-packages/ckpt/_ckpt*.so | grep -E "hdf5|zstd|xxhash"
  "'"$fresh"'/bin/python" scripts/wheel_check.py
  "'"$fresh"'/bin/python" -m pytest -q -p no:cacheprovider tests/python/test_api.py
'
