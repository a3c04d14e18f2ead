#!/bin/sh
# bench/s3.sh: the object-storage benchmark (issue 30 §5). Builds ckpt-bench-s3 (a
# RelWithDebInfo tree with S3), installs boto3 and s3fs into the Python venv if missing, starts
# its own Ceph gateway (scripts/s3-gateway.sh, admin sockets on, OSD in RAM), runs
# bench/s3/s3bench.py (the same gpt2s bytes through boto3, ckpt 1 and 4 ranks, and DCP over
# s3fs; a table of seconds, requests, bytes and CPU per GB, and the ratios to boto3), then
# stops the gateway.
#
#   bench/s3.sh [s3bench.py options: --rounds N, --max-gb G, --part-mib P, --concurrency C, --only ...]
#
# Environment: CKPT_BENCH_BUILD (default build-s3bench), CKPT_BENCH_VENV (default
# ~/.cache/ckpt-venv: needs torch and numpy; boto3 and s3fs are added), CKPT_S3_GATEWAY_DIR
# (default $CKPT_BENCH_BUILD/gw), CKPT_S3_GATEWAY_PORT / _MON_PORT (default: the first free),
# CKPT_S3_GATEWAY_MEM_MIB (default: 2.5x the workload, at least 2048), CKPT_BUILD_JOBS (2).
# Memory: the OSD holds one contender's objects at a time (1.49 GB at full size) and each
# phase's process holds the tensors once or twice: about 6 GB at the peak. --max-gb G scales
# the workload down (the first gpt2s tensors up to G GB) where that does not fit.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${CKPT_BENCH_BUILD:-$repo/build-s3bench}
venv=${CKPT_BENCH_VENV:-$HOME/.cache/ckpt-venv}
jobs=${CKPT_BUILD_JOBS:-2}

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_BUILD_BENCH=ON -DCKPT_BUILD_TESTS=OFF \
    -DCKPT_WITH_PYTHON=OFF -DCKPT_WITH_CUDA=OFF -DCKPT_WITH_NCCL=OFF
fi
cmake --build "$build" -j "$jobs" --target ckpt-bench-s3
if ! "$venv/bin/python" -c "import boto3, s3fs, torch" 2>/dev/null; then
  echo "== adding boto3 and s3fs to $venv (PyPI)"
  # s3fs[boto3]: a boto3 matching the botocore that s3fs's aiobotocore pins (plain
  # "boto3 s3fs" beside a newer boto3 resolves to s3fs 0.4, which predates DCP's use).
  "$venv/bin/pip" install -q "s3fs[boto3]"
fi

max_gb=0
prev=""
for a in "$@"; do
  if [ "$prev" = --max-gb ]; then max_gb=$a; fi
  prev=$a
done
export CKPT_S3_GATEWAY_DIR=${CKPT_S3_GATEWAY_DIR:-$build/gw}
export CKPT_S3_GATEWAY_ADMIN_SOCKET=1
if [ -z "${CKPT_S3_GATEWAY_MEM_MIB:-}" ]; then
  CKPT_S3_GATEWAY_MEM_MIB=$(python3 -c "g = float('$max_gb') or 1.49; print(max(2048, int(g * 2.5e9 / 2**20)))")
  export CKPT_S3_GATEWAY_MEM_MIB
fi
eval "$("$repo/scripts/s3-gateway.sh" start)"
export AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION
trap '"$repo/scripts/s3-gateway.sh" stop' EXIT INT TERM
"$venv/bin/python" "$repo/bench/s3/s3bench.py" --bin "$build/bench/core/ckpt-bench-s3" \
  --gw-dir "$CKPT_S3_GATEWAY_DIR" --json "$build/s3bench-$(date -u +%Y%m%dT%H%M%SZ).jsonl" "$@"
