#!/usr/bin/python3
"""Writes checkpoints per schemas/FORMAT.md with h5py and numpy only, no ckpt code: an
independent writer whose output libckpt must read (read_golden.cc). Beside each checkpoint,
<case>.expected/ holds manifest.json and the expected global tensors as raw files, in the
format write_corpus.cc uses.

Usage: write_golden.py [--v2] <out-dir>
  (default) version 1 (FORMAT.md appendix): golden_w2, golden_w3_zstd. libckpt reading them
            proves it reads v1 written by another implementation.
  --v2      version 2 (FORMAT.md §3, §5.5, §7): v2_grid_w3 (every layout form: step and sizes
            grids, affine and listed cell->file maps, a negative stride, an
            explicit layout, 0-D and empty tensors, chunks of several blocks), v2_zstd_w2, and
            v2_packed_w2 (small chunks packed in .ckpt_pack.<n> datasets, FORMAT.md §5.7).

Needs Debian's python3-h5py, python3-numpy and python3-xxhash, and libzstd (the compressed
cases) through ctypes: a build dependency of ckpt.
"""
import json
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_format as F  # noqa: E402

ZSTD_LEVEL = 7


def random_tensor(rng, dtype, shape):
    """Values of the storage dtype; floating ones finite and of moderate size."""
    storage = F.STORAGE[dtype][0]
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        a = rng.integers(0, 2, n).astype("u1")
    elif dtype in ("float64", "float32", "float16"):
        a = (rng.standard_normal(n) * 3).astype(storage)
    elif dtype == "bfloat16":
        a = ((rng.standard_normal(n).astype("<f4").view("<u4") >> 16).astype("<u2"))
    elif dtype == "float8_e5m2":
        a = ((rng.standard_normal(n).astype("<f2").view("<u2") >> 8).astype("u1"))
    elif dtype == "float8_e4m3fn":
        a = rng.integers(0, 256, n).astype("u1")
        a[(a & 0x7F) == 0x7F] = 0x3C  # no NaN: keep the stats finite
    else:
        info = np.iinfo(np.dtype(storage))
        a = rng.integers(info.min, info.max, n, dtype=np.dtype(storage), endpoint=True)
    return a.reshape(shape)


def split_rows(n, parts):
    """Uneven contiguous ranges of dim 0: part p gets about (p + 1) shares."""
    shares = parts * (parts + 1) // 2
    out, begin, acc = [], 0, 0
    for p in range(parts):
        acc += p + 1
        end = n if p == parts - 1 else n * acc // shares
        out.append((begin, end - begin))
        begin = end
    return out


def create_dataset(f, name, sub, dtype, compressed):
    """A chunk's dataset: contiguous, or (compressed, non-empty, not 0-D) chunked with
    byte-shuffle then zstd (FORMAT.md §6) in HDF5 chunks of at most 64 rows, written raw, so
    h5py needs no zstd plugin. Returns (dataset, compression record or None)."""
    storage, attr = F.STORAGE[dtype]
    if compressed and sub.ndim > 0 and sub.size > 0:
        cshape = (min(64, sub.shape[0]),) + sub.shape[1:]
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk(cshape)
        dcpl.set_shuffle()
        dcpl.set_filter(F.ZSTD_FILTER, h5py.h5z.FLAG_OPTIONAL, (ZSTD_LEVEL,))
        space = h5py.h5s.create_simple(sub.shape)
        dsid = h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(np.dtype(storage)), space, dcpl=dcpl)
        item = np.dtype(storage).itemsize
        for start in range(0, sub.shape[0], cshape[0]):
            block = np.zeros(cshape, dtype=storage)  # edge chunks are stored whole
            rows = min(cshape[0], sub.shape[0] - start)
            block[:rows] = sub[start:start + rows]
            shuffled = block.view("u1").reshape(-1, item).T.tobytes()
            dsid.write_direct_chunk((start,) + (0,) * (sub.ndim - 1), F.zstd_compress(shuffled, ZSTD_LEVEL))
        ds = f[name]
        compression = {"codec": "zstd", "level": ZSTD_LEVEL, "shuffle": True}
    else:
        ds = f.create_dataset(name, data=sub)  # contiguous; a 0-D array gets a scalar dataspace
        compression = None
    if attr:
        ds.attrs["dtype"] = np.bytes_(attr)  # a fixed-length string (FORMAT.md §4.2)
    return ds, compression


class Writer:
    """Version 1 (FORMAT.md appendix): chunks listed in metadata.json."""
    version = 1

    def __init__(self, out, name, world, compressed=False):
        self.name, self.world, self.compressed = name, world, compressed
        self.dir = os.path.join(out, name)
        self.exp = self.dir + ".expected"
        os.makedirs(self.dir)
        os.makedirs(self.exp)
        self.files = ["shard-%05d-of-%05d.h5" % (r, world) for r in range(world)]
        self.h5 = [h5py.File(os.path.join(self.dir, f), "w", libver="earliest") for f in self.files]
        self.index = [[] for _ in range(world)]
        self.entries = {}
        self.man = {"case": name, "world_size": world, "state_dict_type": "SHARDED", "compressed": compressed,
                    "compression_level": ZSTD_LEVEL, "writer": "h5py", "tensors": [], "scalars": [],
                    "bytes": [], "json": []}

    def _expect_tensor(self, key, dtype, shape, data):
        n = len(self.man["tensors"])
        with open(os.path.join(self.exp, f"{n}.raw"), "wb") as f:
            f.write(np.ascontiguousarray(data).tobytes())
        self.man["tensors"].append({"key": key, "dtype": dtype, "shape": list(shape), "raw": f"{n}.raw",
                                    "replicated": False})

    def _expect_blob(self, key, data):
        n = len(self.man["tensors"]) + len(self.man["bytes"]) + 1000
        with open(os.path.join(self.exp, f"{n}.raw"), "wb") as f:
            f.write(data)
        self.man["bytes"].append({"key": key, "raw": f"{n}.raw"})

    def _chunk(self, rank, key, dtype, shape, offs, sizes, data):
        """Writes one chunk's dataset; returns (record fields common to both versions, raw bytes)."""
        dataset = F.dataset_name(key, shape, offs, sizes)
        sub = np.array(data[tuple(slice(o, o + s) for o, s in zip(offs, sizes))], order="C")
        ds, compression = create_dataset(self.h5[rank], dataset, sub, dtype, self.compressed)
        rec = {"dataset": dataset, "stored_bytes": int(ds.id.get_storage_size())}
        if compression:
            rec["compression"] = compression
        if dtype in F.FLOATING:
            rec["stats"] = F.stats_of(dtype, sub.tobytes())
        return rec, ds, sub.tobytes()

    def tensor(self, key, dtype, shape, boxes, data):
        """boxes: [(rank, offsets, sizes)]"""
        self._expect_tensor(key, dtype, shape, data)
        chunks = []
        for rank, offs, sizes in boxes:
            rec, ds, raw = self._chunk(rank, key, dtype, shape, offs, sizes, data)
            c = {"offsets": list(offs), "sizes": list(sizes), "file": self.files[rank], "dataset": rec["dataset"],
                 "checksum": F.tag(raw), "stored_bytes": rec["stored_bytes"]}
            for k in ("compression", "stats"):
                if k in rec:
                    c[k] = rec[k]
            chunks.append(c)
            self.index[rank].append({"key": key, "dtype": dtype, "shape": list(shape), "offsets": list(offs),
                                     "sizes": list(sizes), "dataset": rec["dataset"]})
        self.entries[key] = {"type": "tensor", "dtype": dtype, "shape": list(shape), "chunks": chunks}

    def blob(self, key, rank, data):
        self._expect_blob(key, data)
        name = F.escape_key(key)
        ds = self.h5[rank].create_dataset(name, data=np.frombuffer(data, "u1"), shape=(len(data),), dtype="u1")
        self.index[rank].append({"key": key, "dtype": "bytes", "size": len(data), "dataset": name})
        self.entries[key] = {"type": "bytes", "size": len(data), "file": self.files[rank], "dataset": name,
                             "checksum": F.tag(data), "stored_bytes": int(ds.id.get_storage_size())}

    def scalar(self, key, dtype, value):
        self.man["scalars"].append({"key": key, "dtype": dtype, "value": value})
        self.entries[key] = {"type": "scalar", "dtype": dtype, "value": bool(value) if dtype == "bool" else value}

    def json(self, key, value):
        self.man["json"].append({"key": key, "value": value})
        self.entries[key] = {"type": "json", "value": value}

    def _finish_files(self):
        """Writes each shard's index attribute, closes it; returns the files list of metadata."""
        files = []
        for r, f in enumerate(self.h5):
            text = json.dumps({"format": "ckpt-shard", "format_version": self.version, "chunks": self.index[r]},
                              separators=(",", ":")).encode()
            f.attrs.create(F.INDEX_ATTR, np.bytes_(text))  # a fixed-length string (FORMAT.md §5.5)
            f.close()
            files.append({"name": self.files[r], "rank": r,
                          "bytes": os.path.getsize(os.path.join(self.dir, self.files[r]))})
            if self.version == 2:
                files[-1]["index"] = F.tag(text)
        return files

    def _meta(self, files):
        return {"format": "ckpt", "format_version": self.version, "state_dict_type": "SHARDED",
                "world_size": self.world, "library_version": "h5py-golden", "created": "2026-01-01T00:00:00Z",
                "mesh": {"dims": ["dp"], "shape": [self.world]}, "user": {"case": self.name},
                "files": files, "entries": self.entries}

    def close(self):
        meta = self._meta(self._finish_files())
        with open(os.path.join(self.dir, "metadata.json"), "w") as f:
            json.dump(meta, f, indent=1)
        self._close_manifest()

    def _close_manifest(self):
        with open(os.path.join(self.exp, "manifest.json"), "w") as f:
            json.dump(self.man, f, indent=1)


def metadata_body(meta):
    """A version-2 metadata.json up to the opening quote of "digest" (FORMAT.md §3.6): one
    member per line, one entry per line."""
    dump = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    lines = [f" {dump(k)}: {dump(v)}," for k, v in meta.items() if k not in ("entries", "digest")]
    entries = [f"  {dump(k)}: {dump(v)}" for k, v in meta["entries"].items()]
    text = "{\n" + "\n".join(lines) + '\n "entries": {\n' + ",\n".join(entries) + "\n },\n "
    return text.encode("utf-8")


def file_position(case_dir, name):
    with open(os.path.join(case_dir, "metadata.json")) as f:
        return [x["name"] for x in json.load(f)["files"]].index(name)


class WriterV2(Writer):
    """Version 2: layouts in metadata.json, the chunks' records in the shard indexes, blocked
    checksums, digests of every index and of metadata.json."""
    version = 2

    def tensor_v2(self, key, dtype, shape, layout, data, block_bytes=4096, pack=None):
        """Writes the chunks `layout` names (FORMAT.md §3.3) from the global `data`; with
        `pack` (a number), its non-empty chunks are packed (§5.7) into .ckpt_pack.<pack> of
        their file, written at close."""
        self._expect_tensor(key, dtype, shape, data)
        stats, stored, compressions = [], 0, []
        for offs, sizes, fi in F.layout_chunks(layout, list(shape), self.world):
            sub = np.array(data[tuple(slice(o, o + s) for o, s in zip(offs, sizes))], order="C")
            if pack is not None and sub.size > 0:
                raw = sub.tobytes()
                name = ".ckpt_pack.%d" % pack
                bufs = self.packs.setdefault((fi, name), [])
                rec = {"dataset": name, "pack_offset": sum(len(b) for b in bufs), "stored_bytes": len(raw)}
                bufs.append(raw)
                if dtype in F.FLOATING:
                    rec["stats"] = F.stats_of(dtype, raw)
                ds = None
            else:
                rec, ds, raw = self._chunk(fi, key, dtype, shape, offs, sizes, data)
            digests = F.block_digests(raw, block_bytes)
            r = {"key": key, "dtype": dtype, "shape": list(shape), "offsets": offs, "sizes": sizes,
                 "dataset": rec["dataset"], "stored_bytes": rec["stored_bytes"]}
            if ds is None:  # packed: its offset once the pack is written
                r["offset"] = None
                r["pack_offset"] = rec["pack_offset"]
                self.packed.append((fi, r))
            elif "compression" not in rec and rec["stored_bytes"] > 0:
                r["offset"] = int(ds.id.get_offset())
            for k in ("compression", "stats"):
                if k in rec:
                    r[k] = rec[k]
            r.update(checksum=F.blocked_checksum(digests), block_bytes=block_bytes, blocks=F.blocks_hex(digests))
            self.index[fi].insert(0, r)  # records in any order (§5.5): newest first
            stats.append(rec.get("stats"))
            stored += rec["stored_bytes"]
            compressions += [rec["compression"]] if "compression" in rec else []
        e = {"type": "tensor", "dtype": dtype, "shape": list(shape), "layout": layout, "stored_bytes": stored}
        if compressions:
            e["compression"] = compressions[0]
        if dtype in F.FLOATING and all(stats):
            e["stats"] = F.aggregate_stats(stats)
        self.entries[key] = e

    def blob(self, key, rank, data, block_bytes=4096):
        self._expect_blob(key, data)
        name = F.escape_key(key)
        ds = self.h5[rank].create_dataset(name, data=np.frombuffer(data, "u1"), shape=(len(data),), dtype="u1")
        digests = F.block_digests(data, block_bytes)
        r = {"key": key, "dtype": "bytes", "size": len(data), "dataset": name,
             "stored_bytes": int(ds.id.get_storage_size())}
        if data:
            r["offset"] = int(ds.id.get_offset())
        r.update(checksum=F.blocked_checksum(digests), block_bytes=block_bytes, blocks=F.blocks_hex(digests))
        self.index[rank].append(r)
        self.entries[key] = {"type": "bytes", "size": len(data), "file": rank, "stored_bytes": r["stored_bytes"]}

    def close(self):
        for (fi, name), bufs in getattr(self, "packs", {}).items():  # FORMAT.md §5.7: contiguous 1-D uint8
            ds = self.h5[fi].create_dataset(name, data=np.frombuffer(b"".join(bufs), "u1"))
            for f, r in self.packed:
                if f == fi and r["dataset"] == name:
                    r["offset"] = int(ds.id.get_offset()) + r["pack_offset"]
        meta = self._meta(self._finish_files())
        with open(os.path.join(self.dir, "metadata.json"), "wb") as f:
            f.write(F.with_digest(metadata_body(meta)))
        self._close_manifest()


def write_case(out, name, world, compressed, seed):
    rng = np.random.default_rng(seed)
    w = Writer(out, name, world, compressed)
    shapes = [(), (9,), (7, 5), (6, 3, 4), (5, 2, 3, 2)]
    for dtype in F.STORAGE:
        for shape in shapes:
            key = f"golden.{dtype}.r{len(shape)}"
            data = random_tensor(rng, dtype, shape)
            if shape:
                boxes = [(r, (b,) + (0,) * (len(shape) - 1), (n,) + shape[1:])
                         for r, (b, n) in enumerate(split_rows(shape[0], world)) if n > 0]
            else:
                boxes = [(world - 1, (), ())]
            w.tensor(key, dtype, shape, boxes, data)
    big = random_tensor(rng, "float32", (300, 70))  # several HDF5 chunks when compressed
    w.tensor("golden.big", "float32", (300, 70),
             [(r, (b, 0), (n, 70)) for r, (b, n) in enumerate(split_rows(300, world))], big)
    w.tensor("golden.cols", "int32", (4, 10),  # split along dim 1
             [(r, (0, b), (4, n)) for r, (b, n) in enumerate(split_rows(10, world))],
             random_tensor(rng, "int32", (4, 10)))
    w.tensor("golden/empty%", "float32", (3, 0), [(0, (0, 0), (3, 0))], np.zeros((3, 0), "<f4"))
    w.tensor(".dot", "float64", (2,), [(0, (0,), (2,))], random_tensor(rng, "float64", (2,)))
    w.blob("rng.state", 0, bytes(rng.integers(0, 256, 333, dtype=np.uint8)))
    w.blob("empty.blob", world - 1, b"")
    w.scalar("step", "int64", 4242)
    w.scalar("lr", "float64", 0.000125)
    w.scalar("flag", "bool", 1)
    w.json("config", {"layers": 2, "names": ["a", "b"], "nested": {"x": None}})
    w.close()


def affine(base, *strides):
    return {"base": base, "strides": list(strides)}


def write_v2_cases(out):
    """Hand-made version-2 checkpoints (FORMAT.md §3.3 layouts in every form)."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(3)
    w = WriterV2(out, "v2_grid_w3", 3)
    t = lambda key, dtype, shape, grid, files, **kw: w.tensor_v2(  # noqa: E731
        key, dtype, shape, {"grid": grid, "files": files}, random_tensor(rng, dtype, shape), **kw)
    # 3 parts of 23 rows, 5888 bytes each: two blocks of 4 KiB per chunk.
    t("grid.step.rows", "float32", (69, 64), [{"step": 23}, {"step": 64}], affine(0, 1, 0))
    t("grid.step.uneven", "bfloat16", (10, 6), [{"step": 4}, {"step": 6}], affine(2, -1, 0))  # parts 4, 4, 2
    t("grid.sizes.cols", "int32", (4, 10), [{"step": 4}, {"sizes": [1, 4, 5]}], [2, 0, 1])
    t("grid.2d", "float16", (9, 7), [{"step": 5}, {"step": 3}], affine(0, 0, 1))  # 2 x 3 cells
    t("grid.list", "float32", (5, 3), [{"sizes": [2, 1, 2]}, {"step": 3}], [1, 1, 0])  # not affine
    t("grid.fp8", "float8_e4m3fn", (16,), [{"step": 8}], affine(1, 1))
    t("grid.mask", "bool", (5,), [{"step": 5}], affine(2, 0))
    t("grid.e5m2", "float8_e5m2", (3, 4), [{"step": 3}, {"step": 1}], [0, 2, 2, 1])
    t("big.blocks", "uint8", (9000,), [{"step": 9000}], affine(1, 0))  # blocks of 4096, 4096, 808
    t("big.blocks.64k", "int16", (12000,), [{"step": 6000}], affine(0, 2), block_bytes=65536)
    t("scalar0d", "float64", (), [], affine(1))
    t("empty.tensor", "float32", (4, 0, 3), [{"step": 4}, {"step": 0}, {"step": 3}], affine(2, 0, 0, 0))
    t("odd/key%name@0,0", "int8", (3, 2), [{"step": 2}, {"step": 2}], affine(0, 1, 0))
    w.tensor_v2("explicit.L", "int64", (7, 3),  # no grid: the lower part is not cut at column 2
                {"chunks": [{"offsets": [0, 0], "sizes": [3, 2], "file": 1},
                            {"offsets": [0, 2], "sizes": [3, 1], "file": 0},
                            {"offsets": [3, 0], "sizes": [4, 3], "file": 2}]},
                random_tensor(rng, "int64", (7, 3)))
    w.blob("rng.state", 0, bytes(rng.integers(0, 256, 5000, dtype=np.uint8)))  # two blocks
    w.blob("empty.blob", 2, b"")
    w.scalar("step", "int64", 4242)
    w.scalar("lr", "float64", 0.000125)
    w.scalar("flag", "bool", 1)
    w.json("config", {"layers": 2, "names": ["a", "b"], "nested": {"x": None}})
    w.close()

    w = WriterV2(out, "v2_zstd_w2", 2, compressed=True)
    w.tensor_v2("z.big", "float32", (200, 70), {"grid": [{"step": 100}, {"step": 70}], "files": affine(0, 1, 0)},
                random_tensor(rng, "float32", (200, 70)), block_bytes=16384)  # HDF5 chunks of 64 rows
    w.tensor_v2("z.i", "int64", (3, 5, 7), {"grid": [{"step": 3}, {"step": 2}, {"step": 7}], "files": [0, 1, 0]},
                random_tensor(rng, "int64", (3, 5, 7)))
    w.tensor_v2("z.b", "bfloat16", (40,), {"grid": [{"sizes": [15, 25]}], "files": affine(1, -1)},
                random_tensor(rng, "bfloat16", (40,)))
    w.tensor_v2("z.s", "float32", (), {"grid": [], "files": affine(0)}, random_tensor(rng, "float32", ()))
    w.blob("z.blob", 1, bytes(rng.integers(0, 256, 100, dtype=np.uint8)))
    w.scalar("step", "int64", 7)
    w.close()

    write_v2_packed(out)


def write_v2_packed(out):
    """v2_packed_w2 (FORMAT.md §5.7): small chunks packed back to back, two packs in file 0."""
    rng = np.random.default_rng(11)
    w = WriterV2(out, "v2_packed_w2", 2)
    w.packs, w.packed = {}, []
    p = lambda key, dtype, shape, grid, files, pack, **kw: w.tensor_v2(  # noqa: E731
        key, dtype, shape, {"grid": grid, "files": files}, random_tensor(rng, dtype, shape), pack=pack, **kw)
    p("p.rows", "float32", (6, 5), [{"step": 3}, {"step": 5}], affine(0, 1, 0), 0)  # one chunk in each file
    p("p.bf16", "bfloat16", (7,), [{"step": 7}], affine(0, 0), 0)
    p("p.scalar", "float64", (), [], affine(1), 0)  # a 0-D chunk of 8 bytes
    p("p.blocks", "int16", (3000,), [{"step": 3000}], affine(0, 0), 1)  # 6000 bytes: two blocks of 4 KiB
    p("p.mask", "bool", (3,), [{"step": 3}], affine(1, 0), 0)
    p("odd/p%key@1", "int8", (4, 2), [{"step": 2}, {"step": 2}], affine(0, 1, 0), 1)
    p("p.empty", "float32", (0, 4), [{"step": 0}, {"step": 4}], affine(1, 0, 0), 0)  # empty: a dataset of its own
    w.tensor_v2("unpacked.big", "float32", (40, 30), {"grid": [{"step": 20}, {"step": 30}], "files": affine(0, 1, 0)},
                random_tensor(rng, "float32", (40, 30)))
    w.blob("rng.state", 1, bytes(rng.integers(0, 256, 77, dtype=np.uint8)))
    w.scalar("step", "int64", 9)
    w.close()


def main(argv):
    args = argv[1:]
    v2 = "--v2" in args
    args = [a for a in args if a != "--v2"]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    if F.ZSTD_LIB is None:
        print("write_golden: needs libzstd (apt-get install libzstd-dev)", file=sys.stderr)
        return 2
    os.makedirs(args[0], exist_ok=True)
    if v2:
        write_v2_cases(args[0])
        print(f"wrote v2_grid_w3, v2_zstd_w2, v2_packed_w2 under {args[0]}")
        return 0
    write_case(args[0], "golden_w2", 2, False, 1)
    write_case(args[0], "golden_w3_zstd", 3, True, 2)
    print(f"wrote golden_w2, golden_w3_zstd under {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
