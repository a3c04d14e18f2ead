#!/usr/bin/env python3
"""The four silent-corruption repros of issue 9, each of which must now be an error naming
the file (and the key, and the block, where the reader can know them) in a resharded Load
and in every tool that reads what was changed.

  repros.py --driver ckpt-flip-driver --bin-dir DIR --work DIR --case CASE

Cases (the checkpoint is the driver's fsdp2: 2 ranks, tensors split along dim 0):
  reshard  one float inside shard 0's data of model.embed changed (by byte offset, as h5py
           locates it); loads into 3 and 4 ranks by rows and 3 by columns read the chunk
           only in part. Load, ckpt-verify, ckpt-diff, ckpt-merge must each name
           shard-00000-of-00002.h5, model.embed and the block.
  scalar   metadata.json: the scalar step "value": 1 -> 0. Everything that reads
           metadata.json (Load, verify, inspect --stats, diff, merge) must refuse it by its
           digest, naming metadata.json.
  key      one bit of a key: metadata.json's entry model.layers.0.w -> model.laYers.0.w
           (refused by the metadata digest), and the same flip in shard 1's index record
           (rewritten with h5py: refused by the index digest, naming the shard).
  index    shard 0's ckpt_shard_index attribute rewritten with h5py, one chunk's offset +4:
           refused by the index digest by Load, verify, diff and merge, naming the shard.
Exit 0 when every expectation holds; 1 listing those that do not.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

SHARD0 = "shard-00000-of-00002.h5"
SHARD1 = "shard-00001-of-00002.h5"
LOADS = [("3", "rows"), ("4", "rows"), ("3", "cols")]
failures = []


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                       timeout=300)
    return r.returncode, r.stdout + r.stderr


def expect_error(what, cmd, must, any_of=()):
    """`cmd` must fail (exit 1, or 2 for ckpt-diff: its 1 means 'different') with output
    containing every string of `must` and (when given) one of `any_of`."""
    rc, out = run(cmd)
    allowed = (1, 2) if os.path.basename(cmd[0]) == "ckpt-diff" else (1,)
    # One line of the output must say it all (a problem reported elsewhere is not this one).
    best = None
    for line in out.splitlines() or [""]:
        missing = [m for m in must if m not in line]
        if any_of and not any(a in line for a in any_of):
            missing.append(" or ".join(any_of))
        if best is None or len(missing) < len(best):
            best = missing
    missing = best
    ok = rc in allowed and not missing
    print("%s %s: exit %s%s" % ("ok  " if ok else "FAIL", what, rc, "" if ok else ", missing %s" % missing))
    for line in out.strip().splitlines()[:3]:
        print("       " + line[:400])
    if not ok:
        failures.append(what)


def rewrite_index(path, edit):
    """Rewrites the ckpt_shard_index attribute of `path` through HDF5 (so HDF5's own
    checksums stay valid) with edit(index_dict) applied."""
    import h5py
    with h5py.File(path, "r+") as f:
        text = bytes(f.attrs["ckpt_shard_index"])
        doc = json.loads(text)
        edit(doc)
        new = json.dumps(doc, separators=(",", ":")).encode()
        del f.attrs["ckpt_shard_index"]
        f.attrs["ckpt_shard_index"] = np.bytes_(new)


def data_offset(path, key):
    """File offset of the data of `key`'s chunk in shard `path`, as h5py locates it: its own
    dataset's, or its pack's plus its pack_offset (FORMAT.md §5.7)."""
    import h5py
    with h5py.File(path, "r") as f:
        for rec in json.loads(bytes(f.attrs["ckpt_shard_index"]))["chunks"]:
            if rec["key"] == key:
                return f[rec["dataset"]].id.get_offset() + rec.get("pack_offset", 0)
    raise SystemExit("repros: no dataset of %s in %s" % (key, path))


def verify_cmd(args, path):
    return [os.path.join(args.bin_dir, "ckpt-verify"), *args.verify_args.split(), path]


def tools_on(args, intact, bad, must, any_of, inspect=False):
    b = args.bin_dir
    for world, split in LOADS:
        expect_error("Load into %s ranks by %s" % (world, split),
                     [args.driver, "load", "fsdp2", bad, world, split], must, any_of)
    expect_error("ckpt-verify", verify_cmd(args, bad), must, any_of)
    if inspect:
        expect_error("ckpt-inspect --stats", [os.path.join(b, "ckpt-inspect"), "--stats", bad], must, any_of)
    expect_error("ckpt-diff", [os.path.join(b, "ckpt-diff"), intact, bad], must, any_of)
    dst = bad + ".merged"
    expect_error("ckpt-merge", [os.path.join(b, "ckpt-merge"), bad, dst], must, any_of)
    if os.path.exists(dst):
        print("FAIL ckpt-merge committed %s" % dst)
        failures.append("ckpt-merge output")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", required=True, choices=["reshard", "scalar", "key", "index"])
    ap.add_argument("--verify-args", default="", help="extra arguments for ckpt-verify (split at spaces)")
    args = ap.parse_args()
    work = os.path.join(args.work, args.case)
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    intact = os.path.join(work, "intact")
    rc, out = run([args.driver, "write", "fsdp2", intact])
    if rc != 0:
        raise SystemExit("repros: writing the checkpoint failed: " + out)
    # The intact checkpoint passes, so that a refusal below is about the change made.
    rc, out = run(verify_cmd(args, intact))
    if rc != 0:
        raise SystemExit("repros: ckpt-verify fails on the intact checkpoint:\n" + out)
    for world, split in LOADS:
        rc, out = run([args.driver, "load", "fsdp2", intact, world, split])
        if rc != 0:
            raise SystemExit("repros: the intact checkpoint does not load:\n" + out)

    def copy(name):
        d = os.path.join(work, name)
        shutil.copytree(intact, d)
        return d

    if args.case == "reshard":
        bad = copy("bad")
        p = os.path.join(bad, SHARD0)
        # Element 49 = row 1, column 1 of model.embed: inside the part rank 0 of 3 or 4 loads
        # by rows, and of rank 0 of 3 by columns; the chunk (rows 0..31) is read only in part.
        at = data_offset(p, "model.embed") + 4 * 49
        with open(p, "r+b") as f:
            f.seek(at)
            f.write(np.float32(99.0).tobytes())
        tools_on(args, intact, bad, [SHARD0, "model.embed", "block"], ())
    elif args.case == "scalar":
        bad = copy("bad")
        p = os.path.join(bad, "metadata.json")
        text = open(p).read()
        new, n = re.subn(r'("step"\s*:\s*\{[^{}]*"value"\s*:\s*)1\b', r"\g<1>0", text)
        if n != 1:
            raise SystemExit("repros: no step scalar in metadata.json")
        open(p, "w").write(new)
        tools_on(args, intact, bad, ["metadata.json"], ("digest",), inspect=True)
    elif args.case == "key":
        bad = copy("bad")
        p = os.path.join(bad, "metadata.json")
        text = open(p).read()
        new = text.replace('"model.layers.0.w":', '"model.laYers.0.w":', 1)
        if new == text:
            raise SystemExit("repros: no entry model.layers.0.w in metadata.json")
        open(p, "w").write(new)
        print("-- key flipped in metadata.json")
        tools_on(args, intact, bad, ["metadata.json"], ("digest",), inspect=True)

        bad2 = copy("bad-index")

        def flip_key(doc):
            hits = [c for c in doc["chunks"] if c["key"] == "model.layers.0.w"]
            hits[0]["key"] = "model.laYers.0.w"
        rewrite_index(os.path.join(bad2, SHARD1), flip_key)
        print("-- key flipped in the index of " + SHARD1)
        tools_on(args, intact, bad2, [SHARD1], ("digest",))
    else:
        bad = copy("bad")

        def shift(doc):
            for c in doc["chunks"]:
                if c.get("key") == "model.embed" and "offset" in c:
                    c["offset"] += 4
                    return
            raise SystemExit("repros: no offset for model.embed in the index")
        rewrite_index(os.path.join(bad, SHARD0), shift)
        tools_on(args, intact, bad, [SHARD0], ("digest",))
    if failures:
        print("repros %s: %d expectations failed: %s" % (args.case, len(failures), ", ".join(failures)))
        return 1
    print("repros %s: all expectations hold" % args.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
