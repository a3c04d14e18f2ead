#!/usr/bin/python3
"""End-to-end tests of the ckpt command-line tools.

Writes safetensors files on its own (numpy), converts them with ckpt-convert, reads the
shards back with h5py, and checks every tool's exit codes, --json output and text tables
(golden files in tests/tools/golden/). Builds a corpus of broken checkpoints, one per kind
of damage, and expects ckpt-verify to exit 1 on each with a message naming the problem.

Run by CTest:  /usr/bin/python3 cli_test.py --bin <dir of the tools> --golden <golden dir>
Refresh the golden tables after an intended change with --update-golden.
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import ckpt_edit  # noqa: E402
from ckpt_edit import edit_metadata  # noqa: E402

ST_DTYPES = {  # safetensors dtype -> numpy storage dtype (bf16 / fp8 as their bit patterns)
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "I8": np.int8, "I16": np.int16,
    "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_,
    "U16": np.uint16, "U32": np.uint32, "U64": np.uint64, "F8_E8M0": np.uint8,
}  # F4 (shape in values, two per byte) is tested in hub_test.py
CKPT_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
               "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I8": "int8", "I16": "int16",
               "I32": "int32", "I64": "int64", "U8": "uint8", "BOOL": "bool",
               "U16": "uint16", "U32": "uint32", "U64": "uint64", "F8_E8M0": "float8_e8m0fnu"}

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def write_safetensors(path, tensors, metadata=None):
    """tensors: ordered dict name -> (st_dtype, ndarray[, header shape]). Written by hand, per
    the spec. The header shape defaults to the array's (F4 counts values: give it)."""
    header, blobs, off = {}, [], 0
    for name, (dt, arr, *shape) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(shape[0] if shape else arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], tuple(t["shape"]), data[8 + n + b:8 + n + e])
    return out, meta


def read_ckpt_with_h5py(ckpt):
    """Assembles every tensor of a checkpoint from its shards with h5py alone."""
    md = ckpt_edit.load_metadata(ckpt)
    where = ckpt_edit.chunks(ckpt)  # v2: the shard indexes say where each chunk is
    out = {}
    for key, e in md["entries"].items():
        if e["type"] != "tensor":
            continue
        np_dtype = ST_DTYPES[[k for k, v in CKPT_DTYPES.items() if v == e["dtype"]][0]]
        full = np.zeros(e["shape"], dtype=np_dtype)
        for c in where.get(key, []):
            with h5py.File(os.path.join(ckpt, c["file"]), "r") as h:
                ds = h[c["dataset"]]
                if e["dtype"] in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "bool", "float8_e8m0fnu"):
                    check(ds.attrs["dtype"] in (e["dtype"], e["dtype"].encode()),
                          f"{key}: dataset dtype attribute {ds.attrs.get('dtype')!r}")
                data = ds[()]
            sl = tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))
            full[sl] = data
        out[key] = (e["dtype"], full)
    return out, md


class Tools:
    def __init__(self, bin_dir):
        self.bin = bin_dir

    def run(self, tool, *args, expect=None):
        cmd = [os.path.join(self.bin, tool)] + [str(a) for a in args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if expect is not None:
            check(p.returncode == expect,
                  f"{' '.join(cmd[1:]) if False else ' '.join([tool] + [str(a) for a in args])}: exit {p.returncode}, "
                  f"expected {expect}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}")
        return p

    def json(self, tool, *args, expect=0):
        p = self.run(tool, *args, "--json", expect=expect)
        try:
            return json.loads(p.stdout)
        except ValueError:
            check(False, f"{tool} {args}: --json printed no single JSON document: {p.stdout[:500]!r}")
            return {}


def sample_tensors(rng):
    t = {}
    t["model.embed.weight"] = ("F32", rng.standard_normal((10, 4)).astype(np.float32))
    t["model.layers.0.attn.weight"] = ("F32", rng.standard_normal((6, 4)).astype(np.float32))
    t["model.layers.0.attn.bias"] = ("F32", rng.standard_normal((6,)).astype(np.float32))
    t["model.layers.1.attn.weight"] = ("F32", rng.standard_normal((6, 4)).astype(np.float32))
    t["model.layers.1.attn.bias"] = ("F32", rng.standard_normal((6,)).astype(np.float32))
    t["model.norm.weight"] = ("F16", np.linspace(0.5, 1.5, 4).astype(np.float16))
    t["opt.step"] = ("I64", np.array(1000, dtype=np.int64))
    return t


def test_round_trip_all_dtypes(tools, tmp):
    rng = np.random.default_rng(7)
    tensors = {}
    shapes = [(5, 3), (7,), (), (2, 3, 4), (0, 4), (9, 2)]
    for i, (st, npd) in enumerate(ST_DTYPES.items()):
        shape = shapes[i % len(shapes)]
        if st in ("BF16", "F8_E4M3", "F8_E5M2", "U8", "F8_E8M0"):  # every bit pattern, NaN ones included
            info = np.iinfo(npd)
            arr = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=npd)
        elif st == "BOOL":
            arr = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(npd, np.integer):
            info = np.iinfo(npd)
            arr = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=npd)
        else:
            arr = rng.standard_normal(shape).astype(npd)
        tensors[f"t.{st.lower()}"] = (st, arr)
    meta = {"format": "pt", "source": "cli_test"}
    st_path = os.path.join(tmp, "all.safetensors")
    write_safetensors(st_path, tensors, meta)

    ck = os.path.join(tmp, "all-ckpt")
    tools.run("ckpt-convert", st_path, ck, "--world", 4, expect=0)
    tools.run("ckpt-verify", ck, expect=0)
    got, md = read_ckpt_with_h5py(ck)
    check(md["state_dict_type"] == "SHARDED" and md["world_size"] == 4, "convert --world 4 metadata")
    check(md["user"] == meta, f"__metadata__ kept as user metadata: {md['user']}")
    for name, (st, arr) in tensors.items():
        dt, full = got[name]
        check(dt == CKPT_DTYPES[st], f"{name}: dtype {dt}")
        check(full.shape == arr.shape and full.tobytes() == arr.tobytes(), f"{name}: h5py reads other bytes")
    multi = [cs for cs in ckpt_edit.chunks(ck).values() if len(cs) == 4]
    check(len(multi) >= 3, "tensors were sharded over 4 files")

    back = os.path.join(tmp, "back.safetensors")
    tools.run("ckpt-convert", ck, back, expect=0)
    rt, rmeta = read_safetensors(back)
    # ckpt's digests added (FORMAT.md §11; hub_test.py recomputes them), the rest as it was.
    check({k: v for k, v in rmeta.items() if not k.startswith("ckpt.")} == meta, f"__metadata__ round trip: {rmeta}")
    check(sorted(k for k in rmeta if k.startswith("ckpt.blocks.")) == sorted("ckpt.blocks." + k for k in rt)
          and "ckpt.digest" in rmeta, f"digests in the export: {sorted(rmeta)}")
    for name, (st, arr) in tensors.items():
        check(name in rt and rt[name][0] == st and rt[name][1] == arr.shape and rt[name][2] == arr.tobytes(),
              f"{name}: safetensors round trip not bit-exact")
    # Random bit patterns include NaNs: the same bits are the same value; under a tolerance
    # (IEEE comparison) a NaN differs, unless --nan-equal.
    tools.run("ckpt-diff", st_path, ck, expect=0)
    p = tools.run("ckpt-diff", st_path, ck, "--atol", "1e-9", expect=1)
    check("NaN" in p.stdout, f"NaN differences are named: {p.stdout}")
    tools.run("ckpt-diff", st_path, ck, "--atol", "1e-9", "--nan-equal", expect=0)
    tools.run("ckpt-diff", st_path, ck, "--nan-equal", expect=0)
    tools.run("ckpt-diff", back, ck, "--nan-equal", expect=0)
    j = tools.json("ckpt-diff", st_path, back, "--nan-equal")
    check(j.get("same") is True and j.get("compared") == len(tensors), f"diff --json: {j}")


def golden(tools, args_golden, name, text):
    path = os.path.join(args_golden.golden, name)
    if args_golden.update_golden:
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path) as f:
        want = f.read()
    check(text == want, f"golden {name} differs:\n--- want\n{want}\n--- got\n{text}")


def table_part(out):
    """The deterministic part of ckpt-inspect's text: from the key counts on."""
    lines = out.splitlines(keepends=True)
    start = next(i for i, l in enumerate(lines) if l.startswith("keys "))
    return "".join(lines[start:])


def test_inspect(tools, tmp, args):
    st_path = os.path.join(tmp, "model.safetensors")
    write_safetensors(st_path, sample_tensors(np.random.default_rng(1)), {"format": "pt"})
    ck = os.path.join(tmp, "model-ckpt")
    tools.run("ckpt-convert", st_path, ck, "--world", 2, "-q", expect=0)
    golden(tools, args, "inspect_flat.txt", table_part(tools.run("ckpt-inspect", ck, expect=0).stdout))
    golden(tools, args, "inspect_tree.txt", table_part(tools.run("ckpt-inspect", ck, "--tree", expect=0).stdout))
    golden(tools, args, "inspect_stats.txt",
           table_part(tools.run("ckpt-inspect", st_path, "--stats", "--key", "model.*", expect=0).stdout))
    j = tools.json("ckpt-inspect", ck, "--stats")
    check(j.get("num_keys") == 7 and j.get("world_size") == 2 and j.get("state_dict_type") == "SHARDED",
          f"inspect --json summary: {j.get('num_keys')} {j.get('world_size')}")
    keys = {k["key"]: k for k in j.get("keys", [])}
    w = keys.get("model.embed.weight", {})
    check(w.get("layout") == "sharded dim 0 / 2" and w.get("shape") == [10, 4] and w.get("chunks") == 2,
          f"inspect --json key row: {w}")
    check(w.get("stats", {}).get("source") == "recorded", "stats recorded at save")
    # The multiplexer runs the same code.
    a = tools.run("ckpt-inspect", ck, expect=0).stdout
    b = tools.run("ckpt", "inspect", ck, expect=0).stdout
    check(a == b, "ckpt inspect == ckpt-inspect")
    # A lone shard describes itself.
    shard = os.path.join(ck, sorted(f for f in os.listdir(ck) if f.endswith(".h5"))[0])
    j = tools.json("ckpt-inspect", shard)
    check(j.get("kind") == "shard" and j.get("num_keys", 0) >= 6, f"inspect of a lone shard: {j.get('kind')}")
    # A missing shard is reported (exit 1), not fatal.
    broken = os.path.join(tmp, "model-missing")
    shutil.copytree(ck, broken)
    os.remove(os.path.join(broken, "shard-00001-of-00002.h5"))
    p = tools.run("ckpt-inspect", broken, expect=1)
    check("missing" in p.stdout and "model.embed.weight" in p.stdout, "inspect lists keys and the missing file")
    return st_path, ck


def test_common_flags(tools, tmp, ck):
    for tool in ("ckpt-inspect", "ckpt-verify", "ckpt-merge", "ckpt-diff", "ckpt-convert"):
        p = tools.run(tool, "--help", expect=0)
        check("Example" in p.stdout and "Exit codes" in p.stdout, f"{tool} --help shows an example")
        p = tools.run(tool, "--version", expect=0)
        check("0.1.0" in p.stdout, f"{tool} --version")
        tools.run(tool, "--no-such-flag", expect=2)
    p = tools.run("ckpt-inspect", os.path.join(tmp, "nowhere"), "--json", expect=2)
    j = json.loads(p.stdout)
    check(j["ok"] is False and "nowhere" in j["error"]["message"], "I/O error as JSON")
    check("nowhere" in p.stderr, "I/O error names the path on stderr")
    tools.run("ckpt", expect=2)
    tools.run("ckpt", "frobnicate", expect=2)
    p = tools.run("ckpt", "--help", expect=0)
    check(all(t in p.stdout for t in ("inspect", "verify", "merge", "diff", "convert")), "ckpt --help lists tools")
    p = tools.run("ckpt-verify", ck, "-q", expect=0)
    check(p.stdout == "" and p.stderr == "", "-q prints nothing on success")
    tools.run("ckpt-merge", ck, os.path.join(tmp, "x"), "--max-memory", "lots", expect=2)
    tools.run("ckpt-merge", ck, os.path.join(tmp, "x"), "--dtype", "int8", expect=2)


def test_diff(tools, tmp, st_path, ck):
    tensors = sample_tensors(np.random.default_rng(1))
    changed = dict(tensors)
    w = tensors["model.layers.0.attn.weight"][1].copy()
    w[2, 3] += np.float32(0.25)
    changed["model.layers.0.attn.weight"] = ("F32", w)
    changed["model.final.bias"] = changed.pop("model.layers.1.attn.bias")  # a rename
    del changed["model.norm.weight"]
    other = os.path.join(tmp, "changed.safetensors")
    write_safetensors(other, changed)
    p = tools.run("ckpt-diff", ck, other, expect=1)
    check("DIFFERENT" in p.stdout, "diff says DIFFERENT")
    j = tools.json("ckpt-diff", ck, other, expect=1)
    by = {(d["what"], d["key"]): d for d in j.get("differences", [])}
    v = by.get(("values", "model.layers.0.attn.weight"), {})
    check(v.get("num_different") == 1 and abs(v.get("max_abs_diff", 0) - 0.25) < 1e-6, f"value diff: {v}")
    check(by.get(("renamed", "model.layers.1.attn.bias"), {}).get("other_key") == "model.final.bias", f"rename: {by.keys()}")
    check(("only_in_a", "model.norm.weight") in by, "only in A")
    check(len(by) == 3, f"exactly three differences: {list(by)}")
    tools.run("ckpt-diff", ck, other, "--atol", "0.3", "--exclude", "model.norm.*", "--exclude", "model.*.bias",
              "--exclude", "model.final.*", expect=0)
    tools.run("ckpt-diff", ck, other, "--keys-only", "--exclude", "model.norm.*", "--exclude", "model.*.bias",
              "--exclude", "model.final.*", expect=0)
    tools.run("ckpt-diff", ck, os.path.join(tmp, "nowhere"), expect=2)


def test_merge(tools, tmp, st_path, ck):
    tensors = sample_tensors(np.random.default_rng(1))
    full = os.path.join(tmp, "full")
    j = tools.json("ckpt-merge", ck, full)
    check(j.get("files") == 1 and j.get("tensors") == 7, f"merge --json: {j}")
    tools.run("ckpt-verify", full, expect=0)
    with open(os.path.join(full, "metadata.json")) as f:
        check(json.load(f)["state_dict_type"] == "FULL", "merged checkpoint is FULL")
    tools.run("ckpt-merge", ck, full, expect=2)  # exists
    tools.run("ckpt-merge", ck, full, "--force", "--exclude", "opt.*", expect=0)
    got, md = read_ckpt_with_h5py(full)
    check("opt.step" not in got and len(got) == 6, "--exclude 'opt.*'")
    # Repeatable glob flags take one value each, before or after the positionals.
    sel = os.path.join(tmp, "selected")
    tools.run("ckpt-merge", "--exclude", "opt.*", "--keys", "model.layers.*", "--keys", "model.norm.*", ck, sel,
              expect=0)
    got, md = read_ckpt_with_h5py(sel)
    check(sorted(got) == sorted(k for k in tensors if k.startswith(("model.layers.", "model.norm."))),
          f"--keys / --exclude before positionals: {sorted(got)}")
    re3 = os.path.join(tmp, "re3")
    tools.run("ckpt-merge", full, re3, "--world", 3, "--dim", 1, "--max-memory", "64", expect=0)
    got, md = read_ckpt_with_h5py(re3)
    check(md["world_size"] == 3 and len(md["files"]) == 3, "reshard --world 3")
    for name, (st, arr) in tensors.items():
        if name != "opt.step":
            check(got[name][1].tobytes() == arr.tobytes(), f"{name}: resharded bytes")
    tools.run("ckpt-diff", re3, st_path, "--exclude", "opt.*", expect=0)
    # Virtual datasets: h5py reads the full tensors with no byte copied.
    vfile = os.path.join(tmp, "virtual.h5")
    tools.run("ckpt-merge", ck, vfile, "--virtual", expect=0)
    with h5py.File(vfile, "r") as h:
        for name, (st, arr) in tensors.items():
            check(np.array_equal(h[name][()], arr), f"{name}: virtual dataset")
    # It names its sources relative to itself: moved together with them (and the original
    # gone), it still reads the same from anywhere.
    moved = os.path.join(tmp, "moved")
    os.makedirs(moved)
    shutil.copytree(ck, os.path.join(moved, os.path.basename(ck)))
    shutil.copy(vfile, moved)
    os.rename(ck, ck + ".away")
    try:
        with h5py.File(os.path.join(moved, "virtual.h5"), "r") as h:
            for name, (st, arr) in tensors.items():
                check(np.array_equal(h[name][()], arr), f"{name}: virtual dataset, moved")
    finally:
        os.rename(ck + ".away", ck)
    # Cast: bfloat16 round to nearest even, as numpy computes it here.
    bf = os.path.join(tmp, "bf16.safetensors")
    tools.run("ckpt-merge", ck, bf, "--dtype", "bfloat16", expect=0)
    rt, _ = read_safetensors(bf)
    x = tensors["model.embed.weight"][1].view(np.uint32)
    want = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    check(rt["model.embed.weight"][0] == "BF16" and rt["model.embed.weight"][2] == want.tobytes(), "bf16 cast")
    check(rt["opt.step"][0] == "I64", "integers are not cast")
    # Compressed output reads back the same.
    zs = os.path.join(tmp, "zstd")
    tools.run("ckpt-merge", ck, zs, "--compress", "zstd:5", expect=0)
    tools.run("ckpt-verify", zs, expect=0)
    tools.run("ckpt-diff", zs, ck, expect=0)
    j = tools.json("ckpt-inspect", zs)
    check(j.get("compressed") is True, "inspect sees compression")


def test_malformed_safetensors(tools, tmp):
    cases = {
        "past-end": (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, 10 ** 6, "runs past the end"),
        "overlap": (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                    b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', 12, None, "overlap"),
        "out-of-range": (b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', 8, None, "past the data buffer"),
        "unknown-dtype": (b'{"a":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,8]}}', 8, None, "unknown or unsupported dtype"),
        "shape-size": (b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', 8, None, "data_offsets span"),
    }
    for name, (header, data_len, claim, expect) in cases.items():
        path = os.path.join(tmp, f"bad-{name}.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", claim if claim else len(header)) + header + b"\0" * data_len)
        p = tools.run("ckpt-convert", path, os.path.join(tmp, f"out-{name}"), expect=1)
        check(expect in p.stderr and f"bad-{name}.safetensors" in p.stderr, f"{name}: message {p.stderr!r}")
        check(not os.path.exists(os.path.join(tmp, f"out-{name}")), f"{name}: nothing written")


def test_verify_corpus(tools, tmp):
    rng = np.random.default_rng(3)
    t = {"w": ("F32", rng.standard_normal((8, 4)).astype(np.float32)),
         "v": ("F32", rng.standard_normal((6,)).astype(np.float32)),
         "i": ("I32", np.arange(12, dtype=np.int32).reshape(3, 4))}
    st_path = os.path.join(tmp, "corpus.safetensors")
    write_safetensors(st_path, t)
    base = os.path.join(tmp, "corpus-base")
    tools.run("ckpt-convert", st_path, base, "--world", 2, expect=0)
    tools.run("ckpt-verify", base, expect=0)
    w_chunks = ckpt_edit.chunks(base)["w"]  # two, by rows, in files 0 and 1
    shard0 = w_chunks[0]["file"]

    def missing_file(d):
        os.remove(os.path.join(d, "shard-00001-of-00002.h5"))

    def truncated(d):
        p = os.path.join(d, shard0)
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) // 2)

    def flip_data(d):
        p = os.path.join(d, w_chunks[0]["file"])
        with h5py.File(p, "r") as h:
            off = h[w_chunks[0]["dataset"]].id.get_offset()
        with open(p, "r+b") as f:
            f.seek(off + 5)
            b = f.read(1)
            f.seek(off + 5)
            f.write(bytes([b[0] ^ 0x10]))

    # A chunk field that lies: in v2 it is in the shard index record. Alone, the index's
    # digest in metadata.json catches it; with the digests recomputed, the checksum does.
    def flip_checksum(r, _):
        r["checksum"] = r["checksum"][:-1] + ("0" if r["checksum"][-1] != "0" else "1")

    def flip_record_alone(d):  # in the index's exact text
        c = ckpt_edit.chunks(d)["v"][0]
        flipped = dict(c)
        flip_checksum(flipped, None)
        ckpt_edit.edit_index_text(d, c["file_index"], lambda t: ckpt_edit.sub_once(
            t, re.escape(c["checksum"].encode()), flipped["checksum"].encode()), redigest=False)

    def flip_record(d):
        ckpt_edit.edit_records(d, "v", flip_checksum)

    def flip_scalar_alone(d):  # in metadata.json's exact text
        ckpt_edit.edit_metadata_text(d, lambda t: ckpt_edit.sub_once(t, rb'"world_size": ?2\b', b'"world_size":1'),
                                     redigest=False)

    # w's layout as an explicit chunk list of (row offset, rows, file index): a grid cannot
    # overlap or leave a gap.
    def w_rows(d, rows):
        edit_metadata(d, lambda m: m["entries"]["w"].__setitem__("layout", {"chunks": [
            {"offsets": [o, 0], "sizes": [n, 4], "file": f} for o, n, f in rows]}))

    def overlap(d):  # the second chunk's index record moved along with the layout
        w_rows(d, [(0, 4, 0), (3, 4, 1)])
        ckpt_edit.edit_records(d, "w", lambda r, i: r.__setitem__("offsets", [3, 0]) if i == 1 else None)

    def gap(d):
        w_rows(d, [(0, 4, 0)])

    def out_of_bounds(d):
        w_rows(d, [(0, 4, 0), (7, 4, 1)])

    def dtype_lie(d):
        # metadata.json and the index records agree; the HDF5 datasets say int32.
        edit_metadata(d, lambda m: m["entries"]["i"].__setitem__("dtype", "float32"))
        ckpt_edit.edit_records(d, "i", lambda r, _: r.__setitem__("dtype", "float32"))

    def path_escape(d):
        edit_metadata(d, lambda m: m["files"][0].__setitem__("name", "../escape.h5"))

    def absurd_shape(d):
        edit_metadata(d, lambda m: m["entries"]["v"].__setitem__("shape", [2 ** 62, 2 ** 62]))

    corpus = {
        "missing file": (missing_file, "missing"),
        "truncated file": (truncated, "truncated"),
        "flipped data byte": (flip_data, "checksum mismatch"),
        "flipped index record": (flip_record_alone, "digest mismatch"),
        "flipped index record, digests recomputed": (flip_record, "checksum mismatch"),
        "flipped metadata field": (flip_scalar_alone, "digest mismatch"),
        "overlapping chunks": (overlap, "overlap"),
        "gap": (gap, "gap"),
        "out-of-bounds chunk": (out_of_bounds, "outside"),
        "dtype lie": (dtype_lie, "does not match dtype float32"),
        "path escape": (path_escape, "../escape.h5"),
        "absurd shape": (absurd_shape, "64 bits"),
    }
    for i, (name, (damage, expect)) in enumerate(corpus.items()):
        d = os.path.join(tmp, f"corpus-{i}")
        shutil.copytree(base, d)
        damage(d)
        p = tools.run("ckpt-verify", d, expect=1)
        check(expect in p.stdout and "FAILED" in p.stdout, f"verify [{name}]: expected {expect!r} in:\n{p.stdout}{p.stderr}")
        j = tools.json("ckpt-verify", d, expect=1)
        check(j.get("ok") is False and j.get("problems"), f"verify --json [{name}]")
        junit = os.path.join(tmp, f"corpus-{i}.xml")
        tools.run("ckpt-verify", d, "--quick", "--junit", junit, expect=None)
        with open(junit) as f:
            check("<testsuite name=\"ckpt-verify\"" in f.read(), f"junit [{name}]")
        # The other tools refuse it with an error, never a crash.
        for tool, args in (("ckpt-inspect", [d, "--stats"]), ("ckpt-diff", [d, base]),
                           ("ckpt-merge", [d, os.path.join(tmp, f"corpus-out-{i}")])):
            p = tools.run(tool, *args)
            check(p.returncode in (0, 1, 2), f"{tool} [{name}] crashed: exit {p.returncode}\n{p.stderr}")
    # Several problems are all reported, not only the first.
    d = os.path.join(tmp, "corpus-multi")
    shutil.copytree(base, d)
    flip_data(d)
    missing_file(d)
    j = tools.json("ckpt-verify", d, expect=1)
    checks = {p["check"] for p in j.get("problems", [])}
    check({"files", "checksums"} <= checks, f"every problem reported: {checks}")
    # --expect: a layout change fails, the same layout passes; --check-finite.
    keys = os.path.join(tmp, "keys.json")
    with open(keys, "w") as f:
        f.write(tools.run("ckpt-inspect", base, "--json", expect=0).stdout)
    tools.run("ckpt-verify", base, "--expect", keys, expect=0)
    tools.run("ckpt-verify", base, "--quick", "--expect", st_path, expect=0)
    t2 = dict(t)
    t2["v"] = ("F32", np.full((7,), np.nan, dtype=np.float32))
    st2 = os.path.join(tmp, "corpus2.safetensors")
    write_safetensors(st2, t2)
    c2 = os.path.join(tmp, "corpus-nan")
    tools.run("ckpt-convert", st2, c2, expect=0)
    p = tools.run("ckpt-verify", c2, "--expect", keys, expect=1)
    check("shape [7]" in p.stdout and "[6]" in p.stdout, f"--expect names the shape change: {p.stdout}")
    tools.run("ckpt-verify", c2, expect=0)
    p = tools.run("ckpt-verify", c2, "--check-finite", expect=1)
    check("7 NaN" in p.stdout, f"--check-finite: {p.stdout}")


def test_convert_flags(tools, tmp):
    """ckpt-convert takes ckpt-merge's --keys / --exclude; --skip-unsupported leaves out (and
    names) tensors of a dtype ckpt lacks; keys that look like chunk names stay apart."""
    rng = np.random.default_rng(11)
    t = {}
    t["a.w"] = ("F32", rng.standard_normal((2, 3)).astype(np.float32))
    t["b.w"] = ("F32", rng.standard_normal((4,)).astype(np.float32))
    t["odd"] = ("C64", np.arange(5, dtype=np.complex64))  # a dtype ckpt does not have
    # A key spelled like a chunk name of another key: 'w' split over 4 files has a chunk at
    # offsets [0, 0], which once made the dataset name 'w@0,0' twice.
    t["w"] = ("F32", rng.standard_normal((8, 4)).astype(np.float32))
    t["w@0,0"] = ("F32", rng.standard_normal((2, 4)).astype(np.float32))
    st = os.path.join(tmp, "flags.safetensors")
    write_safetensors(st, t)

    def keys(ck):
        with open(os.path.join(ck, "metadata.json")) as f:
            return sorted(json.load(f)["entries"])

    p = tools.run("ckpt-convert", st, os.path.join(tmp, "flags-refused"), expect=1)
    check("'odd'" in p.stderr and "C64" in p.stderr, f"the unsupported tensor is named: {p.stderr}")
    check("--skip-unsupported" in tools.run("ckpt-convert", "--help", expect=0).stdout, "--help names the flag")

    out = os.path.join(tmp, "flags-all")
    p = tools.run("ckpt-convert", st, out, "--skip-unsupported", "--world", 4, expect=0)
    check("warning: skipped tensor 'odd' (dtype 'C64')" in p.stderr, f"warning names the tensor: {p.stderr}")
    check(keys(out) == ["a.w", "b.w", "w", "w@0,0"], f"keys: {keys(out)}")
    got, _ = read_ckpt_with_h5py(out)
    for k in ("w", "w@0,0", "a.w"):
        check(got[k][1].tobytes() == t[k][1].tobytes(), f"{k}: values read back with h5py differ")
    tools.run("ckpt-verify", out, expect=0)
    back = os.path.join(tmp, "flags-back.safetensors")
    tools.run("ckpt-convert", out, back, expect=0)
    rt, _ = read_safetensors(back)
    check(rt["w@0,0"][2] == t["w@0,0"][1].tobytes() and rt["w"][2] == t["w"][1].tobytes(),
          "w and w@0,0 round trip")

    out = os.path.join(tmp, "flags-keys")
    p = tools.run("ckpt-convert", st, out, "--skip-unsupported", "--keys", "a.*", "--keys", "b.*", expect=0)
    check(keys(out) == ["a.w", "b.w"], f"--keys: {keys(out)}")
    check("warning" not in p.stderr, f"no warning for a tensor not selected: {p.stderr}")
    out = os.path.join(tmp, "flags-exclude")
    tools.run("ckpt-convert", st, out, "--skip-unsupported", "--exclude", "w*", "--exclude", "odd", expect=0)
    check(keys(out) == ["a.w", "b.w"], f"--exclude: {keys(out)}")
    out = os.path.join(tmp, "flags-exclude.safetensors")
    tools.run("ckpt-convert", back, out, "--exclude", "a.*", expect=0)
    rt, _ = read_safetensors(out)
    check(sorted(rt) == ["b.w", "w", "w@0,0"], f"--exclude to safetensors: {sorted(rt)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--update-golden", action="store_true")
    args = ap.parse_args()
    tools = Tools(args.bin)
    base = os.environ.get("CKPT_TEST_TMP")
    if base:
        os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="cli-", dir=base)
    try:
        test_round_trip_all_dtypes(tools, tmp)
        st_path, ck = test_inspect(tools, tmp, args)
        test_common_flags(tools, tmp, ck)
        test_diff(tools, tmp, st_path, ck)
        test_merge(tools, tmp, st_path, ck)
        test_malformed_safetensors(tools, tmp)
        test_verify_corpus(tools, tmp)
        test_convert_flags(tools, tmp)
    finally:
        status = finish(tmp, "all CLI tests passed")
    return status


def finish(tmp, passed):
    """Removes the scratch `tmp` if every check passed; the exit status."""
    if not FAILURES:
        shutil.rmtree(tmp, ignore_errors=True)
        print(passed)
        return 0
    print(f"{len(FAILURES)} failures (scratch kept in {tmp})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
