#!/usr/bin/python3
"""Packed checkpoints (FORMAT.md §5.7) in ckpt-merge --virtual and in h5ls / h5py by name.

ckpt::Save packs chunks of at most 64 KiB into `.ckpt_pack.<n>` datasets by default, which
no virtual mapping can retype; `ckpt-merge --virtual` copies those chunks into the virtual
file and maps the rest. Checked on the default output of Save:
- the quickstart's (4 ranks; model.b packed, model.w mapped; the scalar 'step'),
- the training example's (every chunk packed; scalars and a bytes entry),
- a tensor with one packed and one mapped chunk (ckpt-convert --world 2 --pack-bytes), a
  bfloat16 one and keys that need escaping, read again after the file and the checkpoint
  are moved together;
for each: ckpt-verify passes on the source, h5ls lists every tensor and scalar key by its
(escaped) name, and h5py reads each one equal to what ckpt's own reader (ckpt-convert to
safetensors) and the writer's values give. `ckpt-merge SRC DIR` (no packs by default) is the
other way to see every key by name: ckpt-verify passes on it and h5ls lists its keys.

Run by CTest: virtual_packed_test.py --bin DIR [--quickstart EXE] [--train EXE]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_edit  # noqa: E402
from cli_test import check, finish, ST_DTYPES, read_safetensors, write_safetensors  # noqa: E402

def run(args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kw)


def escape(key):  # FORMAT.md §5.2
    out = key.replace("%", "%25").replace("/", "%2F").replace("@", "%40")
    return "%2E" + out[1:] if out.startswith(".") else out


def h5ls_names(path):
    p = run(["h5ls", path])
    check(p.returncode == 0, f"h5ls {path}: {p.stderr}")
    # h5ls prints "name   Dataset {...}"; a long name runs into the word with one space.
    return {line.rsplit(" Dataset ", 1)[0].strip() for line in p.stdout.splitlines() if " Dataset " in line}


def packed_records(ck):
    return [(k, r) for k, rs in ckpt_edit.chunks(ck).items() for r in rs if "pack_offset" in r]


def reference(tools, ck, tmp):
    """Every tensor of `ck` as ckpt's own reader gives it (ckpt-convert to safetensors):
    {key: (safetensors dtype, shape, bytes)}, and its scalar entries {key: value}."""
    st = os.path.join(tmp, os.path.basename(ck) + ".safetensors")
    p = run([tools("ckpt-convert"), ck, st, "--force"])
    check(p.returncode == 0, f"ckpt-convert {ck} to safetensors: {p.stdout}{p.stderr}")
    tensors, _ = read_safetensors(st) if p.returncode == 0 else ({}, {})
    md = ckpt_edit.load_metadata(ck)
    scalars = {k: json.loads(e["value"]) if isinstance(e["value"], str) else e["value"]
               for k, e in md["entries"].items() if e["type"] == "scalar"}
    return tensors, scalars


def check_virtual(tools, ck, tmp, label, expect_packed, extra=None):
    """--virtual on `ck`: h5ls and h5py see every tensor and scalar key, with ckpt's values."""
    p = run([tools("ckpt-verify"), ck])
    check(p.returncode == 0, f"{label}: ckpt-verify on the source: {p.stdout}{p.stderr}")
    packed = packed_records(ck)
    check(len(packed) >= expect_packed, f"{label}: the source has packed chunks ({len(packed)})")
    tensors, scalars = reference(tools, ck, tmp)
    vfile = os.path.join(tmp, label + ".h5")
    p = run([tools("ckpt-merge"), ck, vfile, "--virtual"])
    check(p.returncode == 0, f"{label}: ckpt-merge --virtual exits 0: {p.stdout}{p.stderr}")
    if p.returncode != 0:
        return None
    check(f"{len(packed)} packed chunk(s)" in p.stdout, f"{label}: merge notes the packed chunks copied: {p.stdout}")
    names = h5ls_names(vfile)
    want = {escape(k) for k in list(tensors) + list(scalars)}
    check(want <= names, f"{label}: h5ls lists every tensor and scalar key: missing {sorted(want - names)[:5]}")
    check(all(n in want or n.startswith(".ckpt_chunk.") for n in names), f"{label}: h5ls lists no other names")
    with h5py.File(vfile, "r") as h:
        for key, (dt, shape, data) in tensors.items():
            ds = h[escape(key)]
            arr = ds[()]
            check(arr.shape == tuple(shape) and arr.dtype == np.dtype(ST_DTYPES[dt]) and arr.tobytes() == data,
                  f"{label}: h5py reads '{key}' as ckpt does ({arr.dtype} {arr.shape})")
        for key, v in scalars.items():
            check(h[escape(key)][()] == v, f"{label}: h5py reads scalar '{key}' = {v}")
        if extra:
            extra(h)
    return vfile


def test_quickstart(tools, quickstart, tmp):
    ck = os.path.join(tmp, "quickstart")
    p = run([quickstart, ck])
    check(p.returncode == 0, f"ckpt-quickstart: {p.stdout}{p.stderr}")

    def values(h):  # the quickstart's own formula, and which datasets are mapped
        rows, cols = 1024, 768
        w = ((np.arange(rows)[:, None] * cols + np.arange(cols)[None, :]).astype(np.float32)
             * np.float32(1e-3))
        check(np.array_equal(h["model.w"][()], w), "quickstart: model.w as saved")
        check(np.array_equal(h["model.b"][()], np.full(cols, 0.5, np.float32)), "quickstart: model.b as saved")
        check(h["step"][()] == 100, "quickstart: step = 100")
        check(h["model.w"].is_virtual and not h["model.b"].is_virtual,
              "quickstart: model.w maps the shards, the packed model.b is copied")

    check_virtual(tools, ck, tmp, "quickstart", 1, values)
    # The other way to every key by name: a merged checkpoint has no packs by default.
    full = os.path.join(tmp, "quickstart-full")
    p = run([tools("ckpt-merge"), ck, full])
    check(p.returncode == 0 and run([tools("ckpt-verify"), full]).returncode == 0,
          f"quickstart: ckpt-merge to a checkpoint, which verifies: {p.stdout}{p.stderr}")
    shard = os.path.join(full, ckpt_edit.load_metadata(full)["files"][0]["name"])
    check({"model.w", "model.b"} <= h5ls_names(shard) and not packed_records(full),
          f"quickstart: h5ls lists the merged checkpoint's keys, unpacked: {h5ls_names(shard)}")


def test_train(tools, train, tmp):
    root = os.path.join(tmp, "train")
    p = run([train, "--world", 2, "--strategy", "fsdp", "--steps", 2, "--save-every", 2, "--ckpt-dir", root])
    check(p.returncode == 0, f"train: {p.stdout}{p.stderr}")
    steps = sorted(d for d in os.listdir(root) if d.startswith("step-")) if os.path.isdir(root) else []
    check(len(steps) == 1, f"train wrote one checkpoint: {steps}")
    if steps:
        check_virtual(tools, os.path.join(root, steps[0]), tmp, "train", 20)


def test_mixed(tools, tmp):
    """One tensor with a packed and a mapped chunk; bfloat16; keys that need escaping."""
    rng = np.random.default_rng(6)
    st = os.path.join(tmp, "mixed.safetensors")
    src = {
        "mix": ("F32", rng.standard_normal((3, 5462)).astype(np.float32)),  # rows 2 + 1: 43.7 + 21.8 KB
        "layers/0.bf": ("BF16", rng.integers(0, 1 << 16, (4, 8), dtype=np.uint16)),
        ".hidden@x": ("I32", np.arange(10, dtype=np.int32)),
    }
    write_safetensors(st, src)
    ck = os.path.join(tmp, "mixed")
    p = run([tools("ckpt-convert"), st, ck, "--world", 2, "--pack-bytes", 30000])
    check(p.returncode == 0, f"convert --pack-bytes 30000: {p.stdout}{p.stderr}")
    mix = ckpt_edit.chunks(ck)["mix"]
    check(sorted("pack_offset" in r for r in mix) == [False, True], f"'mix' has a packed and a mapped chunk: {mix}")

    def values(h):
        check(h["mix"].is_virtual and any(n.startswith(".ckpt_chunk.") for n in h),
              "mixed: 'mix' is virtual, its packed chunk a .ckpt_chunk dataset of the file")
        check(h["layers%2F0.bf"].attrs["dtype"] in ("bfloat16", b"bfloat16"), "mixed: bfloat16 keeps its dtype attribute")
        for key, (_, arr) in src.items():
            check(h[escape(key)][()].tobytes() == arr.tobytes(), f"mixed: '{key}' as written")

    vfile = check_virtual(tools, ck, tmp, "mixed", 3, values)
    if not vfile:
        return
    # Moved together with its checkpoint (the original gone), it reads the same.
    moved = os.path.join(tmp, "moved")
    os.makedirs(moved)
    shutil.copytree(ck, os.path.join(moved, "mixed"))
    shutil.copy(vfile, moved)
    os.rename(ck, ck + ".away")
    try:
        with h5py.File(os.path.join(moved, os.path.basename(vfile)), "r") as h:
            check(h["mix"][()].tobytes() == src["mix"][1].tobytes(), "mixed: 'mix' read after the move")
    finally:
        os.rename(ck + ".away", ck)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--quickstart")
    ap.add_argument("--train")
    args = ap.parse_args()
    tools = lambda n: os.path.join(args.bin, n)  # noqa: E731
    base = os.environ.get("CKPT_TEST_TMP")
    if base:
        os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="virtual-packed-", dir=base)
    try:
        if args.quickstart:
            test_quickstart(tools, args.quickstart, tmp)
        if args.train:
            test_train(tools, args.train, tmp)
        test_mixed(tools, tmp)
    finally:
        status = finish(tmp, "virtual packed: all checks passed")
    return status


if __name__ == "__main__":
    sys.exit(main())
