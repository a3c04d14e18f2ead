#!/bin/sh
# End to end through examples/train: train under FSDP on 4 ranks with checkpoints, then
# resume under tensor parallelism on 3 ranks; the resume must pick the latest checkpoint,
# keep training, and leave the last N checkpoints. Usage: train_example_test.sh TRAIN SCRATCH
set -eu
train=$1
dir=$2/train-example-$$
mkdir -p "$2"
rm -rf "$dir"
trap 'rm -rf "$dir"' EXIT

out=$("$train" --world 4 --strategy fsdp --steps 40 --save-every 10 --ckpt-dir "$dir" --keep 2 --log-every 20)
echo "$out"
echo "$out" | grep -q "saved $dir/step-00000040"
[ "$(cat "$dir/latest")" = "step-00000040" ]
[ "$(ls -d "$dir"/step-* | wc -l)" -eq 2 ]

out=$("$train" --world 3 --strategy tp --steps 60 --save-every 20 --ckpt-dir "$dir" --keep 2 --resume --log-every 20)
echo "$out"
echo "$out" | grep -q "resumed from $dir/step-00000040 at step 40 (saved SHARDED by 4 ranks)"
echo "$out" | grep -q "done at step 60"
[ "$(cat "$dir/latest")" = "step-00000060" ]

# Background saves: the same rotation, `latest` moved after each commit, timings recorded.
adir=$dir/async
out=$("$train" --world 4 --strategy fsdp --steps 40 --save-every 10 --ckpt-dir "$adir" --keep 2 --log-every 20 --async-save)
echo "$out"
echo "$out" | grep -q "saving $adir/step-00000040 in the background"
echo "$out" | grep -q "background saves committed"
[ "$(cat "$adir/latest")" = "step-00000040" ]
[ "$(ls -d "$adir"/step-* | wc -l)" -eq 2 ]
grep -q '"save_timings": {"mode":"async"' "$adir/step-00000040/metadata.json"
out=$("$train" --world 2 --strategy ddp --steps 50 --save-every 10 --ckpt-dir "$adir" --keep 2 --resume --async-save)
echo "$out"
echo "$out" | grep -q "resumed from $adir/step-00000040 at step 40"
[ "$(cat "$adir/latest")" = "step-00000050" ]

# Bad usage exits 2; a strategy the world cannot hold fails with 1 and a message.
if "$train" --resume >/dev/null 2>&1; then exit 1; else [ $? -eq 2 ]; fi
if "$train" --world 3 --strategy fsdp_tp --tp 2 2>"$dir/err"; then exit 1; fi
grep -q "does not divide the world size 3" "$dir/err"
echo "train example: OK"
