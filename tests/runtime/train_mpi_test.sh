#!/bin/sh
# examples/train as real processes: FSDP x TP on 4 MPI processes, resumed as TP on 3; and
# the same job as 4 in-process threads writes the same values (ckpt-diff: every key, bit for bit).
# Usage: train_mpi_test.sh MPIEXEC TRAIN DIFF SCRATCH
set -eu
mpiexec=$1
train=$2
diff=$3
dir=$4/train-mpi-$$
mkdir -p "$4"
rm -rf "$dir"
trap 'rm -rf "$dir"' EXIT
export OPENBLAS_NUM_THREADS=1

"$mpiexec" --allow-run-as-root --oversubscribe -n 4 "$train" --mpi --strategy fsdp_tp --steps 20 \
  --save-every 10 --ckpt-dir "$dir/mpi" --log-every 10
"$train" --world 4 --strategy fsdp_tp --steps 20 --save-every 10 --ckpt-dir "$dir/threads" --log-every 10
# No tolerance: identical bits only; exit 1 on any difference in keys, dtypes, shapes or values.
"$diff" "$dir/mpi/step-00000020" "$dir/threads/step-00000020"

out=$("$mpiexec" --allow-run-as-root --oversubscribe -n 3 "$train" --mpi --strategy tp --steps 30 \
  --save-every 10 --ckpt-dir "$dir/mpi" --resume --log-every 10)
echo "$out"
echo "$out" | grep -q "resumed from $dir/mpi/step-00000020 at step 20 (saved SHARDED by 4 ranks)"
echo "$out" | grep -q "done at step 30"
echo "train under MPI: OK"
