#!/bin/sh
# run_interop.sh WRITER PYTHON CHECKER SCHEMA SCRATCH: writes the interop corpus into a fresh
# directory under SCRATCH, checks it with CHECKER, and removes it when everything passed
# (kept for inspection otherwise). Fails if the writer or the checker fails.
set -u
writer=$1 python=$2 checker=$3 schema=$4 scratch=$5
for m in h5py numpy jsonschema; do
  if ! "$python" -c "import $m" 2>/dev/null; then
    echo "interop: $python cannot import $m (apt-get install python3-h5py python3-numpy python3-jsonschema)" >&2
    exit 1
  fi
done
mkdir -p "$scratch" || exit 1
dir=$(mktemp -d "$scratch/corpus.XXXXXX") || exit 1
"$writer" "$dir"
wrc=$?
"$python" "$checker" corpus "$dir" "$schema"
crc=$?
if [ $wrc -ne 0 ]; then echo "interop: the corpus writer failed (exit $wrc)" >&2; fi
if [ $wrc -eq 0 ] && [ $crc -eq 0 ]; then
  rm -rf "$dir"
  exit 0
fi
echo "interop: corpus kept in $dir" >&2
exit 1
