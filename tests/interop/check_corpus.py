#!/usr/bin/python3
"""Reads checkpoints with no ckpt code and checks them against schemas/FORMAT.md (versions 1
and 2, through ckpt_format.py): metadata.json and every shard index validate with jsonschema,
the metadata digest and every index digest hold, every tensor is rebuilt from its layout and
the index records (or, v1, its chunk list) equal to what was saved, every block digest and
chunk checksum is recomputed with xxhash, dtype attributes, statistics (per chunk and the
aggregates), dataset names, storage layout and offsets, replicas stored once.

Usage:
  check_corpus.py corpus <dir> <schema> [--version N]
        check every case under <dir> (<case>/ beside <case>.expected/, the manifest format of
        write_corpus.cc); with --version, every case must be of format_version N
  check_corpus.py schema <schema>
        the schemas (<schema> and shard_index.schema.json beside it) accept valid documents
        and reject hand-broken ones, for both versions
  check_corpus.py verify <checkpoint> <schema>
        any checkpoint, without expected values: the chain of trust, every chunk read and
        verified (blocks, checksums), chunks tiling every tensor, every blob
  check_corpus.py selftest <scratch> <schema>
        write_golden.py's hand-made v2 checkpoints pass, and each of a set of corruptions
        (a flipped data byte, scalar, key, index offset, a missing record...) is reported

Needs Debian's python3-h5py, python3-numpy, python3-jsonschema and python3-xxhash.
"""
import copy
import json
import math
import os
import re
import shutil
import sys

import h5py
import jsonschema
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_format as F  # noqa: E402

SHARD_NAME = re.compile(r"^shard-(\d{5})-of-(\d{5})\.h5$")


def close(a, b, rel=1e-6):
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def step_describes(sizes):
    """Whether the step rule (FORMAT.md §3.3) gives these part sizes."""
    n, s = sum(sizes), sizes[0]
    if n == 0:
        return sizes == [0]
    return s > 0 and [min(s, n - o) for o in range(0, n, s)] == sizes


def affine_fit(layout, shape, chunks):
    """The affine cell->file map {"base", "strides"} that gives every chunk's file (FORMAT.md
    §3.3), or None if none does."""
    try:
        parts = [F.split_parts(sp, n) for sp, n in zip(layout["grid"], shape)]
    except F.LayoutError:
        return None
    starts = [{o: j for j, (o, _) in enumerate(p)} for p in parts]
    rows = [[1] + [starts[d][o] for d, o in enumerate(c.offsets)] for c in chunks]
    files = [c.file_index for c in chunks]
    if not rows:
        return None
    sol = np.linalg.lstsq(np.array(rows, dtype=np.float64), np.array(files, dtype=np.float64), rcond=None)[0]
    coef = [int(round(x)) for x in sol]
    if any(sum(a * b for a, b in zip(coef, r)) != f for r, f in zip(rows, files)):
        return None
    return {"base": coef[0], "strides": coef[1:]}


def compare_stats(err, where, got, want, rel=1e-6):
    for k in ("nan_count", "inf_count", "finite_count"):
        if got.get(k) != want[k]:
            err(f"{where}: stats.{k} is {got.get(k)!r}, expected {want[k]}")
    if want["finite_count"] == 0:  # FORMAT.md §7.3
        for k in ("min", "max", "mean"):
            if got.get(k) is not None:
                err(f"{where}: stats.{k} is {got.get(k)!r} with no finite element, expected null")
        if got.get("l2") not in (0, None):
            err(f"{where}: stats.l2 is {got.get('l2')!r} with no finite element, expected 0 or null")
        return
    scale = max(abs(want["min"]), abs(want["max"]))  # a mean near 0 is compared to the values' size
    for k in ("min", "max", "mean", "l2"):
        g, w = got.get(k), want[k]
        if w is None:
            if g is not None:
                err(f"{where}: stats.{k} is {g!r}, expected null")
        elif isinstance(g, bool) or not isinstance(g, (int, float)) or not (
                close(float(g), w, rel) or k == "mean" and abs(float(g) - w) <= rel * scale):
            err(f"{where}: stats.{k} is {g!r}, expected {w!r}")


def validators(schema_path):
    out = []
    for p in (schema_path, os.path.join(os.path.dirname(schema_path), "shard_index.schema.json")):
        with open(p) as f:
            schema = json.load(f)
        jsonschema.Draft202012Validator.check_schema(schema)
        out.append(jsonschema.Draft202012Validator(schema))
    return out


# ------------------------------------------------------------------------ one case

class Case:
    def __init__(self, corpus, name, validators, version=None):
        self.name = name
        self.dir = os.path.join(corpus, name)
        self.exp_dir = os.path.join(corpus, name + ".expected")
        self.validators = validators
        self.want_version = version
        self.errors = []

    def err(self, msg):
        self.errors.append(f"{self.name}: {msg}")

    def raw(self, name):
        with open(os.path.join(self.exp_dir, name), "rb") as f:
            return f.read()

    def run(self):
        with open(os.path.join(self.exp_dir, "manifest.json")) as f:
            self.man = json.load(f)
        if not os.path.isfile(os.path.join(self.dir, "metadata.json")):
            self.err("no metadata.json: the writer did not commit this checkpoint")
            return
        self.ck = F.Checkpoint(self.dir, *self.validators, err=self.err)
        if self.ck.meta is None:
            return
        self.meta = self.ck.meta
        try:
            self.check_top()
            self.check_files()
            self.check_tensors()
            self.check_non_tensors()
            self.check_shard_contents()
        finally:
            self.ck.close()

    def check_top(self):
        m, man = self.meta, self.man
        want = [("format", "ckpt"), ("world_size", man["world_size"]), ("state_dict_type", man["state_dict_type"])]
        if self.want_version is not None:
            want.append(("format_version", self.want_version))
        for k, w in want:
            if m.get(k) != w:
                self.err(f"metadata.json: {k} is {m.get(k)!r}, expected {w!r}")
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

    def check_dataset(self, c, ds, dtype, compressed):
        """A chunk's dataset: HDF5 type, extent, dtype attribute, storage layout, offset."""
        where = c.where()
        storage, attr = F.STORAGE[dtype]
        shape = c.sizes
        if ds.dtype != np.dtype(storage) or not F.h5_order_is_le(ds):
            self.err(f"{where}: HDF5 type {ds.dtype.str} (order LE={F.h5_order_is_le(ds)}), expected {storage}")
        if list(ds.shape) != list(shape):
            self.err(f"{where}: extent {list(ds.shape)}, expected {list(shape)}")
        if len(shape) == 0 and ds.id.get_space().get_simple_extent_type() != h5py.h5s.SCALAR:
            self.err(f"{where}: a 0-D chunk must have a scalar dataspace")
        got_attr = ds.attrs.get("dtype")
        if got_attr is not None and not isinstance(got_attr, bytes):  # FORMAT.md §4.2: a byte string
            self.err(f"{where}: dtype attribute {got_attr!r} is not a fixed-length string (h5py gives bytes)")
        got_attr = got_attr.decode() if isinstance(got_attr, bytes) else got_attr
        if attr is not None and got_attr != attr:
            self.err(f"{where}: dtype attribute {got_attr!r}, expected {attr!r}")
        if attr is None and got_attr is not None and got_attr != dtype:
            self.err(f"{where}: dtype attribute {got_attr!r} on a {dtype} dataset")
        self.check_storage(c, ds, compressed)

    def check_storage(self, c, ds, compressed):
        where = c.where()
        filters = [x[0] for x in F.filters_of(ds)]
        if compressed:
            if ds.chunks is None or filters != [F.SHUFFLE_FILTER, F.ZSTD_FILTER]:
                self.err(f"{where}: compressed chunk has layout chunks={ds.chunks} filters={filters}, "
                         f"expected chunked with [shuffle(2), zstd(32015)]")
            else:
                level = F.filters_of(ds)[1][2]
                if not level or level[0] != self.man["compression_level"]:
                    self.err(f"{where}: zstd cd_values {level}, expected [{self.man['compression_level']}]")
        elif ds.chunks is not None or filters:
            self.err(f"{where}: uncompressed chunk is not contiguous (chunks={ds.chunks}, filters={filters})")
        if ds.id.get_storage_size() != c.stored_bytes:
            self.err(f"{where}: stored_bytes {c.stored_bytes}, HDF5 storage size {ds.id.get_storage_size()}")
        if self.ck.version == 2:  # FORMAT.md §5.5: offset for every contiguous dataset with data, only
            contiguous = ds.chunks is None and ds.id.get_storage_size() > 0
            want = ds.id.get_offset() if contiguous else None
            if c.offset != want:
                self.err(f"{where}: offset {c.offset!r}, expected {want!r} (H5Dget_offset)")

    def check_layout(self, key, e, chunks):
        """v2: a writer describes chunks that form a grid as one, with the step rule when every
        part but the last has one size (FORMAT.md §3.3), and the aggregate stats (§7.4)."""
        lay, shape = e.get("layout", {}), e.get("shape", [])
        parts = F.describe_grid(shape, [(c.offsets, c.sizes) for c in chunks])
        if parts is not None and "chunks" in lay:
            self.err(f"tensor {key!r}: explicit layout for chunks that form a grid "
                     f"(parts {[[s for _, s in p] for p in parts]})")
        for d, split in enumerate(lay.get("grid", [])):
            sizes = split.get("sizes")
            if sizes and all(F.is_int(x) for x in sizes) and step_describes(sizes):
                self.err(f"tensor {key!r}: dim {d} split by sizes {sizes}, which the step rule "
                         f"{{\"step\": {sizes[0]}}} describes")
        if isinstance(lay.get("files"), list) and 0 not in shape and affine_fit(lay, shape, chunks) is not None:
            self.err(f"tensor {key!r}: cell->file list where the affine map {affine_fit(lay, shape, chunks)} fits")
        stats = [c.stats for c in chunks]
        if e.get("dtype") in F.FLOATING and chunks and all(stats):
            if "stats" not in e:
                self.err(f"tensor {key!r}: every chunk has stats but the entry has no aggregate (§7.4)")
            else:
                compare_stats(self.err, f"tensor {key!r} aggregate", e["stats"], F.aggregate_stats(stats), 1e-9)
        elif "stats" in e:
            self.err(f"tensor {key!r}: aggregate stats without stats on every chunk (§7.4)")

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
            storage = F.STORAGE[dtype][0]
            item = np.dtype(storage).itemsize
            expected = np.frombuffer(self.raw(t["raw"]), storage).reshape(shape)
            rebuilt = np.zeros(shape, dtype=storage)
            unreadable = False
            covered = np.zeros(shape, dtype=np.int32)
            chunks = self.ck.tensors.get(key, [])
            if t["replicated"] and len(chunks) != 1:
                self.err(f"{where}: replicated tensor has {len(chunks)} chunks, expected 1")
            for c in chunks:
                cw = c.where()
                offs, sizes = c.offsets, c.sizes
                if len(offs) != len(shape) or len(sizes) != len(shape) or any(
                        o < 0 or s < 0 or o + s > n for o, s, n in zip(offs, sizes, shape)):
                    self.err(f"{cw}: outside the tensor's shape {shape}")
                    continue
                packed = c.pack_offset is not None  # FORMAT.md §5.7: `dataset` names its pack
                want_name = F.dataset_name(key, shape, offs, sizes)
                if packed and not F.PACK_NAME.match(c.dataset or ""):
                    self.err(f"{cw}: packed chunk names {c.dataset!r}, not a pack (.ckpt_pack.<n>)")
                elif not packed and c.dataset != want_name:
                    self.err(f"{cw}: dataset named {c.dataset!r}, expected {want_name!r}")
                nelem = int(np.prod(sizes)) if sizes else 1
                compressed = c.compression is not None
                want_compressed = self.man["compressed"] and len(shape) > 0 and nelem > 0
                if compressed != want_compressed:
                    self.err(f"{cw}: compression recorded {c.compression}, expected "
                             f"{'zstd' if want_compressed else 'none'}")
                if compressed and c.compression != {"codec": "zstd", "level": self.man["compression_level"],
                                                    "shuffle": True}:
                    self.err(f"{cw}: compression {c.compression}")
                ds = self.ck.dataset(c)
                if ds is None:
                    continue
                if not packed:  # a pack's dataset is checked by read_chunk and check_packs
                    self.check_dataset(c, ds, dtype, compressed)
                if not compressed and c.stored_bytes != nelem * item:
                    self.err(f"{cw}: stored_bytes {c.stored_bytes}, expected {nelem * item} uncompressed")
                data = self.ck.read_chunk(c, dtype)
                region = tuple(slice(o, o + s) for o, s in zip(offs, sizes))
                if data is None:
                    covered[region] += 1
                    unreadable = True
                    continue
                if len(data) != nelem * item:
                    self.err(f"{cw}: dataset holds {len(data)} bytes, expected {nelem * item}")
                    continue
                self.ck.verify_chunk(c, data)
                if dtype in F.FLOATING:
                    if c.stats is None:
                        self.err(f"{cw}: floating chunk has no stats")
                    else:
                        compare_stats(self.err, cw, c.stats, F.stats_of(dtype, data))
                elif c.stats is not None:
                    self.err(f"{cw}: {dtype} chunk has stats")
                rebuilt[region] = np.frombuffer(data, storage).reshape(sizes)
                covered[region] += 1
            if covered.size and (covered != 1).any():
                self.err(f"{where}: chunks do not tile the shape: {int((covered == 0).sum())} elements "
                         f"uncovered, {int((covered > 1).sum())} covered more than once")
            if not chunks and not covered.size == 0:
                self.err(f"{where}: no chunks")
            if self.ck.version == 2:
                self.check_layout(key, e, chunks)
                if dtype in F.FLOATING and e.get("stats") and not unreadable:
                    compare_stats(self.err, f"{where} aggregate vs data", e["stats"],
                                  F.stats_of(dtype, expected.tobytes()))
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
            elif s["dtype"] not in F.FLOATING and not isinstance(v, int):
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
            c = self.ck.blobs.get(b["key"])
            if c is None:
                continue
            if c.dataset != F.escape_key(b["key"]):
                self.err(f"{where}: dataset {c.dataset!r}, expected {F.escape_key(b['key'])!r}")
            ds = self.ck.dataset(c)
            if ds is None:
                continue
            if ds.dtype != np.dtype("u1") or len(ds.shape) != 1:
                self.err(f"{where}: dataset is {ds.dtype} {ds.shape}, expected 1-D uint8")
                continue
            self.check_storage(c, ds, False)
            data = self.ck.read_chunk(c, "bytes")
            if data != want:
                self.err(f"{where}: content differs from what was saved")
            self.ck.verify_chunk(c, data)
        for j in self.man["json"]:
            e = entries.get(j["key"])
            if e is not None and (e.get("type") != "json" or e.get("value") != j["value"]):
                self.err(f"json {j['key']!r}: recorded {e!r}, expected value {j['value']!r}")

    def check_shard_contents(self):
        """Every object in every shard is one chunk or blob (so a replicated region is stored
        once). v2: the resolver matched every layout cell to exactly one index record and every
        record to a cell; here each record's dataset exists. v1: each index lists exactly the
        file's tensor chunks and blobs of metadata.json (appendix A.4)."""
        listed = {}  # file -> {dataset: chunk}
        for chunks in list(self.ck.tensors.values()) + [[c] for c in self.ck.blobs.values()]:
            for c in chunks:
                other = listed.setdefault(c.file, {}).get(c.dataset)
                if other is not None and (other.pack_offset is None or c.pack_offset is None):
                    self.err(f"{c.file}: dataset {c.dataset!r} is named by two chunks")
                listed[c.file][c.dataset] = c
        self.ck.check_packs()  # the members of a pack tile it (FORMAT.md §5.7)
        for name in self.ck.files:
            if not os.path.isfile(os.path.join(self.dir, name)):
                continue
            f = self.ck.open_file(name)
            present = set()
            f.visit(present.add)
            want = set(listed.get(name, {}))
            if present != want:
                self.err(f"{name}: holds objects {sorted(present - want)} that are no chunk and lacks "
                         f"{sorted(want - present)}")
            records = self.ck.records.get(name)
            if records is None or self.ck.version != 1:
                continue
            got, exp = [], []
            for r in records:
                fields = ("key", "dtype", "size", "dataset") if r.get("dtype") == "bytes" else \
                         ("key", "dtype", "shape", "offsets", "sizes", "dataset")
                got.append(json.dumps({k: r.get(k) for k in fields}, sort_keys=True))
            for c in listed.get(name, {}).values():
                e = self.meta["entries"][c.key]
                if c.offsets is None:
                    exp.append(json.dumps({"key": c.key, "dtype": "bytes", "size": e["size"], "dataset": c.dataset},
                                          sort_keys=True))
                else:
                    exp.append(json.dumps({"key": c.key, "dtype": e["dtype"], "shape": e["shape"], "offsets": c.offsets,
                                           "sizes": c.sizes, "dataset": c.dataset}, sort_keys=True))
            if sorted(got) != sorted(exp):
                diff = sorted(set(got) ^ set(exp))[:3]
                self.err(f"{name}: ckpt_shard_index chunks differ from metadata "
                         f"(index has {len(got)}, metadata {len(exp)}; differing: {diff})")
        for t in self.man["tensors"]:
            if not t["replicated"]:
                continue
            esc = F.escape_key(t["key"])
            count = sum(1 for name in self.ck.files if os.path.isfile(os.path.join(self.dir, name))
                        for n in self.ck.open_file(name) if n == esc or n.startswith(esc + "@"))
            # packed copies (FORMAT.md §5.7) have no dataset of their own: their records count
            count += sum(1 for name in self.ck.files for r in (self.ck.records.get(name) or [])
                         if r.get("key") == t["key"] and "pack_offset" in r)
            if count != 1:
                self.err(f"replicated tensor {t['key']!r} stored in {count} datasets across the shards, expected 1")


def check_corpus(corpus, schema_path, version=None, quiet=False):
    vals = validators(schema_path)
    names = sorted(n[:-len(".expected")] for n in os.listdir(corpus) if n.endswith(".expected"))
    if not names:
        print(f"FAIL: no cases under {corpus}")
        return ["no cases"]
    errors = []
    for name in names:
        case = Case(corpus, name, vals, version)
        case.run()
        if not quiet:
            print(f"{'ok  ' if not case.errors else 'FAIL'} {name}" +
                  (f" (format v{getattr(case, 'meta', {}).get('format_version')})" if not case.errors else
                   f" ({len(case.errors)} problems)"))
        errors += case.errors
    if not quiet:
        for e in errors:
            print("  " + e)
    return errors


# --------------------------------------------------------------- schema negatives

def valid_v1_document():
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


STATS = {"min": -1.0, "max": 1.0, "mean": 0.0, "l2": 2.0, "nan_count": 0, "inf_count": 0, "finite_count": 4}


def valid_v2_document():
    d = valid_v1_document()
    d["format_version"] = 2
    for i, f in enumerate(d["files"]):
        f["index"] = "xxh3-64:%016x" % (0x1111 * (i + 1))
    d["entries"].update({
        "model.w": {"type": "tensor", "dtype": "bfloat16", "shape": [4, 2], "stats": STATS, "stored_bytes": 15,
                    "layout": {"grid": [{"step": 2}, {"step": 2}], "files": {"base": 0, "strides": [1, 0]}}},
        "model.u": {"type": "tensor", "dtype": "int32", "shape": [5, 3], "stored_bytes": 8,
                    "layout": {"grid": [{"sizes": [1, 4]}, {"step": 3}], "files": [1, 0]}},
        "model.x": {"type": "tensor", "dtype": "float32", "shape": [3], "stored_bytes": 8,
                    "layout": {"chunks": [{"offsets": [0], "sizes": [1], "file": 0},
                                          {"offsets": [1], "sizes": [2], "file": 1}]}},
        "model.s": {"type": "tensor", "dtype": "float64", "shape": [], "stored_bytes": 8,
                    "layout": {"grid": [], "files": {"base": 1, "strides": []}}},
        "model.e": {"type": "tensor", "dtype": "float32", "shape": [0, 3], "stored_bytes": 8,
                    "layout": {"grid": [{"step": 0}, {"step": 3}], "files": {"base": 0, "strides": [0, 0]}}},
        "rng": {"type": "bytes", "size": 16, "file": 0, "stored_bytes": 16},
    })
    d["digest"] = "xxh3-64:0123456789abcdef"
    return d


def valid_index(version):
    rec = {"key": "model.w", "dtype": "bfloat16", "shape": [4, 2], "offsets": [0, 0], "sizes": [2, 2],
           "dataset": "model.w@0,0", "offset": 2048}
    blob = {"key": "rng", "dtype": "bytes", "size": 16, "dataset": "rng", "offset": 4096}
    if version == 2:
        rec.update(stored_bytes=8, checksum="xxh3-64:0123456789abcdef", block_bytes=65536,
                   blocks="0123456789abcdef", stats=STATS)
        blob.update(stored_bytes=16, checksum="xxh3-64:00000000000000ff", block_bytes=4096, blocks="00000000000000ff")
        zrec = {"key": "model.w", "dtype": "bfloat16", "shape": [4, 2], "offsets": [2, 0], "sizes": [2, 2],
                "dataset": "model.w@2,0", "stored_bytes": 7, "compression": {"codec": "zstd", "level": 3, "shuffle": True},
                "checksum": "xxh3-64:fedcba9876543210", "block_bytes": 4096, "blocks": "fedcba9876543210"}
        prec = {"key": "model.v", "dtype": "float32", "shape": [3], "offsets": [0], "sizes": [3],  # packed (§5.7)
                "dataset": ".ckpt_pack.0", "offset": 8192, "pack_offset": 0, "stored_bytes": 12,
                "checksum": "xxh3-64:0000000000000001", "block_bytes": 65536, "blocks": "0000000000000002"}
        return {"format": "ckpt-shard", "format_version": 2, "chunks": [rec, zrec, blob, prec]}
    return {"format": "ckpt-shard", "format_version": 1, "chunks": [rec, blob]}


def check_schema_rejects(schema_path):
    v, vi = validators(schema_path)
    problems = []

    def accepts(label, validator, doc):
        for e in validator.iter_errors(doc):
            problems.append(f"the valid {label} is rejected at {list(e.absolute_path)}: {e.message[:200]}")

    accepts("v1 document", v, valid_v1_document())
    accepts("v2 document", v, valid_v2_document())
    accepts("v1 shard index", vi, valid_index(1))
    accepts("v2 shard index", vi, valid_index(2))

    def broken(label, mutate, make=valid_v1_document, validator=v):
        d = make()
        mutate(d)
        if validator.is_valid(d):
            problems.append(f"schema accepts a document with {label}")
        else:
            print(f"ok   rejects {label}")

    E = "entries"
    # version 1 (FORMAT.md appendix)
    broken("format 'ckpz'", lambda d: d.update(format="ckpz"))
    broken("format_version 3", lambda d: d.update(format_version=3))
    broken("format_version '1'", lambda d: d.update(format_version="1"))
    broken("v1 chunks under format_version 2", lambda d: d.update(format_version=2))
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
    broken("a v1 layout member", lambda d: d[E]["model.w"].update(layout={"grid": [], "files": [0]}))
    broken("a v1 file index member", lambda d: d["files"][0].update(index="xxh3-64:0123456789abcdef"))

    # version 2 (FORMAT.md §3)
    V2 = valid_v2_document

    def b2(label, mutate):
        broken("v2: " + label, mutate, V2)

    b2("no digest", lambda d: d.pop("digest"))
    b2("digest of 15 hex digits", lambda d: d.update(digest="xxh3-64:0123456789abcde"))
    b2("a file without index", lambda d: d["files"][0].pop("index"))
    b2("a file index in upper case", lambda d: d["files"][1].update(index="xxh3-64:0123456789ABCDEF"))
    b2("format_version 1 with layouts", lambda d: d.update(format_version=1))
    b2("a v1 chunk list", lambda d: d[E].update({"model.w": valid_v1_document()[E]["model.w"]}))
    b2("a tensor without layout", lambda d: d[E]["model.w"].pop("layout"))
    b2("a tensor without stored_bytes", lambda d: d[E]["model.w"].pop("stored_bytes"))
    b2("bytes without stored_bytes", lambda d: d[E]["rng"].pop("stored_bytes"))
    b2("a negative stored_bytes", lambda d: d[E]["model.x"].update(stored_bytes=-1))
    b2("a layout with grid and chunks", lambda d: d[E]["model.w"]["layout"].update(chunks=[]))
    b2("a grid without files", lambda d: d[E]["model.w"]["layout"].pop("files"))
    b2("a negative step", lambda d: d[E]["model.w"]["layout"]["grid"][0].update(step=-1))
    b2("a split with step and sizes", lambda d: d[E]["model.w"]["layout"]["grid"][0].update(sizes=[2, 2]))
    b2("an empty sizes list", lambda d: d[E]["model.u"]["layout"]["grid"].__setitem__(0, {"sizes": []}))
    b2("a negative part size", lambda d: d[E]["model.u"]["layout"]["grid"].__setitem__(0, {"sizes": [-1, 6]}))
    b2("a fractional step", lambda d: d[E]["model.w"]["layout"]["grid"][0].update(step=1.5))
    b2("a grid of 33 splits", lambda d: d[E]["model.w"]["layout"].update(grid=[{"step": 1}] * 33))
    b2("an affine map without strides", lambda d: d[E]["model.w"]["layout"]["files"].pop("strides"))
    b2("a negative base", lambda d: d[E]["model.w"]["layout"]["files"].update(base=-1))
    b2("a file list with a negative index", lambda d: d[E]["model.u"]["layout"].update(files=[1, -1]))
    b2("a file list with a file name", lambda d: d[E]["model.u"]["layout"].update(files=["shard-00000-of-00002.h5", 0]))
    b2("an explicit chunk without file", lambda d: d[E]["model.x"]["layout"]["chunks"][0].pop("file"))
    b2("an explicit chunk with a file name",
       lambda d: d[E]["model.x"]["layout"]["chunks"][0].update(file="shard-00000-of-00002.h5"))
    b2("an explicit chunk with a dataset", lambda d: d[E]["model.x"]["layout"]["chunks"][0].update(dataset="model.x@0"))
    b2("a tensor entry with a checksum", lambda d: d[E]["model.w"].update(checksum="xxh3-64:0123456789abcdef"))
    b2("aggregate stats without finite_count", lambda d: d[E]["model.w"]["stats"].pop("finite_count"))
    b2("bytes with a file name", lambda d: d[E]["rng"].update(file="shard-00000-of-00002.h5"))
    b2("bytes with a dataset (it is in the index)", lambda d: d[E]["rng"].update(dataset="rng"))
    b2("bytes without file", lambda d: d[E]["rng"].pop("file"))

    # shard indexes (FORMAT.md §5.5, appendix A.4)
    def bi(label, mutate, version=2):
        broken(f"shard index v{version}: {label}", mutate, lambda: valid_index(version), vi)

    C = "chunks"
    bi("format 'ckpt'", lambda d: d.update(format="ckpt"))
    bi("format_version 3", lambda d: d.update(format_version=3))
    bi("an unknown member", lambda d: d.update(extra=1))
    bi("a record without blocks", lambda d: d[C][0].pop("blocks"))
    bi("a record without block_bytes", lambda d: d[C][0].pop("block_bytes"))
    bi("block_bytes 0", lambda d: d[C][0].update(block_bytes=0))
    bi("block_bytes 1000 (not a power of two)", lambda d: d[C][0].update(block_bytes=1000))
    bi("block_bytes 2048 (under 4 KiB)", lambda d: d[C][0].update(block_bytes=2048))
    bi("block_bytes 128 MiB", lambda d: d[C][0].update(block_bytes=128 << 20))
    bi("blocks of 15 hex digits", lambda d: d[C][0].update(blocks="0123456789abcde"))
    bi("blocks in upper case", lambda d: d[C][0].update(blocks="0123456789ABCDEF"))
    bi("blocks as a list", lambda d: d[C][0].update(blocks=["0123456789abcdef"]))
    bi("a record without checksum", lambda d: d[C][1].pop("checksum"))
    bi("a record without stored_bytes", lambda d: d[C][0].pop("stored_bytes"))
    bi("a record without dataset", lambda d: d[C][0].pop("dataset"))
    bi("a packed record without offset", lambda d: d[C][3].pop("offset"))
    bi("a packed record with compression", lambda d: d[C][3].update(compression=d[C][1]["compression"]))
    bi("a packed record naming no pack", lambda d: d[C][3].update(dataset="model.v"))
    bi("a pack name with a leading zero", lambda d: d[C][3].update(dataset=".ckpt_pack.01"))
    bi("a negative pack_offset", lambda d: d[C][3].update(pack_offset=-1))
    bi("an unpacked record naming a pack", lambda d: d[C][0].update(dataset=".ckpt_pack.0"))
    bi("a bytes entry naming a pack", lambda d: d[C][2].update(dataset=".ckpt_pack.0"))
    bi("a packed bytes entry", lambda d: d[C][2].update(pack_offset=0))
    bi("a record with a file", lambda d: d[C][0].update(file=0))
    bi("a negative offset", lambda d: d[C][0].update(offset=-8))
    bi("codec 'gzip'", lambda d: d[C][1]["compression"].update(codec="gzip"))
    bi("dtype 'complex64'", lambda d: d[C][0].update(dtype="complex64"))
    bi("an empty key", lambda d: d[C][0].update(key=""))
    bi("bytes with offsets", lambda d: d[C][2].update(offsets=[0]))
    bi("bytes without size", lambda d: d[C][2].pop("size"))
    bi("bytes with stats", lambda d: d[C][2].update(stats=STATS))
    bi("v1 records under format_version 2", lambda d: d.update(chunks=valid_index(1)[C]))
    bi("v2 records under format_version 1", lambda d: d.update(format_version=1))
    bi("a record with a checksum", lambda d: d[C][0].update(checksum="xxh3-64:0123456789abcdef"), 1)
    bi("a record without sizes", lambda d: d[C][0].pop("sizes"), 1)
    for p in problems:
        print("FAIL " + p)
    return 1 if problems else 0


# ------------------------------------------------------------------ self test

def selftest(scratch, schema_path):
    """The reader passes write_golden.py's hand-made v2 checkpoints and reports each corruption."""
    import write_golden
    base = os.path.join(scratch, "pristine")
    write_golden.write_v2_cases(base)
    problems = []
    errors = check_corpus(base, schema_path, version=2)
    if errors:
        problems.append(f"the hand-made v2 checkpoints do not pass ({len(errors)} problems)")

    def corrupt(label, case, mutate, expect):
        """Copies the corpus, mutates one case, and expects a problem matching `expect`."""
        d = os.path.join(scratch, "c")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        for n in os.listdir(d):
            if n.endswith(".expected") and n[:-9] != case:
                shutil.rmtree(os.path.join(d, n))
                shutil.rmtree(os.path.join(d, n[:-9]))
        mutate(os.path.join(d, case))
        errs = check_corpus(d, schema_path, version=2, quiet=True)
        if not any(re.search(expect, e) for e in errs):
            problems.append(f"{label}: not reported as /{expect}/ (got {errs[:3]})")
        else:
            print(f"ok   reports {label}")

    def edit_meta(case_dir, fn, keep_digest=True, must_change=True):
        p = os.path.join(case_dir, "metadata.json")
        with open(p, "rb") as f:
            raw = f.read()
        body = fn(raw[:-F.DIGEST_SUFFIX])
        if must_change and body == raw[:-F.DIGEST_SUFFIX]:
            raise AssertionError("selftest: the edit of metadata.json changed nothing")
        out = F.with_digest(body) if keep_digest else body + raw[-F.DIGEST_SUFFIX:]
        with open(p, "wb") as f:
            f.write(out)

    def flip_file_byte(case_dir, name, at):
        p = os.path.join(case_dir, name)
        with open(p, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x01]))

    def data_offset(case_dir, file, dataset):
        with h5py.File(os.path.join(case_dir, file), "r") as h:
            return h[dataset].id.get_offset()

    def edit_index(case_dir, file, fn, fix_digest):
        """Rewrites a shard's index text; with fix_digest also its digest in metadata.json."""
        p = os.path.join(case_dir, file)
        with h5py.File(p, "r+") as h:
            old = F.index_text(h)
            new = fn(old)
            del h.attrs[F.INDEX_ATTR]
            h.attrs.create(F.INDEX_ATTR, np.bytes_(new))
        size = os.path.getsize(p)
        pos = write_golden.file_position(case_dir, file)

        def fix(body):
            m = json.loads(body.rstrip(b", \n") + b"}")
            m["files"][pos]["bytes"] = size
            if fix_digest:
                m["files"][pos]["index"] = F.tag(new)
            return write_golden.metadata_body(m)
        edit_meta(case_dir, fix, must_change=False)

    g = "v2_grid_w3"
    w, f0 = "grid.step.rows", "shard-00000-of-00003.h5"
    corrupt("a flipped data byte (a block digest)", g,
            lambda d: flip_file_byte(d, f0, data_offset(d, f0, w + "@0,0") + 5000), r"block 1 \(bytes 4096")
    corrupt("a flipped scalar in metadata.json (its digest)", g,
            lambda d: edit_meta(d, lambda b: b.replace(b'"value": 4242', b'"value": 4243'), keep_digest=False),
            r"metadata.json: digest")
    corrupt("a renamed key in metadata.json (its digest)", g,
            lambda d: edit_meta(d, lambda b: b.replace(b'"grid.step.rows"', b'"grid.step.roww"'), keep_digest=False),
            r"metadata.json: digest")
    corrupt("a metadata.json without digest", g, drop_digest, r"does not end with its digest")
    corrupt("an index offset moved by 4 (index digest)", g,
            lambda d: edit_index(d, f0, lambda t: shift_offset(t, 4), fix_digest=False),
            r"index is not trusted")
    corrupt("an index offset moved by 4 with its digest fixed (the bytes at the offset)", g,
            lambda d: edit_index(d, f0, lambda t: shift_offset(t, 4), fix_digest=True),
            r"bytes at offset|block \d+ \(bytes")
    corrupt("a record removed from an index", g,
            lambda d: edit_index(d, f0, lambda t: drop_record(t, w), fix_digest=True),
            r"holds 0 records")
    corrupt("a record given twice", g,
            lambda d: edit_index(d, f0, lambda t: dup_record(t, w), fix_digest=True),
            r"holds 2 records")
    corrupt("a changed block digest with the checksum kept", g,
            lambda d: edit_index(d, f0, lambda t: edit_record(t, w, lambda r: r.update(
                blocks="0" * 16 + r["blocks"][16:])), fix_digest=True),
            r"checksum .* the recorded block digests hash to")
    corrupt("a changed block digest with the checksum recomputed over it", g,
            lambda d: edit_index(d, f0, lambda t: edit_record(t, w, lambda r: r.update(
                blocks="0" * 16 + r["blocks"][16:],
                checksum=F.blocked_checksum([int(("0" * 16 + r["blocks"][16:])[i:i + 16], 16)
                                             for i in range(0, len(r["blocks"]), 16)]))), fix_digest=True),
            r"block 0 \(bytes 0\.\.4096\) has digest")
    corrupt("a block_bytes of 2048", g,
            lambda d: edit_index(d, f0, lambda t: edit_record(t, w, lambda r: r.update(block_bytes=2048)),
                                 fix_digest=True),
            r"block_bytes")
    corrupt("a layout step that does not cut like the chunks", g,
            lambda d: edit_meta(d, lambda b: b.replace(b'{"step": 23}', b'{"step": 24}')),
            r"holds 0 records")
    corrupt("an entry's stored_bytes that is not its records' sum", g,
            lambda d: edit_meta(d, lambda b: b.replace(b'"stored_bytes": 9000', b'"stored_bytes": 9001')),
            r"stored_bytes 9001, its records sum to 9000")
    corrupt("a grid of two cells for a tensor of zero volume", g,
            lambda d: edit_meta(d, lambda b: b.replace(b'[{"step": 4}, {"step": 0}, {"step": 3}]',
                                                       b'[{"step": 2}, {"step": 0}, {"step": 3}]')),
            r"a grid of 2 cells for a tensor of zero volume")
    corrupt("a metadata.json ending '\\n}\\n' (digest still right)", g, loose_tail, r"a writer MUST end it")
    corrupt("a cell->file map pointing past files", g,
            lambda d: edit_meta(d, lambda b: b.replace(b'"base": 0, "strides": [1, 0]', b'"base": 1, "strides": [1, 0]')),
            r"outside files")
    problems += check_recipe(base, os.path.join(os.path.dirname(schema_path), "FORMAT.md"))
    for p in problems:
        print("FAIL " + p)
    return 1 if problems else 0


def check_recipe(corpus, format_md):
    """The reader recipe of FORMAT.md §10.2, run as printed, reads every tensor of every v2
    case equal to what was saved (compressed cases only where h5py has the zstd filter)."""
    with open(format_md, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"\*\*A reader recipe\.\*\*.*?```python\n(.*?)```", text, re.S)
    if not m:
        return [f"{format_md}: no reader recipe (§10.2) found"]
    ns = {}
    exec(compile(m.group(1), format_md + " §10.2", "exec"), ns)
    problems = []
    for name in sorted(n[:-9] for n in os.listdir(corpus) if n.endswith(".expected")):
        with open(os.path.join(corpus, name + ".expected", "manifest.json")) as f:
            man = json.load(f)
        if man["compressed"] and not h5py.h5z.filter_avail(F.ZSTD_FILTER):
            F.note(f"the recipe is not run on {name}: h5py has no zstd filter (import hdf5plugin)")
            continue
        d = os.path.join(corpus, name)
        meta = ns["open_checkpoint"](d)
        for t in man["tensors"]:
            with open(os.path.join(corpus, name + ".expected", t["raw"]), "rb") as f:
                want = f.read()
            try:
                got = ns["read_tensor"](d, meta, t["key"])
            except Exception as ex:  # noqa: BLE001  (any failure of the recipe is a problem)
                problems.append(f"recipe: {name} {t['key']!r}: {type(ex).__name__}: {ex}")
                continue
            if got.tobytes() != want or list(got.shape) != t["shape"]:
                problems.append(f"recipe: {name} {t['key']!r} differs from what was saved")
        print(f"ok   the FORMAT.md recipe reads {name}")
    return problems


def loose_tail(case_dir):
    """Rewrites metadata.json's end as '"digest": "..."\n}\n' (the digest stays right)."""
    p = os.path.join(case_dir, "metadata.json")
    with open(p, "rb") as f:
        raw = f.read()
    with open(p, "wb") as f:
        f.write(raw[:-3] + b'"\n}\n')


def drop_digest(case_dir):
    """Rewrites metadata.json as plain JSON without its digest."""
    p = os.path.join(case_dir, "metadata.json")
    with open(p) as f:
        m = json.load(f)
    m.pop("digest")
    with open(p, "w") as f:
        f.write(json.dumps(m, indent=1) + "\n")


def _index_edit(text, fn):
    idx = json.loads(text)
    fn(idx["chunks"])
    return json.dumps(idx, separators=(",", ":")).encode()


def shift_offset(text, delta):
    def fn(chunks):
        for r in chunks:
            if "offset" in r:
                r["offset"] += delta
                return
    return _index_edit(text, fn)


def drop_record(text, key):
    return _index_edit(text, lambda chunks: chunks.remove(next(r for r in chunks if r["key"] == key)))


def dup_record(text, key):
    return _index_edit(text, lambda chunks: chunks.append(dict(next(r for r in chunks if r["key"] == key))))


def edit_record(text, key, fn):
    return _index_edit(text, lambda chunks: fn(next(r for r in chunks if r["key"] == key)))


def verify(path, schema_path):
    """Checks one checkpoint on its own (FORMAT.md §7.2's verifier): prints the problems."""
    problems = []
    ck = F.Checkpoint(path, *validators(schema_path), err=problems.append)
    chunks = bytes_read = 0
    try:
        entries = ck.entries() if ck.meta is not None else {}
        for key, parts in ck.tensors.items():
            e = entries[key]
            shape = e["shape"]
            covered = np.zeros(shape, dtype=np.int32)
            for c in parts:
                if len(c.offsets) != len(shape) or any(o < 0 or s < 0 or o + s > n
                                                       for o, s, n in zip(c.offsets, c.sizes, shape)):
                    problems.append(f"{c.where()}: outside the tensor's shape {shape}")
                    continue
                covered[tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))] += 1
                data = ck.read_chunk(c, e["dtype"])
                if data is None:
                    continue
                want = (math.prod(c.sizes) if c.sizes else 1) * F.itemsize(e["dtype"])
                if len(data) != want:
                    problems.append(f"{c.where()}: the dataset holds {len(data)} bytes, expected {want}")
                    continue
                ck.verify_chunk(c, data)
                chunks += 1
                bytes_read += len(data)
            if covered.size and (covered != 1).any():
                problems.append(f"tensor {key!r}: chunks do not tile the shape (FORMAT.md §8.5)")
        for key, c in ck.blobs.items():
            data = ck.read_chunk(c, "bytes")
            if data is not None:
                if len(data) != entries[key]["size"]:
                    problems.append(f"{c.where()}: {len(data)} bytes, size says {entries[key]['size']}")
                ck.verify_chunk(c, data)
                chunks += 1
                bytes_read += len(data)
    finally:
        ck.close()
    for p in problems:
        print("FAIL " + p)
    version = ck.meta.get("format_version") if ck.meta else None
    print(f"{'OK' if not problems else 'FAILED'}: {path}: format v{version}, {len(ck.tensors)} tensors, "
          f"{len(ck.blobs)} blobs, {chunks} chunks verified, {bytes_read} bytes, {len(problems)} problems")
    return 1 if problems else 0


def main(argv):
    args = argv[1:]
    version = None
    if "--version" in args:
        i = args.index("--version")
        version = int(args[i + 1])
        del args[i:i + 2]
    if len(args) == 3 and args[0] == "corpus":
        return 1 if check_corpus(args[1], args[2], version) else 0
    if len(args) == 2 and args[0] == "schema":
        return check_schema_rejects(args[1])
    if len(args) == 3 and args[0] == "verify":
        return verify(args[1], args[2])
    if len(args) == 3 and args[0] == "selftest":
        return selftest(args[1], args[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
