#!/usr/bin/python3
"""Reads a corpus written by write_corpus with no ckpt code and checks it against
schemas/FORMAT.md: metadata.json validates with jsonschema, every chunk listed in metadata is
read with h5py and every tensor rebuilt equal to what was saved, dtype attributes, checksums,
statistics, dataset names, storage layout, replicas stored once, the shard index attribute.

Usage:
  check_corpus.py corpus <corpus-dir> <schema>   check every case under <corpus-dir>
  check_corpus.py schema <schema>                the schema rejects hand-broken documents

Needs Debian's python3-h5py, python3-numpy and python3-jsonschema (run with /usr/bin/python3).
Checksums use the `xxhash` module, else libxxhash through ctypes, else are skipped with a note.
zstd datasets are read through h5py when it has the filter (hdf5plugin); otherwise each HDF5
chunk is read raw and decoded here (libzstd through ctypes, then un-shuffled), else skipped.
"""
import copy
import ctypes
import ctypes.util
import json
import math
import os
import re
import sys

import h5py
import jsonschema
import numpy as np

NOTES = []


def note(msg):
    if msg not in NOTES:
        NOTES.append(msg)
        print("note: " + msg)


# ------------------------------------------------------------------ optional decoders

def _load_xxh3():
    try:
        import xxhash  # noqa: F401
        return lambda b: xxhash.xxh3_64_intdigest(b), "xxhash module"
    except ImportError:
        pass
    for name in ("xxhash", "libxxhash.so.0"):
        path = ctypes.util.find_library(name) or name
        try:
            lib = ctypes.CDLL(path)
            fn = lib.XXH3_64bits
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_uint64
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        return lambda b: fn(bytes(b), len(b)), "libxxhash via ctypes"
    return None, None


XXH3, XXH3_SOURCE = _load_xxh3()


def _load_zstd():
    for name in ("zstd", "libzstd.so.1"):
        path = ctypes.util.find_library(name) or name
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.ZSTD_decompress.restype = ctypes.c_size_t
        lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
        lib.ZSTD_isError.restype = ctypes.c_uint
        lib.ZSTD_isError.argtypes = [ctypes.c_size_t]

        def decompress(src, size):
            dst = ctypes.create_string_buffer(max(size, 1))
            n = lib.ZSTD_decompress(dst, size, src, len(src))
            if lib.ZSTD_isError(n):
                raise ValueError("zstd frame does not decode")
            return dst.raw[:n]
        return decompress
    return None


ZSTD_DECOMPRESS = _load_zstd()

try:
    import hdf5plugin  # noqa: F401  (registers the zstd filter with h5py)
except ImportError:
    pass


# ---------------------------------------------------------------------- the format

# FORMAT.md §4: dtype -> (numpy storage dtype, dtype attribute or None)
STORAGE = {
    "float64": ("<f8", None), "float32": ("<f4", None), "float16": ("<f2", None),
    "bfloat16": ("<u2", "bfloat16"), "float8_e4m3fn": ("u1", "float8_e4m3fn"),
    "float8_e5m2": ("u1", "float8_e5m2"), "int8": ("i1", None), "int16": ("<i2", None),
    "int32": ("<i4", None), "int64": ("<i8", None), "uint8": ("u1", None), "bool": ("u1", "bool"),
}
FLOATING = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
SHARD_NAME = re.compile(r"^shard-(\d{5})-of-(\d{5})\.h5$")
ZSTD_FILTER = 32015
SHUFFLE_FILTER = 2


def escape_key(key):
    """FORMAT.md §5.2."""
    s = key.replace("%", "%25").replace("/", "%2F").replace("@", "%40")
    return "%2E" + s[1:] if s.startswith(".") else s


def expected_dataset(key, shape, chunk):
    if list(chunk["offsets"]) == [0] * len(shape) and list(chunk["sizes"]) == list(shape):
        return escape_key(key)
    return escape_key(key) + "@" + ",".join(str(o) for o in chunk["offsets"])


def _e4m3fn_table():
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 0xF, b & 7
        if e == 0xF and m == 7:
            v = math.nan
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


E4M3FN = _e4m3fn_table()


def to_float64(dtype, raw):
    """Decodes raw little-endian bytes of a floating dtype into float64 values."""
    if dtype == "float64":
        return np.frombuffer(raw, "<f8").astype(np.float64)
    if dtype == "float32":
        return np.frombuffer(raw, "<f4").astype(np.float64)
    if dtype == "float16":
        return np.frombuffer(raw, "<f2").astype(np.float64)
    if dtype == "bfloat16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "float8_e5m2":
        return (np.frombuffer(raw, "u1").astype(np.uint16) << 8).view(np.float16).astype(np.float64)
    if dtype == "float8_e4m3fn":
        return E4M3FN[np.frombuffer(raw, "u1")]
    raise ValueError(dtype)


def close(a, b, rel=1e-6):
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def check_stats(err, where, dtype, raw, stats):
    v = to_float64(dtype, raw)
    nan = int(np.isnan(v).sum())
    inf = int(np.isinf(v).sum())
    fin = v[np.isfinite(v)]
    want = {"nan_count": nan, "inf_count": inf, "finite_count": int(fin.size)}
    for k, w in want.items():
        if stats.get(k) != w:
            err(f"{where}: stats.{k} is {stats.get(k)!r}, expected {w}")
    if fin.size == 0:  # FORMAT.md §7.3
        for k in ("min", "max", "mean"):
            if stats.get(k) is not None:
                err(f"{where}: stats.{k} is {stats.get(k)!r} with no finite element, expected null")
        if stats.get("l2") not in (0, None):
            err(f"{where}: stats.l2 is {stats.get('l2')!r} with no finite element, expected 0 or null")
        return
    exp = {"min": float(fin.min()), "max": float(fin.max()), "mean": float(fin.mean()),
           "l2": float(np.sqrt(np.sum(fin * fin)))}
    for k, w in exp.items():
        got = stats.get(k)
        if not isinstance(got, (int, float)) or not close(float(got), w):
            err(f"{where}: stats.{k} is {got!r}, expected {w!r}")


# -------------------------------------------------------------------- reading h5py

def h5_order_is_le(ds):
    t = ds.id.get_type()
    return t.get_size() == 1 or t.get_order() == h5py.h5t.ORDER_LE


def filters_of(ds):
    plist = ds.id.get_create_plist()
    return [plist.get_filter(i) for i in range(plist.get_nfilters())]


def read_raw_chunks(ds, storage_dtype):
    """Reads a chunked, shuffled+zstd dataset without the zstd filter: every HDF5 chunk raw,
    decoded here. Returns row-major bytes of the whole dataset."""
    shape = ds.shape
    cshape = ds.chunks
    item = np.dtype(storage_dtype).itemsize
    out = np.zeros(shape, dtype=storage_dtype)
    if 0 in shape:
        return out.tobytes()
    filters = [f[0] for f in filters_of(ds)]
    grid = [range(0, n, c) for n, c in zip(shape, cshape)]
    import itertools
    for offs in itertools.product(*grid):
        mask, data = ds.id.read_direct_chunk(offs)
        nelem = int(np.prod(cshape))
        for i in reversed(range(len(filters))):
            if mask & (1 << i):
                continue
            if filters[i] == ZSTD_FILTER:
                data = ZSTD_DECOMPRESS(data, nelem * item)
            elif filters[i] == SHUFFLE_FILTER:
                data = np.frombuffer(data, "u1").reshape(item, nelem).T.tobytes()
            else:
                raise ValueError(f"unexpected filter {filters[i]}")
        if len(data) != nelem * item:
            raise ValueError(f"chunk at {offs} decodes to {len(data)} bytes, expected {nelem * item}")
        block = np.frombuffer(data, storage_dtype).reshape(cshape)
        dst = tuple(slice(o, min(o + c, n)) for o, c, n in zip(offs, cshape, shape))
        src = tuple(slice(0, s.stop - s.start) for s in dst)
        out[dst] = block[src]
    return out.tobytes()


def read_dataset(ds, storage_dtype, compressed):
    """Row-major little-endian bytes of a dataset, or None if it cannot be read here."""
    if compressed and ds.chunks is not None:
        try:
            return np.ascontiguousarray(ds[()], dtype=storage_dtype).tobytes()
        except (OSError, ValueError):
            if ZSTD_DECOMPRESS is None:
                note("zstd datasets not read: no hdf5plugin for h5py and no libzstd for ctypes")
                return None
            note("h5py has no zstd filter (no hdf5plugin): zstd chunks read raw and decoded with libzstd")
            return read_raw_chunks(ds, storage_dtype)
    return np.ascontiguousarray(ds[()], dtype=storage_dtype).tobytes()


# ------------------------------------------------------------------------ one case

class Case:
    def __init__(self, corpus, name, validator):
        self.name = name
        self.dir = os.path.join(corpus, name)
        self.exp_dir = os.path.join(corpus, name + ".expected")
        self.validator = validator
        self.errors = []
        self.files = {}

    def err(self, msg):
        self.errors.append(f"{self.name}: {msg}")

    def raw(self, name):
        with open(os.path.join(self.exp_dir, name), "rb") as f:
            return f.read()

    def checksum(self, where, data, recorded):
        if XXH3 is None:
            note("checksums not recomputed: no xxhash module and no libxxhash")
            return
        want = "xxh3-64:%016x" % XXH3(data)
        if recorded != want:
            self.err(f"{where}: checksum {recorded!r}, recomputed {want!r}")

    def h5(self, name):
        if name not in self.files:
            self.files[name] = h5py.File(os.path.join(self.dir, name), "r")
        return self.files[name]

    def run(self):
        with open(os.path.join(self.exp_dir, "manifest.json")) as f:
            self.man = json.load(f)
        if not os.path.isfile(os.path.join(self.dir, "metadata.json")):
            self.err("no metadata.json: the writer did not commit this checkpoint")
            return
        with open(os.path.join(self.dir, "metadata.json"), "rb") as f:
            self.meta = json.loads(f.read().decode("utf-8"))
        for e in sorted(self.validator.iter_errors(self.meta), key=lambda e: list(e.path)):
            path = "/".join(str(p) for p in e.absolute_path)
            self.err(f"metadata.json does not validate at '{path}': {e.message[:300]}")
        try:
            self.check_top()
            self.check_files()
            self.check_tensors()
            self.check_non_tensors()
            self.check_shard_contents()
        finally:
            for f in self.files.values():
                f.close()

    def check_top(self):
        m, man = self.meta, self.man
        for k, want in (("format", "ckpt"), ("format_version", 1), ("world_size", man["world_size"]),
                        ("state_dict_type", man["state_dict_type"])):
            if m.get(k) != want:
                self.err(f"metadata.json: {k} is {m.get(k)!r}, expected {want!r}")
        if not isinstance(m.get("user"), dict) or m["user"].get("case") != self.name:
            self.err(f"metadata.json: user is {m.get('user')!r}, expected the saved object with case={self.name!r}")
        if man["world_size"] == 4 and man["writer"] == "Save" and m.get("mesh") != {"shape": [2, 2], "dims": ["dp", "tp"]}:
            self.err(f"metadata.json: mesh is {m.get('mesh')!r}, expected the saved mesh")
        keys = [t["key"] for t in man["tensors"]] + [s["key"] for s in man["scalars"]] + \
               [b["key"] for b in man["bytes"]] + [j["key"] for j in man["json"]]
        got = set(m.get("entries", {}))
        if got != set(keys):
            self.err(f"metadata.json: entries missing {sorted(set(keys) - got)}, unexpected {sorted(got - set(keys))}")

    def check_files(self):
        listed = self.meta.get("files", [])
        names = [f.get("name") for f in listed]
        if len(set(names)) != len(names):
            self.err(f"files lists a name twice: {names}")
        for f in listed:
            p = os.path.join(self.dir, f["name"])
            if not SHARD_NAME.match(f["name"]):
                self.err(f"file name {f['name']!r} is not shard-RRRRR-of-WWWWW.h5")
            if not os.path.isfile(p) or os.path.islink(p):
                self.err(f"{f['name']}: listed in files but not a regular file")
                continue
            if os.path.getsize(p) != f["bytes"]:
                self.err(f"{f['name']}: files[].bytes is {f['bytes']}, the file has {os.path.getsize(p)}")
        extra = sorted(set(os.listdir(self.dir)) - set(names) - {"metadata.json"})
        if extra:
            self.err(f"checkpoint directory holds unlisted entries {extra}")
        parent = os.path.dirname(self.dir)
        tmp = [n for n in os.listdir(parent) if n.startswith("." + self.name + ".ckpt-tmp-")]
        if tmp:
            self.err(f"temporary directories left beside the checkpoint: {tmp}")

    def chunk_dataset(self, where, file, dataset, dtype, shape, compressed):
        """Opens the dataset of a chunk, checks its type, extent, attributes and layout."""
        if file not in self.files and not os.path.isfile(os.path.join(self.dir, file)):
            self.err(f"{where}: file {file!r} does not exist")
            return None
        f = self.h5(file)
        if dataset not in f:
            self.err(f"{where}: dataset {dataset!r} not in {file}")
            return None
        ds = f[dataset]
        storage, attr = STORAGE[dtype]
        if ds.dtype != np.dtype(storage) or not h5_order_is_le(ds):
            self.err(f"{where}: HDF5 type {ds.dtype.str} (order LE={h5_order_is_le(ds)}), expected {storage}")
        if list(ds.shape) != list(shape):
            self.err(f"{where}: extent {list(ds.shape)}, expected {list(shape)}")
        if len(shape) == 0 and ds.id.get_space().get_simple_extent_type() != h5py.h5s.SCALAR:
            self.err(f"{where}: a 0-D chunk must have a scalar dataspace")
        got_attr = ds.attrs.get("dtype")
        if isinstance(got_attr, bytes):
            got_attr = got_attr.decode()
        if attr is not None and got_attr != attr:
            self.err(f"{where}: dtype attribute {got_attr!r}, expected {attr!r}")
        if attr is None and got_attr is not None and got_attr != dtype:
            self.err(f"{where}: dtype attribute {got_attr!r} on a {dtype} dataset")
        filters = [x[0] for x in filters_of(ds)]
        if compressed:
            if ds.chunks is None or filters != [SHUFFLE_FILTER, ZSTD_FILTER]:
                self.err(f"{where}: compressed chunk has layout chunks={ds.chunks} filters={filters}, "
                         f"expected chunked with [shuffle(2), zstd(32015)]")
            else:
                level = filters_of(ds)[1][2]
                if not level or level[0] != self.man["compression_level"]:
                    self.err(f"{where}: zstd cd_values {level}, expected [{self.man['compression_level']}]")
        elif ds.chunks is not None or filters:
            self.err(f"{where}: uncompressed chunk is not contiguous (chunks={ds.chunks}, filters={filters})")
        return ds

    def check_tensors(self):
        entries = self.meta.get("entries", {})
        for t in self.man["tensors"]:
            key, dtype, shape = t["key"], t["dtype"], t["shape"]
            e = entries.get(key)
            if e is None:
                continue
            where = f"tensor {key!r}"
            if e.get("type") != "tensor" or e.get("dtype") != dtype or e.get("shape") != shape:
                self.err(f"{where}: recorded as {e.get('type')} {e.get('dtype')} {e.get('shape')}, "
                         f"expected tensor {dtype} {shape}")
                continue
            storage = STORAGE[dtype][0]
            item = np.dtype(storage).itemsize
            expected = np.frombuffer(self.raw(t["raw"]), storage).reshape(shape)
            rebuilt = np.zeros(shape, dtype=storage)
            unreadable = False
            covered = np.zeros(shape, dtype=np.int32)
            chunks = e.get("chunks", [])
            if t["replicated"] and len(chunks) != 1:
                self.err(f"{where}: replicated tensor has {len(chunks)} chunks in metadata, expected 1")
            for i, c in enumerate(chunks):
                cw = f"{where} chunk {i} {c.get('offsets')}+{c.get('sizes')}"
                offs, sizes = c["offsets"], c["sizes"]
                if len(offs) != len(shape) or len(sizes) != len(shape) or any(
                        o < 0 or s < 0 or o + s > n for o, s, n in zip(offs, sizes, shape)):
                    self.err(f"{cw}: outside the tensor's shape {shape}")
                    continue
                want_name = expected_dataset(key, shape, c)
                if c["dataset"] != want_name:
                    self.err(f"{cw}: dataset named {c['dataset']!r}, expected {want_name!r}")
                nelem = int(np.prod(sizes)) if sizes else 1
                compressed = "compression" in c
                want_compressed = self.man["compressed"] and len(shape) > 0 and nelem > 0
                if compressed != want_compressed:
                    self.err(f"{cw}: compression recorded {c.get('compression')}, expected "
                             f"{'zstd' if want_compressed else 'none'}")
                if compressed and c["compression"] != {"codec": "zstd", "level": self.man["compression_level"],
                                                       "shuffle": True}:
                    self.err(f"{cw}: compression {c['compression']}")
                ds = self.chunk_dataset(cw, c["file"], c["dataset"], dtype, sizes, compressed)
                if ds is None:
                    continue
                if ds.id.get_storage_size() != c["stored_bytes"]:
                    self.err(f"{cw}: stored_bytes {c['stored_bytes']}, HDF5 storage size {ds.id.get_storage_size()}")
                if not compressed and c["stored_bytes"] != nelem * item:
                    self.err(f"{cw}: stored_bytes {c['stored_bytes']}, expected {nelem * item} uncompressed")
                data = read_dataset(ds, storage, compressed)
                if data is None:
                    covered[tuple(slice(o, o + s) for o, s in zip(offs, sizes))] += 1
                    unreadable = True
                    continue
                if len(data) != nelem * item:
                    self.err(f"{cw}: dataset holds {len(data)} bytes, expected {nelem * item}")
                    continue
                self.checksum(cw, data, c["checksum"])
                if dtype in FLOATING:
                    if "stats" not in c:
                        self.err(f"{cw}: floating chunk has no stats")
                    else:
                        check_stats(self.err, cw, dtype, data, c["stats"])
                elif "stats" in c:
                    self.err(f"{cw}: {dtype} chunk has stats")
                region = tuple(slice(o, o + s) for o, s in zip(offs, sizes))
                rebuilt[region] = np.frombuffer(data, storage).reshape(sizes)
                covered[region] += 1
            if covered.size and (covered != 1).any():
                self.err(f"{where}: chunks do not tile the shape: {int((covered == 0).sum())} elements "
                         f"uncovered, {int((covered > 1).sum())} covered more than once")
            if not unreadable and rebuilt.tobytes() != expected.tobytes():
                bad = np.argwhere(rebuilt.reshape(shape) != expected) if shape else []
                self.err(f"{where}: rebuilt tensor differs from what was saved (first index {bad[0].tolist() if len(bad) else '?'})")

    def check_non_tensors(self):
        entries = self.meta.get("entries", {})
        for s in self.man["scalars"]:
            e = entries.get(s["key"])
            if e is None:
                continue
            where = f"scalar {s['key']!r}"
            v = e.get("value")
            if e.get("type") != "scalar" or e.get("dtype") != s["dtype"]:
                self.err(f"{where}: recorded as {e.get('type')} {e.get('dtype')}, expected scalar {s['dtype']}")
            elif s["dtype"] == "bool":
                if v is not bool(s["value"]):
                    self.err(f"{where}: value {v!r}, expected JSON boolean {bool(s['value'])!r} (FORMAT.md §9.5)")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or v != s["value"]:
                self.err(f"{where}: value {v!r}, expected {s['value']!r}")
            elif s["dtype"] not in FLOATING and not isinstance(v, int):
                self.err(f"{where}: integer scalar written as {v!r}, expected a JSON integer")
        for b in self.man["bytes"]:
            e = entries.get(b["key"])
            if e is None:
                continue
            where = f"bytes {b['key']!r}"
            want = self.raw(b["raw"])
            if e.get("type") != "bytes" or e.get("size") != len(want):
                self.err(f"{where}: recorded as {e.get('type')} size {e.get('size')}, expected bytes size {len(want)}")
                continue
            if e["dataset"] != escape_key(b["key"]):
                self.err(f"{where}: dataset {e['dataset']!r}, expected {escape_key(b['key'])!r}")
            if not os.path.isfile(os.path.join(self.dir, e["file"])) or e["dataset"] not in self.h5(e["file"]):
                self.err(f"{where}: dataset {e['dataset']!r} not found in {e['file']!r}")
                continue
            ds = self.h5(e["file"])[e["dataset"]]
            if ds.dtype != np.dtype("u1") or len(ds.shape) != 1:
                self.err(f"{where}: dataset is {ds.dtype} {ds.shape}, expected 1-D uint8")
                continue
            data = np.ascontiguousarray(ds[()], dtype="u1").tobytes()
            if data != want:
                self.err(f"{where}: content differs from what was saved")
            self.checksum(where, data, e["checksum"])
        for j in self.man["json"]:
            e = entries.get(j["key"])
            if e is not None and (e.get("type") != "json" or e.get("value") != j["value"]):
                self.err(f"json {j['key']!r}: recorded {e!r}, expected value {j['value']!r}")

    def check_shard_contents(self):
        """Every dataset in every shard is one listed chunk or blob (so a replicated region is
        stored once), and each shard's ckpt_shard_index lists exactly its tensor chunks."""
        listed = {}  # file -> {dataset: (key, chunk or None)}
        for key, e in self.meta.get("entries", {}).items():
            for c in e.get("chunks", []) if e.get("type") == "tensor" else []:
                listed.setdefault(c["file"], {})
                if c["dataset"] in listed[c["file"]]:
                    self.err(f"{c['file']}: dataset {c['dataset']!r} listed twice in metadata")
                listed[c["file"]][c["dataset"]] = (key, e, c)
            if e.get("type") == "bytes":
                listed.setdefault(e["file"], {})[e["dataset"]] = (key, None, None)
        for fmeta in self.meta.get("files", []):
            name = fmeta["name"]
            if not os.path.isfile(os.path.join(self.dir, name)):
                continue
            f = self.h5(name)
            present = set()
            f.visit(present.add)
            want = set(listed.get(name, {}))
            if present != want:
                self.err(f"{name}: holds objects {sorted(present - want)} not in metadata and lacks "
                         f"{sorted(want - present)}")
            idx = f.attrs.get("ckpt_shard_index")
            if idx is None:
                self.err(f"{name}: no root attribute ckpt_shard_index")
                continue
            if isinstance(idx, bytes):
                idx = idx.decode()
            try:
                idx = json.loads(idx)
            except ValueError as ex:
                self.err(f"{name}: ckpt_shard_index is not JSON: {ex}")
                continue
            if idx.get("format") != "ckpt-shard" or idx.get("format_version") != 1:
                self.err(f"{name}: ckpt_shard_index header {idx.get('format')!r} v{idx.get('format_version')!r}")
            got, exp = [], []  # FORMAT.md §5.5: tensor chunks and bytes entries
            for c in idx.get("chunks", []):
                fields = ("key", "dtype", "size", "dataset") if c.get("dtype") == "bytes" else \
                         ("key", "dtype", "shape", "offsets", "sizes", "dataset")
                got.append(json.dumps({f: c.get(f) for f in fields}, sort_keys=True))
            for key, e, c in listed.get(name, {}).values():
                if c is None:
                    b = self.meta["entries"][key]
                    exp.append(json.dumps({"key": key, "dtype": "bytes", "size": b["size"],
                                           "dataset": b["dataset"]}, sort_keys=True))
                else:
                    exp.append(json.dumps({"key": key, "dtype": e["dtype"], "shape": e["shape"],
                                           "offsets": c["offsets"], "sizes": c["sizes"],
                                           "dataset": c["dataset"]}, sort_keys=True))
            got.sort()
            exp.sort()
            if got != exp:
                diff = sorted(set(got) ^ set(exp))[:3]
                self.err(f"{name}: ckpt_shard_index chunks differ from metadata "
                         f"(index has {len(got)}, metadata {len(exp)}; differing: {diff})")
        for t in self.man["tensors"]:
            if not t["replicated"]:
                continue
            esc = escape_key(t["key"])
            count = 0
            for fmeta in self.meta.get("files", []):
                if os.path.isfile(os.path.join(self.dir, fmeta["name"])):
                    count += sum(1 for n in self.h5(fmeta["name"]) if n == esc or n.startswith(esc + "@"))
            if count != 1:
                self.err(f"replicated tensor {t['key']!r} stored in {count} datasets across the shards, expected 1")


def check_corpus(corpus, schema_path):
    with open(schema_path) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    names = sorted(n[:-len(".expected")] for n in os.listdir(corpus) if n.endswith(".expected"))
    if not names:
        print(f"FAIL: no cases under {corpus}")
        return 1
    print(f"checksums: {XXH3_SOURCE or 'not checked'}")
    errors = []
    for name in names:
        case = Case(corpus, name, validator)
        case.run()
        print(f"{'ok  ' if not case.errors else 'FAIL'} {name}" +
              (f" ({len(case.errors)} problems)" if case.errors else ""))
        errors += case.errors
    for e in errors:
        print("  " + e)
    return 1 if errors else 0


# --------------------------------------------------------------- schema negatives

def valid_document():
    return {
        "format": "ckpt", "format_version": 1, "state_dict_type": "SHARDED", "world_size": 2,
        "library_version": "0.1.0", "created": "2026-11-29T18:40:00Z", "mesh": None,
        "user": {"run": "x"},
        "files": [{"name": "shard-00000-of-00002.h5", "rank": 0, "bytes": 4096},
                  {"name": "shard-00001-of-00002.h5", "rank": 1, "bytes": 4096}],
        "entries": {
            "model.w": {"type": "tensor", "dtype": "bfloat16", "shape": [4, 2], "chunks": [
                {"offsets": [0, 0], "sizes": [2, 2], "file": "shard-00000-of-00002.h5",
                 "dataset": "model.w@0,0", "checksum": "xxh3-64:0123456789abcdef", "stored_bytes": 8,
                 "stats": {"min": -1.0, "max": 1.0, "mean": 0.0, "l2": 2.0, "nan_count": 0,
                           "inf_count": 0, "finite_count": 4}},
                {"offsets": [2, 0], "sizes": [2, 2], "file": "shard-00001-of-00002.h5",
                 "dataset": "model.w@2,0", "checksum": "xxh3-64:fedcba9876543210", "stored_bytes": 7,
                 "compression": {"codec": "zstd", "level": 3, "shuffle": True},
                 "stats": {"min": None, "max": None, "mean": None, "l2": None, "nan_count": 4,
                           "inf_count": 0, "finite_count": 0}}]},
            "step": {"type": "scalar", "dtype": "int64", "value": 100},
            "flag": {"type": "scalar", "dtype": "bool", "value": True},
            "rng": {"type": "bytes", "size": 16, "file": "shard-00000-of-00002.h5", "dataset": "rng",
                    "checksum": "xxh3-64:00000000000000ff", "stored_bytes": 16},
            "config": {"type": "json", "value": {"lr": 0.001, "nested": [1, None]}},
        },
    }


def check_schema_rejects(schema_path):
    with open(schema_path) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    problems = []
    good = valid_document()
    for e in v.iter_errors(good):
        problems.append(f"the valid document is rejected: {e.message}")

    def broken(label, mutate):
        d = copy.deepcopy(good)
        mutate(d)
        if v.is_valid(d):
            problems.append(f"schema accepts a document with {label}")
        else:
            print(f"ok   rejects {label}")

    E = "entries"
    broken("format 'ckpz'", lambda d: d.update(format="ckpz"))
    broken("format_version 2", lambda d: d.update(format_version=2))
    broken("state_dict_type 'PARTIAL'", lambda d: d.update(state_dict_type="PARTIAL"))
    broken("world_size 0", lambda d: d.update(world_size=0))
    broken("no entries", lambda d: d.pop("entries"))
    broken("an unknown top-level member", lambda d: d.update(extra=1))
    broken("checksum without algorithm", lambda d: d[E]["model.w"]["chunks"][0].update(checksum="0123456789abcdef"))
    broken("checksum of 15 hex digits", lambda d: d[E]["model.w"]["chunks"][0].update(checksum="xxh3-64:0123456789abcde"))
    broken("checksum in upper case", lambda d: d[E]["model.w"]["chunks"][0].update(checksum="xxh3-64:0123456789ABCDEF"))
    broken("checksum of another algorithm", lambda d: d[E]["rng"].update(checksum="crc32:01234567"))
    broken("chunk file '../shard-00000-of-00002.h5'",
           lambda d: d[E]["model.w"]["chunks"][0].update(file="../shard-00000-of-00002.h5"))
    broken("chunk file 'sub/shard-00000-of-00002.h5'",
           lambda d: d[E]["model.w"]["chunks"][0].update(file="sub/shard-00000-of-00002.h5"))
    broken("files[].name with '/'", lambda d: d["files"][0].update(name="/etc/shard-00000-of-00002.h5"))
    broken("files[].name '..'", lambda d: d["files"][1].update(name=".."))
    broken("bytes file with '/'", lambda d: d[E]["rng"].update(file="a/shard-00000-of-00002.h5"))
    broken("dataset with '/'", lambda d: d[E]["model.w"]["chunks"][0].update(dataset="grp/model.w"))
    broken("dtype 'float128'", lambda d: d[E]["model.w"].update(dtype="float128"))
    broken("negative extent", lambda d: d[E]["model.w"].update(shape=[-4, 2]))
    broken("rank 33", lambda d: d[E]["model.w"].update(shape=[1] * 33))
    broken("an unknown chunk member", lambda d: d[E]["model.w"]["chunks"][0].update(owner=3))
    broken("a chunk without checksum", lambda d: d[E]["model.w"]["chunks"][0].pop("checksum"))
    broken("codec 'lz4'", lambda d: d[E]["model.w"]["chunks"][1]["compression"].update(codec="lz4"))
    broken("negative nan_count", lambda d: d[E]["model.w"]["chunks"][0]["stats"].update(nan_count=-1))
    broken("entry type 'pickle'", lambda d: d[E]["step"].update(type="pickle"))
    broken("string scalar value", lambda d: d[E]["step"].update(value="100"))
    broken("an empty key", lambda d: d[E].update({"": {"type": "json", "value": 1}}))
    broken("created not in UTC", lambda d: d.update(created="2026-11-29 18:40"))
    for p in problems:
        print("FAIL " + p)
    return 1 if problems else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "corpus":
        rc = check_corpus(argv[2], argv[3])
    elif len(argv) == 3 and argv[1] == "schema":
        rc = check_schema_rejects(argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
