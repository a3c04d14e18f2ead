#!/usr/bin/env bash
# Installs the Debian packages ckpt needs to build and test, if any are missing.
set -euo pipefail
packages=(
  build-essential cmake pkg-config ccache
  libhdf5-dev hdf5-tools nlohmann-json3-dev libzstd-dev libxxhash-dev doctest-dev libcli11-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
  python3-h5py python3-numpy python3-jsonschema python3-xxhash
  python3-venv python3-dev  # the Python package's venv (scripts/test.sh) and its headers
  hdf5-filter-plugin strace  # the suite must pass with Debian's HDF5 filter plugins present; fault injection
  libcurl4-openssl-dev libssl-dev  # the S3 client (CKPT_WITH_S3): HTTP, SigV4's hashes
  ceph-mon ceph-osd radosgw ceph-common uuid-runtime curl  # the S3 gateway of the tests (scripts/s3-gateway.sh)
  bindfs  # a real FUSE mount for fuse_mount_test (commits refused on FUSE, issue 30)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
