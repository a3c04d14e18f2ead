#!/bin/sh
# run_interop.sh: the interop tests' driver. Works in a fresh directory under SCRATCH, removed
# when the test passed (kept for inspection otherwise).
#   run_interop.sh corpus PYTHON SCRATCH WRITER CHECKER SCHEMA
#       libckpt's WRITER writes the corpus; CHECKER (h5py, jsonschema) checks it.
#   run_interop.sh golden PYTHON SCRATCH WRITER READER
#       WRITER (h5py) writes golden checkpoints per FORMAT.md; libckpt's READER reads them.
set -u
mode=$1 python=$2 scratch=$3
shift 3
for m in h5py numpy jsonschema; do
  if ! "$python" -c "import $m" 2>/dev/null; then
    echo "interop: $python cannot import $m (apt-get install python3-h5py python3-numpy python3-jsonschema)" >&2
    exit 1
  fi
done
mkdir -p "$scratch" || exit 1
dir=$(mktemp -d "$scratch/$mode.XXXXXX") || exit 1
case $mode in
  corpus)
    "$1" "$dir"
    wrc=$?
    [ $wrc -eq 0 ] || echo "interop: the corpus writer failed (exit $wrc)" >&2
    "$python" "$2" corpus "$dir" "$3" && [ $wrc -eq 0 ]
    ;;
  golden)
    "$python" "$1" "$dir" && "$2" "$dir"
    ;;
  *)
    echo "interop: unknown mode $mode" >&2
    false
    ;;
esac
rc=$?
if [ $rc -eq 0 ]; then
  rm -rf "$dir"
else
  echo "interop: files kept in $dir" >&2
fi
exit $rc
