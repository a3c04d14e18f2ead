#!/bin/sh
# run_interop.sh: the interop tests' driver. Works in a fresh directory under SCRATCH, removed
# when the test passed (kept for inspection otherwise).
#   run_interop.sh corpus PYTHON SCRATCH WRITER CHECKER SCHEMA [CHECKER-OPTION...]
#       libckpt's WRITER writes the corpus; CHECKER (h5py, jsonschema, xxhash) checks it.
#   run_interop.sh golden PYTHON SCRATCH WRITER READER [WRITER-OPTION...]
#       WRITER (h5py) writes golden checkpoints per FORMAT.md; libckpt's READER reads them.
#   run_interop.sh selftest PYTHON SCRATCH CHECKER SCHEMA
#       CHECKER's self test: it passes hand-made checkpoints and reports their corruptions.
set -u
mode=$1 python=$2 scratch=$3
shift 3
for m in h5py numpy jsonschema xxhash; do
  if ! "$python" -c "import $m" 2>/dev/null; then
    echo "interop: $python cannot import $m (apt-get install python3-h5py python3-numpy python3-jsonschema python3-xxhash)" >&2
    exit 1
  fi
done
mkdir -p "$scratch" || exit 1
dir=$(mktemp -d "$scratch/$mode.XXXXXX") || exit 1
case $mode in
  corpus)
    writer=$1 checker=$2 schema=$3
    shift 3
    "$writer" "$dir"
    wrc=$?
    [ $wrc -eq 0 ] || echo "interop: the corpus writer failed (exit $wrc)" >&2
    "$python" "$checker" corpus "$dir" "$schema" "$@" && [ $wrc -eq 0 ]
    ;;
  golden)
    writer=$1 reader=$2
    shift 2
    "$python" "$writer" "$@" "$dir" && "$reader" "$dir"
    ;;
  selftest)
    "$python" "$1" selftest "$dir" "$2"
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
