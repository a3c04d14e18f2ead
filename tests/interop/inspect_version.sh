#!/bin/sh
# inspect_version.sh INSPECT DIR VERSION: `ckpt-inspect DIR` succeeds and reports the format
# version it read as vVERSION (its "format" line).
set -u
out=$("$1" "$2") || { echo "inspect_version: ckpt-inspect $2 failed (exit $?)" >&2; exit 1; }
if ! printf '%s\n' "$out" | grep -Eq "^format +v$3, "; then
  printf '%s\n' "$out" | head -3 >&2
  echo "inspect_version: ckpt-inspect does not report format v$3 for $2" >&2
  exit 1
fi
