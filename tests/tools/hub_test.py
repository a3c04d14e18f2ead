#!/usr/bin/python3
"""End-to-end tests of the Hugging Face side of the tools: the dtypes current models ship
(U16 U32 U64 F8_E8M0 F4) and the Hub's sharded safetensors layout, through the real tools on
real files.

  hub_test.py --bin DIR                      the tools and /usr/bin/python3 (h5py, numpy) only
  hub_test.py --bin DIR --safetensors-package
      what the tools write, read by the `safetensors` package (PyPI) from the venv at
      ${CKPT_VENV:-~/.cache/ckpt-venv} (and, where that venv has them, compared with
      huggingface_hub's shard plan and loaded by torch); exit 77 (CTest SKIP_RETURN_CODE) when
      that venv or its safetensors is not there.

Expected values come from this file (numpy decoding per FORMAT.md §4.5, the shard plan per
huggingface_hub's documented rule), never from the tools.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_test as C  # noqa: E402  (write_safetensors, read_safetensors, Tools, check)

check = C.check
SKIP = 77

# FORMAT.md §4.5, decoded here on its own.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def f4_values(packed):
    b = np.asarray(packed, dtype=np.uint8).reshape(-1)
    t = np.array(E2M1)
    return np.stack([t[b & 0xF], t[b >> 4]], axis=-1).reshape(-1)


def e8m0_values(raw):
    b = np.asarray(raw, dtype=np.uint8).reshape(-1).astype(np.int64)
    return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127))


def new_dtype_tensors(rng):
    """name -> (st dtype, storage array, header shape). F4 arrays are the packed bytes."""
    t = {}
    t["u16"] = ("U16", rng.integers(0, 2 ** 16, (5, 3), dtype=np.uint16, endpoint=False), None)
    t["u32"] = ("U32", rng.integers(0, 2 ** 32, (4,), dtype=np.uint32, endpoint=False), None)
    t["u64"] = ("U64", np.array([0, 1, 2 ** 53 + 1, 2 ** 64 - 1], dtype=np.uint64), None)
    t["u64.scalar"] = ("U64", np.array(2 ** 63 + 5, dtype=np.uint64), None)
    scales = rng.integers(0, 256, (6, 4), dtype=np.uint8)
    scales[0, 0] = 255  # the NaN
    t["mx.scales"] = ("F8_E8M0", scales, None)
    blocks = rng.integers(0, 256, (6, 16), dtype=np.uint8)  # 6 x 32 values
    t["mx.blocks"] = ("F4", blocks, [6, 32])
    t["mx.big"] = ("F4", rng.integers(0, 256, (1024, 1100), dtype=np.uint8), [1024, 2200])  # copied file to file
    t["f4.vec"] = ("F4", rng.integers(0, 256, (3,), dtype=np.uint8), [6])
    t["f4.empty"] = ("F4", np.zeros((0, 4), dtype=np.uint8), [0, 8])
    t["w"] = ("F32", rng.standard_normal((4, 3)).astype(np.float32), None)
    return t


def write_st(path, tensors, metadata=None):
    C.write_safetensors(path, {k: (dt, arr) + ((shape,) if shape else ()) for k, (dt, arr, shape) in tensors.items()},
                        metadata)


def to_ckpt(tools, tmp, name, tensors, world, metadata=None):
    """Writes `tensors` as <name>.safetensors and converts it to checkpoint <name>-ckpt of `world` files."""
    st = os.path.join(tmp, name + ".safetensors")
    write_st(st, tensors, metadata)
    ck = os.path.join(tmp, name + "-ckpt")
    tools.run("ckpt-convert", st, ck, "--world", world, expect=0)
    return st, ck


def test_new_dtypes(tools, tmp):
    rng = np.random.default_rng(12)
    t = new_dtype_tensors(rng)
    st, ck = to_ckpt(tools, tmp, "new", t, 2, {"format": "pt"})
    tools.run("ckpt-verify", ck, expect=0)
    whole = os.path.join(tmp, "new-whole")  # FULL: each tensor one chunk, mx.big copied file to file
    tools.run("ckpt-convert", st, whole, expect=0)
    tools.run("ckpt-verify", whole, expect=0)
    tools.run("ckpt-diff", st, whole, expect=0)
    tools.run("ckpt-verify", ck, "--check-finite", expect=1)  # the one NaN scale
    want_dtype = {"U16": "uint16", "U32": "uint32", "U64": "uint64", "F8_E8M0": "float8_e8m0fnu",
                  "F4": "float4_e2m1fn_x2", "F32": "float32"}

    # ckpt-inspect: dtypes and shapes as torch has them (F4: bytes, two values each).
    j = tools.json("ckpt-inspect", ck, "--stats")
    keys = {k["key"]: k for k in j.get("keys", [])}
    for name, (dt, arr, _) in t.items():
        k = keys.get(name, {})
        check(k.get("dtype") == want_dtype[dt] and k.get("shape") == list(arr.shape),
              f"inspect {name}: {k.get('dtype')} {k.get('shape')}, expected {want_dtype[dt]} {list(arr.shape)}")
    # Stats are of the decoded values (FORMAT.md §7.3): F4 two per element, E8M0 2^(b-127).
    for name, values in (("mx.blocks", f4_values(t["mx.blocks"][1])), ("f4.vec", f4_values(t["f4.vec"][1])),
                         ("mx.scales", e8m0_values(t["mx.scales"][1]))):
        s = keys.get(name, {}).get("stats") or {}
        fin = values[np.isfinite(values)]
        check(s.get("finite_count") == fin.size and s.get("nan_count") == int(np.isnan(values).sum()),
              f"{name}: counts {s}, expected {fin.size} finite, {int(np.isnan(values).sum())} NaN")
        for field, want in (("min", fin.min()), ("max", fin.max()), ("mean", fin.mean())):
            got = s.get(field)
            check(got is not None and abs(got - want) <= 1e-9 * max(1.0, abs(want)), f"{name}: {field} {got}, expected {want}")
    for name in ("u16", "u64"):
        check(keys.get(name, {}).get("stats") is None, f"{name}: an integer tensor has no stats")

    # h5py reads the shards: storage types and dtype attributes per FORMAT.md §4.1.
    got, _ = read_ckpt(ck)
    for name, (dt, arr, _) in t.items():
        dtype, full, attr = got[name]
        check(dtype == want_dtype[dt] and full.tobytes() == arr.tobytes() and full.shape == arr.shape,
              f"{name}: h5py reads {dtype} {full.shape}")
        if dt in ("F8_E8M0", "F4") and arr.size:
            check(attr == want_dtype[dt], f"{name}: dataset dtype attribute {attr!r}")

    # Back to safetensors: bit-exact, F4's header shape in values again.
    back = os.path.join(tmp, "new-back.safetensors")
    tools.run("ckpt-convert", ck, back, expect=0)
    rt, meta = C.read_safetensors(back)
    for name, (dt, arr, shape) in t.items():
        check(name in rt and rt[name][0] == dt and list(rt[name][1]) == list(shape or arr.shape)
              and rt[name][2] == arr.tobytes(), f"{name}: safetensors round trip {rt.get(name, ('?',))[:2]}")
    check({k: v for k, v in meta.items() if not k.startswith("ckpt.")} == {"format": "pt"}, f"__metadata__: {meta}")
    check_digests(back, rt, meta)
    check_digest_refusals(tools, tmp, back, rt)

    # diff: same; one F4 nibble changed is one element of one tensor.
    tools.run("ckpt-diff", st, ck, expect=0)
    tools.run("ckpt-diff", back, ck, "--atol", "0.1", "--nan-equal", expect=0)
    t2 = dict(t)
    blocks = t["mx.blocks"][1].copy()
    blocks[2, 5] ^= 0x10  # the high nibble only
    t2["mx.blocks"] = ("F4", blocks, [6, 32])
    st2 = os.path.join(tmp, "new-edited.safetensors")
    write_st(st2, t2, {"format": "pt"})
    j = tools.json("ckpt-diff", st2, ck, expect=1)
    d = [x for x in j.get("differences", []) if x.get("key") == "mx.blocks"]
    check(len(d) == 1 and d[0].get("num_different") == 1 and d[0].get("num_elements") == blocks.size,
          f"diff of one nibble: {d} in {j}")
    check(len(j.get("differences", [])) == 1, f"only mx.blocks differs: {j.get('differences')}")

    # merge: to one FULL file, and --dtype casts the float32 only (scales and packed F4 stay).
    full = os.path.join(tmp, "new-full")
    tools.run("ckpt-merge", ck, full, "--dtype", "bfloat16", expect=0)
    tools.run("ckpt-verify", full, expect=0)
    j = tools.json("ckpt-inspect", full)
    dtypes = {k["key"]: k["dtype"] for k in j.get("keys", [])}
    check(dtypes.get("w") == "bfloat16" and dtypes.get("mx.blocks") == "float4_e2m1fn_x2"
          and dtypes.get("mx.scales") == "float8_e8m0fnu" and dtypes.get("u32") == "uint32", f"merge --dtype: {dtypes}")
    tools.run("ckpt-diff", full, st, "--exclude", "w", expect=0)
    p = tools.run("ckpt-merge", ck, os.path.join(tmp, "to-f4"), "--dtype", "float4_e2m1fn_x2", expect=2)
    check("--dtype" in p.stderr, f"--dtype float4_e2m1fn_x2 refused: {p.stderr}")


def read_ckpt(ck):
    """Each tensor of a checkpoint with h5py alone: (dtype, array, dtype attribute)."""
    import ckpt_edit
    md = ckpt_edit.load_metadata(ck)
    where = ckpt_edit.chunks(ck)
    storage = {"uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "float8_e8m0fnu": "u1",
               "float4_e2m1fn_x2": "u1", "float32": "<f4", "bfloat16": "<u2"}
    out = {}
    for key, e in md["entries"].items():
        if e["type"] != "tensor":
            continue
        full = np.zeros(e["shape"], dtype=storage[e["dtype"]])
        attr = None
        for c in where.get(key, []):
            with h5py.File(os.path.join(ck, c["file"]), "r") as h:
                ds = h[c["dataset"]]
                check(ds.dtype == np.dtype(storage[e["dtype"]]), f"{key}: HDF5 type {ds.dtype}")
                a = ds.attrs.get("dtype")
                attr = a.decode() if isinstance(a, bytes) else a
                full[tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))] = ds[()]
        out[key] = (e["dtype"], full, attr)
    return out, md


def test_refused(tools, tmp):
    """An F4 shape with no float4_e2m1fn_x2 form, and unknown dtypes: exit 1 naming file and key."""
    cases = {
        "f4-odd": ({"x": {"dtype": "F4", "shape": [2, 3], "data_offsets": [0, 3]}}, 3, "F4 shape [2,3]"),
        "f4-scalar": ({"x": {"dtype": "F4", "shape": [], "data_offsets": [0, 1]}}, 1, "F4 shape []"),
        "f6": ({"x": {"dtype": "F6_E3M2", "shape": [4], "data_offsets": [0, 3]}}, 3, "unknown or unsupported dtype 'F6_E3M2'"),
        "c64": ({"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, 8, "unknown or unsupported dtype 'C64'"),
        "f4-bytes": ({"x": {"dtype": "F4", "shape": [4], "data_offsets": [0, 4]}}, 4, "data_offsets span"),
    }
    for name, (header, n, expect) in cases.items():
        path = os.path.join(tmp, f"refused-{name}.safetensors")
        h = json.dumps(header).encode()
        with open(path, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + b"\0" * n)
        for tool, args in (("ckpt-convert", [os.path.join(tmp, f"refused-{name}-out")]), ("ckpt-inspect", []),
                           ("ckpt-verify", [])):
            p = tools.run(tool, path, *args, expect=1)
            said = p.stdout + p.stderr
            check(expect in said and f"refused-{name}.safetensors" in said and "'x'" in said,
                  f"{tool} {name}: message {said!r}")
        check(not os.path.exists(os.path.join(tmp, f"refused-{name}-out")), f"{name}: nothing written")
    # The smallest F4 tensor, [2] values = one byte, goes both ways (a 0-d float4_e2m1fn_x2,
    # which no safetensors file can give, is refused on the way out: ops_test).
    st = os.path.join(tmp, "u8.safetensors")
    C.write_safetensors(st, {"x": ("F4", np.zeros((1,), np.uint8), [2])})
    ck = os.path.join(tmp, "f4-1")
    tools.run("ckpt-convert", st, ck, expect=0)
    tools.run("ckpt-convert", ck, os.path.join(tmp, "f4-1.safetensors"), expect=0)
    rt, _ = C.read_safetensors(os.path.join(tmp, "f4-1.safetensors"))
    check(rt["x"][:2] == ("F4", (2,)), f"F4 [2] round trip: {rt['x'][:2]}")


# ----------------------------------------------------------------------- sharded layout

def hub_plan(sizes, cap):
    """huggingface_hub's split_state_dict_into_shards_factory, restated: a list of index lists."""
    shards, cur, cur_size = [], [], 0
    for i, size in enumerate(sizes):
        if size > cap:
            shards.append([i])
            continue
        if cur_size + size > cap:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(i)
        cur_size += size
    if cur:
        shards.append(cur)
    return shards


def sharded_tensors(rng):
    """Tensors of several sizes (keys in sorted order, as the checkpoint lists them)."""
    t = {}
    t["a.big"] = ("F32", rng.standard_normal((64, 40)).astype(np.float32), None)      # 10240 B: over the cap
    # 2 MiB: over the 1 MiB under which tensors go through memory, so it is copied file to file
    # (a whole tensor from safetensors once failed there, checked against a checksum it has not).
    t["a.huge"] = ("F32", rng.standard_normal((512, 1024)).astype(np.float32), None)
    t["b.w"] = ("BF16", rng.integers(0, 2 ** 16, (30, 20), dtype=np.uint16), None)    # 1200 B
    t["c.w"] = ("F32", rng.standard_normal((10, 30)).astype(np.float32), None)        # 1200 B
    t["d.scales"] = ("F8_E8M0", rng.integers(0, 255, (100,), dtype=np.uint8), None)   # 100 B
    t["e.blocks"] = ("F4", rng.integers(0, 256, (50, 16), dtype=np.uint8), [50, 32])  # 800 B
    t["f.ids"] = ("U32", rng.integers(0, 2 ** 32, (300,), dtype=np.uint32), None)     # 1200 B
    t["g.empty"] = ("F16", np.zeros((0, 3), np.float16), None)                        # 0 B
    t["h.scalar"] = ("I64", np.array(7, np.int64), None)                              # 8 B
    return t


def check_digests(path, tensors, meta):
    """ckpt's digests in an exported file's __metadata__ (FORMAT.md §11), recomputed here."""
    import xxhash
    B = 65536
    check(meta.get("ckpt.block_bytes") == str(B), f"{path}: ckpt.block_bytes {meta.get('ckpt.block_bytes')}")
    for name, (_, _, raw) in tensors.items():
        want = "".join("%016x" % xxhash.xxh3_64_intdigest(raw[i:i + B]) for i in range(0, len(raw), B))
        check(meta.get("ckpt.blocks." + name) == want, f"{path}: ckpt.blocks.{name} differs from the bytes' blocks")
    check(sorted(k for k in meta if k.startswith("ckpt.blocks.")) == sorted("ckpt.blocks." + n for n in tensors),
          f"{path}: ckpt.blocks keys other than the tensors'")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    digest = header.get("__metadata__", {}).pop("ckpt.digest", None)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
    check(digest == "xxh3-64:%016x" % xxhash.xxh3_64_intdigest(text), f"{path}: ckpt.digest is not the header's")


def check_digest_refusals(tools, tmp, path, tensors):
    """A byte of an export changed, or a tensor renamed in its header: ckpt-verify exits 1 and
    an import refuses it, each naming the file and tensor; the untouched export imports."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = max(tensors, key=lambda k: len(tensors[k][2]))  # the largest: mx.big, several blocks
    b, e = header[name]["data_offsets"]
    base = os.path.basename(path)[:-len(".safetensors")]
    flipped = os.path.join(tmp, base + "-flipped.safetensors")
    data_f = bytearray(data)
    data_f[8 + n + b + (e - b) // 2] ^= 0x10
    with open(flipped, "wb") as f:
        f.write(data_f)
    for tool, args in (("ckpt-verify", [flipped]), ("ckpt-convert", [flipped, os.path.join(tmp, base + "-flipped-ck")])):
        p = tools.run(tool, *args, expect=1)
        out = p.stdout + p.stderr
        check(os.path.basename(flipped) in out and f"tensor '{name}'" in out and "block" in out,
              f"{tool} of a changed byte does not name the file, tensor and block: {out[-400:]}")
    # A tensor renamed in the header (same length): the header digest no longer matches.
    other = next(k for k in sorted(tensors) if k != name and len(k) > 1)
    renamed = other[:-1] + ("x" if other[-1] != "x" else "y")
    text = bytes(data[8:8 + n]).replace(json.dumps(other).encode() + b":", json.dumps(renamed).encode() + b":", 1)
    check(len(text) == n and text != bytes(data[8:8 + n]), "renaming a tensor in the header")
    hdr = os.path.join(tmp, base + "-renamed.safetensors")
    with open(hdr, "wb") as f:
        f.write(data[:8] + text + data[8 + n:])
    for tool, args in (("ckpt-verify", [hdr]), ("ckpt-convert", [hdr, os.path.join(tmp, base + "-renamed-ck")])):
        p = tools.run(tool, *args, expect=1)
        out = p.stdout + p.stderr
        check(os.path.basename(hdr) in out and "header digest mismatch" in out,
              f"{tool} of a renamed tensor does not say the header digest differs: {out[-400:]}")
    tools.run("ckpt-verify", path, expect=0)
    tools.run("ckpt-convert", path, os.path.join(tmp, base + "-ck"), expect=0)


def check_hub_layout(tmp_dir, stem, tensors, cap, what):
    """The files save_pretrained would write, and the index as transformers writes it."""
    names = sorted(tensors)
    sizes = [tensors[k][1].nbytes for k in names]
    plan = hub_plan(sizes, cap)
    index_path = os.path.join(tmp_dir, stem + ".safetensors.index.json")
    with open(index_path) as f:
        text = f.read()
    idx = json.loads(text)
    check(text == json.dumps(idx, indent=2, sort_keys=True) + "\n", f"{what}: index not written as transformers writes it")
    params = sum(tensors[k][1].size for k in names)  # transformers 5 writes total_parameters too
    check(set(idx) == {"metadata", "weight_map"} and idx["metadata"] == {"total_size": sum(sizes),
                                                                        "total_parameters": params},
          f"{what}: index metadata {idx.get('metadata')}, expected total_size {sum(sizes)}, total_parameters {params}")
    n = len(plan)
    want_map = {names[i]: f"{stem}-{s + 1:05d}-of-{n:05d}.safetensors" for s, group in enumerate(plan) for i in group}
    check(idx["weight_map"] == want_map, f"{what}: weight_map {idx['weight_map']}\n expected {want_map}")
    files = sorted(f for f in os.listdir(tmp_dir) if f.endswith(".safetensors"))
    check(files == sorted(set(want_map.values())), f"{what}: files {files}")
    for f in set(want_map.values()):
        held, meta = C.read_safetensors(os.path.join(tmp_dir, f))
        check(sorted(held) == sorted(k for k, v in want_map.items() if v == f), f"{what}: {f} holds {sorted(held)}")
        for k, (dt, shape, data) in held.items():
            st, arr, hshape = tensors[k]
            check(dt == st and list(shape) == list(hshape or arr.shape) and data == arr.tobytes(), f"{what}: {f}:{k}")
        total = sum(len(v[2]) for v in held.values())
        check(total <= cap or len(held) == 1, f"{what}: {f} holds {total} bytes, over the cap {cap}")
    return idx


def test_sharded(tools, tmp):
    rng = np.random.default_rng(13)
    t = sharded_tensors(rng)
    st, ck = to_ckpt(tools, tmp, "src", t, 3, {"format": "pt"})

    # ckpt -> sharded safetensors, cap 2500 bytes: a.big alone, then groups as the Hub's rule.
    out = os.path.join(tmp, "hub")
    os.makedirs(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write("{}\n")  # a model directory holds other files: they are left alone
    p = tools.run("ckpt-convert", ck, os.path.join(out, "model.safetensors"), "--max-shard-size", 2500, expect=0)
    check("safetensors" in p.stdout, f"report: {p.stdout}")
    check_hub_layout(out, "model", t, 2500, "cap 2500")
    check(os.path.exists(os.path.join(out, "config.json")), "config.json left alone")
    check(not [f for f in os.listdir(out) if f.startswith(".")], f"no staging left: {os.listdir(out)}")

    # ... and back: from the directory and from the index file, bit-exact.
    for src in (out, os.path.join(out, "model.safetensors.index.json")):
        ck2 = os.path.join(tmp, "back-" + str(len(os.listdir(tmp))))
        tools.run("ckpt-convert", src, ck2, expect=0)
        tools.run("ckpt-verify", ck2, expect=0)
        tools.run("ckpt-diff", ck, ck2, expect=0)
        tools.run("ckpt-diff", st, src, expect=0)
        back = ck2 + ".safetensors"
        tools.run("ckpt-convert", ck2, back, expect=0)
        rt, _ = C.read_safetensors(back)
        for k, (dt, arr, shape) in t.items():
            check(rt[k][0] == dt and rt[k][2] == arr.tobytes(), f"{src}: {k} not bit-exact after the round trip")
    tools.run("ckpt-verify", out, expect=0)
    j = tools.json("ckpt-inspect", out)
    check(len(j.get("keys", [])) == len(t), f"inspect of the Hub directory: {len(j.get('keys', []))} keys")
    check(not j.get("problems"), f"inspect of the Hub directory: problems {j.get('problems')}")

    # The Hub's cache: the snapshot's files are symlinks into blobs/. Read through them.
    snap = os.path.join(tmp, "cache", "snapshots", "0123abc")
    blobs = os.path.join(tmp, "cache", "blobs")
    os.makedirs(snap)
    os.makedirs(blobs)
    for i, f in enumerate(sorted(os.listdir(out))):
        shutil.copy(os.path.join(out, f), os.path.join(blobs, f"blob{i}"))
        os.symlink(os.path.join("..", "..", "blobs", f"blob{i}"), os.path.join(snap, f))
    tools.run("ckpt-diff", ck, snap, expect=0)
    j = tools.json("ckpt-inspect", snap)
    check(len(j.get("keys", [])) == len(t) and not j.get("problems"), f"inspect of a cache snapshot: {j.get('problems')}")

    # ckpt-merge writes it too, to an index DST (an index even for one shard).
    one = os.path.join(tmp, "one")
    tools.run("ckpt-merge", ck, os.path.join(one, "model.safetensors.index.json"), expect=0)
    check_hub_layout(one, "model", t, 5 * 10 ** 9, "index DST, default 5GB")
    check(sorted(os.listdir(one)) == ["model-00001-of-00001.safetensors", "model.safetensors.index.json"],
          f"one shard: {os.listdir(one)}")
    # A .safetensors DST whose tensors fit in one shard is that one file, no index (save_pretrained).
    for size in ("5GB", "500MB", "3MiB"):
        d = os.path.join(tmp, "fits-" + size)
        tools.run("ckpt-convert", ck, os.path.join(d, "model.safetensors"), "--max-shard-size", size, expect=0)
        check(os.listdir(d) == ["model.safetensors"], f"{size}: {os.listdir(d)}")
    tools.run("ckpt-convert", ck, os.path.join(tmp, "x.safetensors"), "--max-shard-size", "5XB", expect=2)
    tools.run("ckpt-convert", ck, os.path.join(tmp, "x-ckpt"), "--max-shard-size", "5GB", expect=2)
    check(not os.path.exists(os.path.join(tmp, "x-ckpt")), "--max-shard-size with a checkpoint DST: nothing written")

    # Again without --force: refused, nothing changed. With --force and a larger cap: the
    # shards of the earlier save that this one does not write are removed.
    before = sorted(os.listdir(out))
    tools.run("ckpt-convert", ck, os.path.join(out, "model.safetensors"), "--max-shard-size", 2500, expect=2)
    check(sorted(os.listdir(out)) == before, "refused save changed the directory")
    tools.run("ckpt-convert", ck, os.path.join(out, "model.safetensors"), "--max-shard-size", 6000, "--force", expect=0)
    check_hub_layout(out, "model", t, 6000, "cap 6000 over cap 2500")
    tools.run("ckpt-convert", ck, os.path.join(out, "model.safetensors"), "--max-shard-size", "10MB", "--force", expect=0)
    check(sorted(os.listdir(out)) == ["config.json", "model.safetensors"], f"one file replaces the shards: {os.listdir(out)}")
    return ck, t


def test_bad_index(tools, tmp, ck):
    src = os.path.join(tmp, "bad-src")
    tools.run("ckpt-convert", ck, os.path.join(src, "model.safetensors"), "--max-shard-size", 2500, expect=0)
    with open(os.path.join(src, "model.safetensors.index.json")) as f:
        idx = json.load(f)

    def broken(name, edit, expect):
        d = os.path.join(tmp, "bad-" + name)
        shutil.copytree(src, d)
        i = json.loads(json.dumps(idx))
        edit(i, d)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(i, f)
        for tool, args in (("ckpt-convert", [os.path.join(tmp, "bad-out-" + name)]), ("ckpt-verify", []),
                           ("ckpt-inspect", [])):
            p = tools.run(tool, d, *args, expect=1)
            said = p.stdout + p.stderr
            check(all(e in said for e in expect), f"{tool} {name}: {said!r}, expected {expect}")
        check(not os.path.exists(os.path.join(tmp, "bad-out-" + name)), f"{name}: nothing written")

    # A tensor of a shard holding others too (a.big is alone in its shard).
    first = next(k for k, f in sorted(idx["weight_map"].items()) if list(idx["weight_map"].values()).count(f) > 1)
    f0 = idx["weight_map"][first]
    other = next(f for f in idx["weight_map"].values() if f != f0)
    broken("moved", lambda i, d: i["weight_map"].__setitem__(first, other),
           [f"'{first}'", f0, other, "model.safetensors.index.json"])
    broken("missing", lambda i, d: i["weight_map"].pop(first), [f"'{first}'", "not in the weight_map"])
    broken("extra", lambda i, d: i["weight_map"].__setitem__("ghost", f0), ["'ghost'", "does not hold it"])
    broken("escape", lambda i, d: i["weight_map"].__setitem__(first, "../" + f0), ["not a plain file name"])
    broken("no-map", lambda i, d: i.pop("weight_map"), ["weight_map"])
    broken("size", lambda i, d: i["metadata"].__setitem__("total_size", "big"), ["total_size"])
    broken("shard-gone", lambda i, d: os.remove(os.path.join(d, other)), [other])
    # A shard that is not valid safetensors: named.
    broken("shard-bad", lambda i, d: open(os.path.join(d, other), "r+b").write(b"\xff" * 8), [other])


def test_unknown_in_shard(tools, tmp):
    """An unknown dtype inside a shard of the Hub layout: refused naming the shard and the tensor,
    or left out with --skip-unsupported."""
    d = os.path.join(tmp, "unknown-hub")
    os.makedirs(d)
    C.write_safetensors(os.path.join(d, "model-00001-of-00002.safetensors"),
                        {"a": ("F32", np.ones(3, np.float32))})
    C.write_safetensors(os.path.join(d, "model-00002-of-00002.safetensors"),
                        {"q": ("Q4_K", np.zeros(4, np.uint8)), "b": ("F4", np.ones((2,), np.uint8), [4])})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 18}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "q": "model-00002-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}, f)
    p = tools.run("ckpt-convert", d, os.path.join(tmp, "unknown-out"), expect=1)
    check("model-00002-of-00002.safetensors" in p.stderr and "'q'" in p.stderr and "Q4_K" in p.stderr,
          f"unknown dtype in a shard: {p.stderr!r}")
    out = os.path.join(tmp, "unknown-skipped")
    p = tools.run("ckpt-convert", d, out, "--skip-unsupported", expect=0)
    check("skipped tensor 'q'" in p.stderr, f"--skip-unsupported warning: {p.stderr!r}")
    j = tools.json("ckpt-inspect", out)
    check(sorted(k["key"] for k in j.get("keys", [])) == ["a", "b"], f"kept: {j.get('keys')}")


# ------------------------------------------------------------ the safetensors package

PKG_CHECK = r'''
import json, os, sys
import safetensors
from safetensors import deserialize
d, cap = sys.argv[1], int(sys.argv[2])
want = json.load(open(sys.argv[3]))
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
seen = {}
for f in sorted(set(idx["weight_map"].values())):
    with open(os.path.join(d, f), "rb") as fh:
        for name, t in deserialize(fh.read()):  # the Rust parser: offsets, alignment, F4 bit sizes
            assert idx["weight_map"][name] == f, (name, f)
            seen[name] = [t["dtype"], list(t["shape"]), bytes(t["data"]).hex()]
assert seen == want, "tensors differ from what was written"
try:
    import torch
    from safetensors.torch import load_file
    for f in sorted(set(idx["weight_map"].values())):
        got = load_file(os.path.join(d, f))
        for name, v in got.items():
            dt, shape, data = want[name]
            if dt == "F4":
                assert str(v.dtype) == "torch.float4_e2m1fn_x2" and list(v.shape) == shape[:-1] + [shape[-1] // 2], (name, v.dtype, v.shape)
            assert v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex() == data, name
    print("torch", torch.__version__, "loads every shard")
except ImportError:
    print("no torch in the venv: the torch load is not checked")
try:
    import numpy as np
    from huggingface_hub import split_numpy_state_dict_into_shards
    sd = {k: np.zeros(len(bytes.fromhex(v[2])), np.uint8) for k, v in sorted(want.items())}
    split = split_numpy_state_dict_into_shards(sd, max_shard_size=cap)
    assert split.tensor_to_filename == idx["weight_map"], (split.tensor_to_filename, idx["weight_map"])
    assert split.metadata.get("total_size") == idx["metadata"]["total_size"], split.metadata
    print("huggingface_hub plans the same shards")
except ImportError:
    print("no huggingface_hub in the venv: the shard plan is checked against hub_test.py's restatement only")
print("safetensors", safetensors.__version__, "reads every shard")
'''


def venv_python():
    venv = os.environ.get("CKPT_VENV") or os.path.expanduser("~/.cache/ckpt-venv")
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return None, f"no venv python at {py}"
    p = subprocess.run([py, "-c", "import safetensors"], capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"{py} has no safetensors package"
    return py, ""


def test_safetensors_package(tools, tmp, py):
    rng = np.random.default_rng(14)
    t = sharded_tensors(rng)
    _, ck = to_ckpt(tools, tmp, "pkg", t, 2)
    out = os.path.join(tmp, "pkg-hub")
    tools.run("ckpt-convert", ck, os.path.join(out, "model.safetensors"), "--max-shard-size", 2500, expect=0)
    want = {k: [dt, list(shape or arr.shape), arr.tobytes().hex()] for k, (dt, arr, shape) in t.items()}
    want_path = os.path.join(tmp, "pkg-want.json")
    with open(want_path, "w") as f:
        json.dump(want, f)
    p = subprocess.run([py, "-c", PKG_CHECK, out, "2500", want_path], capture_output=True, text=True, timeout=600)
    print(p.stdout, end="")
    check(p.returncode == 0, f"the safetensors package rejects what ckpt-convert wrote:\n{p.stdout}\n{p.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--safetensors-package", action="store_true")
    args = ap.parse_args()
    tools = C.Tools(args.bin)
    base = os.environ.get("CKPT_TEST_TMP")
    if base:
        os.makedirs(base, exist_ok=True)
    py = None
    if args.safetensors_package:
        py, why = venv_python()
        if not py:
            print(f"SKIP: {why} (scripts/test.sh makes it; set CKPT_VENV to use another)")
            return SKIP
    tmp = tempfile.mkdtemp(prefix="hub-", dir=base)
    try:
        if py:
            test_safetensors_package(tools, tmp, py)
        else:
            test_new_dtypes(tools, tmp)
            test_refused(tools, tmp)
            ck, _ = test_sharded(tools, tmp)
            test_bad_index(tools, tmp, ck)
            test_unknown_in_shard(tools, tmp)
    finally:
        status = C.finish(tmp, "all hub tests passed")
    return status


if __name__ == "__main__":
    sys.exit(main())
