#!/usr/bin/env bash
# The main job, end to end, on a fresh machine: installs what is missing, builds, then
#   1. saves a checkpoint from 4 ranks and loads it back resharded into 3 ranks (quickstart);
#   2. trains a small model with 4 FSDP ranks, checkpointing, then resumes it under tensor
#      parallelism on 3 ranks (examples/train);
#   3. inspects and verifies the last checkpoint with the offline tools.
# Usage: scripts/demo.sh [WORK_DIR]   (default: a fresh temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=build/demo
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF -DCKPT_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
work=${1:-$(mktemp -d -t ckpt-demo.XXXXXX)}
mkdir -p "$work"
say() { if [ -t 1 ]; then printf '\n\033[1m== %s\033[0m\n' "$*"; else printf '\n== %s\n' "$*"; fi; }

say "1. save from 4 ranks, load resharded into 3 ranks"
"$build/examples/quickstart/ckpt-quickstart" "$work/quickstart"

say "2. train with 4 FSDP ranks, then resume with 3 tensor-parallel ranks"
train="$build/examples/train/train"
"$train" --world 4 --strategy fsdp --steps 200 --save-every 100 --ckpt-dir "$work/run" --log-every 50
"$train" --world 3 --strategy tp --steps 400 --save-every 100 --ckpt-dir "$work/run" --resume --log-every 50

last=$(ls -d "$work"/run/step-* | sort | tail -n 1)
say "3. ckpt-inspect and ckpt-verify on $last"
"$build/tools/ckpt-inspect" "$last" --key 'model.*'
"$build/tools/ckpt-verify" "$last"
echo
echo "demo: done; checkpoints are in $work"
