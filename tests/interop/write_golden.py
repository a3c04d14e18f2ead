#!/usr/bin/python3
"""Writes checkpoints per schemas/FORMAT.md with h5py and numpy only, no ckpt code: an
independent writer whose output libckpt must read (read_golden.cc). Beside each checkpoint,
<case>.expected/ holds manifest.json and the expected global tensors as raw files, in the
format write_corpus.cc uses.

Usage: write_golden.py <out-dir>

Needs Debian's python3-h5py and python3-numpy, libxxhash (checksums) and libzstd (the
compressed case), the last two through ctypes: both are build dependencies of ckpt.
"""
import ctypes
import ctypes.util
import json
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_corpus import FLOATING, STORAGE, XXH3, escape_key, expected_dataset, to_float64  # noqa: E402

ZSTD_LEVEL = 7


def _zstd_compress():
    for name in ("zstd", "libzstd.so.1"):
        try:
            lib = ctypes.CDLL(ctypes.util.find_library(name) or name)
        except OSError:
            continue
        lib.ZSTD_compress.restype = ctypes.c_size_t
        lib.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
        lib.ZSTD_compressBound.restype = ctypes.c_size_t
        lib.ZSTD_compressBound.argtypes = [ctypes.c_size_t]

        def compress(data, level):
            cap = lib.ZSTD_compressBound(len(data))
            dst = ctypes.create_string_buffer(cap)
            n = lib.ZSTD_compress(dst, cap, data, len(data), level)
            return dst.raw[:n]
        return compress
    return None


ZSTD = _zstd_compress()


def stats_of(dtype, raw):
    """FORMAT.md §7.3."""
    v = to_float64(dtype, raw)
    fin = v[np.isfinite(v)]
    s = {"nan_count": int(np.isnan(v).sum()), "inf_count": int(np.isinf(v).sum()), "finite_count": int(fin.size)}
    if fin.size:
        s.update(min=float(fin.min()), max=float(fin.max()), mean=float(fin.mean()),
                 l2=float(np.sqrt(np.sum(fin * fin))))
    else:
        s.update(min=None, max=None, mean=None, l2=0.0)
    return s


def random_tensor(rng, dtype, shape):
    """Values of the storage dtype; floating ones finite and of moderate size."""
    storage = STORAGE[dtype][0]
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


class Writer:
    def __init__(self, out, name, world, compressed=False):
        self.name, self.world, self.compressed = name, world, compressed
        self.dir = os.path.join(out, name)
        self.exp = self.dir + ".expected"
        os.makedirs(self.dir)
        os.makedirs(self.exp)
        self.files = {r: "shard-%05d-of-%05d.h5" % (r, world) for r in range(world)}
        self.h5 = {r: h5py.File(os.path.join(self.dir, f), "w", libver="earliest") for r, f in self.files.items()}
        self.index = {r: [] for r in range(world)}
        self.entries = {}
        self.man = {"case": name, "world_size": world, "state_dict_type": "SHARDED", "compressed": compressed,
                    "compression_level": ZSTD_LEVEL, "writer": "h5py", "tensors": [], "scalars": [],
                    "bytes": [], "json": []}

    def _dataset(self, f, name, sub, dtype):
        storage, attr = STORAGE[dtype]
        nel = sub.size
        if self.compressed and sub.ndim > 0 and nel > 0:
            # Byte-shuffle then zstd (FORMAT.md §6), HDF5 chunks of at most 64 rows, written
            # raw: h5py needs no zstd plugin to write them.
            cshape = (min(64, sub.shape[0]),) + sub.shape[1:]
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_chunk(cshape)
            dcpl.set_shuffle()
            dcpl.set_filter(32015, h5py.h5z.FLAG_OPTIONAL, (ZSTD_LEVEL,))
            space = h5py.h5s.create_simple(sub.shape)
            dsid = h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(np.dtype(storage)), space, dcpl=dcpl)
            item = np.dtype(storage).itemsize
            for start in range(0, sub.shape[0], cshape[0]):
                block = np.zeros(cshape, dtype=storage)  # edge chunks are stored whole
                rows = min(cshape[0], sub.shape[0] - start)
                block[:rows] = sub[start:start + rows]
                shuffled = block.view("u1").reshape(-1, item).T.tobytes()
                dsid.write_direct_chunk((start,) + (0,) * (sub.ndim - 1), ZSTD(shuffled, ZSTD_LEVEL))
            ds = f[name]
            compression = {"codec": "zstd", "level": ZSTD_LEVEL, "shuffle": True}
        else:
            ds = f.create_dataset(name, data=sub)  # contiguous; a 0-D array gets a scalar dataspace
            compression = None
        if attr:
            ds.attrs["dtype"] = attr
        return ds, compression

    def tensor(self, key, dtype, shape, boxes, data):
        """boxes: [(rank, offsets, sizes)]"""
        n = len(self.man["tensors"])
        with open(os.path.join(self.exp, f"{n}.raw"), "wb") as f:
            f.write(np.ascontiguousarray(data).tobytes())
        self.man["tensors"].append({"key": key, "dtype": dtype, "shape": list(shape), "raw": f"{n}.raw",
                                    "replicated": False})
        chunks = []
        for rank, offs, sizes in boxes:
            c = {"offsets": list(offs), "sizes": list(sizes), "file": self.files[rank]}
            c["dataset"] = expected_dataset(key, shape, c)
            sub = np.array(data[tuple(slice(o, o + s) for o, s in zip(offs, sizes))], order="C")
            raw = sub.tobytes()
            ds, compression = self._dataset(self.h5[rank], c["dataset"], sub, dtype)
            c["checksum"] = "xxh3-64:%016x" % XXH3(raw)
            c["stored_bytes"] = int(ds.id.get_storage_size())
            if compression:
                c["compression"] = compression
            if dtype in FLOATING:
                c["stats"] = stats_of(dtype, raw)
            chunks.append(c)
            self.index[rank].append({"key": key, "dtype": dtype, "shape": list(shape), "offsets": list(offs),
                                     "sizes": list(sizes), "dataset": c["dataset"]})
        self.entries[key] = {"type": "tensor", "dtype": dtype, "shape": list(shape), "chunks": chunks}

    def blob(self, key, rank, data):
        n = len(self.man["tensors"]) + len(self.man["bytes"]) + 1000
        with open(os.path.join(self.exp, f"{n}.raw"), "wb") as f:
            f.write(data)
        self.man["bytes"].append({"key": key, "raw": f"{n}.raw"})
        name = escape_key(key)
        ds = self.h5[rank].create_dataset(name, data=np.frombuffer(data, "u1"), shape=(len(data),), dtype="u1")
        self.index[rank].append({"key": key, "dtype": "bytes", "size": len(data), "dataset": name})
        self.entries[key] = {"type": "bytes", "size": len(data), "file": self.files[rank], "dataset": name,
                             "checksum": "xxh3-64:%016x" % XXH3(data), "stored_bytes": int(ds.id.get_storage_size())}

    def scalar(self, key, dtype, value):
        self.man["scalars"].append({"key": key, "dtype": dtype, "value": value})
        self.entries[key] = {"type": "scalar", "dtype": dtype, "value": bool(value) if dtype == "bool" else value}

    def json(self, key, value):
        self.man["json"].append({"key": key, "value": value})
        self.entries[key] = {"type": "json", "value": value}

    def close(self):
        files = []
        for r, f in self.h5.items():
            f.attrs["ckpt_shard_index"] = json.dumps(
                {"format": "ckpt-shard", "format_version": 1, "chunks": self.index[r]})
            f.close()
            files.append({"name": self.files[r], "rank": r,
                          "bytes": os.path.getsize(os.path.join(self.dir, self.files[r]))})
        meta = {"format": "ckpt", "format_version": 1, "state_dict_type": "SHARDED", "world_size": self.world,
                "library_version": "h5py-golden", "created": "2026-01-01T00:00:00Z",
                "mesh": {"dims": ["dp"], "shape": [self.world]}, "user": {"case": self.name},
                "files": files, "entries": self.entries}
        with open(os.path.join(self.dir, "metadata.json"), "w") as f:
            json.dump(meta, f, indent=1)
        with open(os.path.join(self.exp, "manifest.json"), "w") as f:
            json.dump(self.man, f, indent=1)


def write_case(out, name, world, compressed, seed):
    rng = np.random.default_rng(seed)
    w = Writer(out, name, world, compressed)
    shapes = [(), (9,), (7, 5), (6, 3, 4), (5, 2, 3, 2)]
    for dtype in STORAGE:
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


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if XXH3 is None or ZSTD is None:
        print("write_golden: needs libxxhash and libzstd (apt-get install libxxhash-dev libzstd-dev)", file=sys.stderr)
        return 2
    os.makedirs(argv[1], exist_ok=True)
    write_case(argv[1], "golden_w2", 2, False, 1)
    write_case(argv[1], "golden_w3_zstd", 3, True, 2)
    print(f"wrote golden_w2, golden_w3_zstd under {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
