"""An independent reader of ckpt checkpoints, versions 1 and 2, written from schemas/FORMAT.md
alone (no ckpt code): hashing (§3.1, §7.1), the metadata digest rule (§3.6), layouts (§3.3),
shard indexes (§5.5, appendix A.4), dtypes (§4) and reading datasets with h5py (§5, §6).

`open_checkpoint(dir, ...)` follows the chain of trust (§7.5) and resolves every entry into a
list of `Chunk` records whatever the version; `read_chunk` returns a chunk's raw bytes and
`verify_chunk` checks them against the checksum (v1) or the block digests (v2).

Needs Debian's python3-h5py, python3-numpy and python3-xxhash (run with /usr/bin/python3).
zstd datasets are read through h5py when it has the filter (hdf5plugin); otherwise each HDF5
chunk is read raw and decoded here (libzstd through ctypes, then un-shuffled).
"""
import ctypes
import ctypes.util
import itertools
import json
import math
import os
import re

import h5py
import numpy as np
import xxhash

try:
    import hdf5plugin  # noqa: F401  (registers the zstd filter with h5py)
except ImportError:
    pass

NOTES = []


def note(msg):
    if msg not in NOTES:
        NOTES.append(msg)
        print("note: " + msg)


# ------------------------------------------------------------------------ hashing

def xxh3(data):
    """XXH3_64bits, seed 0."""
    return xxhash.xxh3_64_intdigest(bytes(data))


def tag(data):
    """A digest (FORMAT.md §3.1): "xxh3-64:" + %016x."""
    return "xxh3-64:%016x" % xxh3(data)


EMPTY_CHECKSUM = "xxh3-64:2d06800538d394c2"
BLOCK_MIN, BLOCK_MAX = 4096, 64 << 20


def block_digests(raw, block_bytes):
    """FORMAT.md §7.1: XXH3-64 of each block of `block_bytes` bytes."""
    return [xxh3(raw[i:i + block_bytes]) for i in range(0, len(raw), block_bytes)]


def blocks_hex(digests):
    return "".join("%016x" % d for d in digests)


def blocked_checksum(digests):
    """The v2 chunk checksum: the digest of the block digests, 8 bytes little-endian each."""
    return tag(b"".join(d.to_bytes(8, "little") for d in digests))


def valid_block_bytes(b):
    return isinstance(b, int) and not isinstance(b, bool) and BLOCK_MIN <= b <= BLOCK_MAX and b & (b - 1) == 0


# ------------------------------------------------------------------ metadata.json

DIGEST_HEAD = b'"digest": "xxh3-64:'
DIGEST_SUFFIX = 38  # '"digest": "xxh3-64:' + 16 hex + '"}' + '\n'
HEX16 = re.compile(rb"^[0-9a-f]{16}$")
HEX_BLOCKS = re.compile(r"^(?:[0-9a-f]{16})*$")


def digest_suffix(raw):
    """The digest a metadata.json ends with in the exact form writers write (FORMAT.md §3.6),
    or None if it does not end so."""
    tail = raw[-DIGEST_SUFFIX:]
    if len(raw) < DIGEST_SUFFIX or not tail.startswith(DIGEST_HEAD) or tail[-3:] != b'"}\n' \
            or not HEX16.match(tail[19:35]):
        return None
    return "xxh3-64:" + tail[19:35].decode()


LENIENT_TAIL = re.compile(rb'"digest"[ \t\r\n]*:[ \t\r\n]*"(xxh3-64:[0-9a-f]{16})"[ \t\r\n]*\}[ \t\r\n]*\Z')


def find_digest(raw):
    """(position of the opening quote of "digest", digest, exact form?) of a metadata.json
    whose last member is its digest, JSON whitespace allowed around its tokens (what a reader
    MAY accept, §3.6); None if it does not end with one."""
    at = raw.rfind(b'"digest"')
    m = LENIENT_TAIL.match(raw, at) if at >= 0 else None
    if m is None:
        return None
    return at, m.group(1).decode(), digest_suffix(raw) is not None


def with_digest(body):
    """Completes a metadata.json text: `body` is everything up to the opening quote of
    "digest" (it ends with ', ' or ',\\n'); returns the bytes of the whole file."""
    return body + DIGEST_HEAD + tag(body)[8:].encode() + b'"}\n'


class DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(f"member {k!r} given twice")
        out[k] = v
    return out


def loads_strict(text):
    """JSON with duplicate member names refused (FORMAT.md §8.1)."""
    return json.loads(text, object_pairs_hook=_no_duplicates)


def read_metadata(path):
    """Returns (raw bytes, parsed document, problems) of a metadata.json, its digest checked."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as ex:
        return b"", None, [f"metadata.json: cannot be read: {ex}"]
    problems = []
    found = find_digest(raw)
    if found is not None:
        at, digest, exact = found
        if tag(raw[:at]) != digest:
            problems.append(f"metadata.json: digest {digest} differs from the digest of its content "
                            f"{tag(raw[:at])} (FORMAT.md §3.6)")
        if not exact:
            problems.append(f"metadata.json: ends with {raw[at + 35:]!r} after the digest value: a writer MUST end it "
                            f"with exactly '\"}}' and one line feed (FORMAT.md §3.6)")
    try:
        meta = loads_strict(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as ex:
        return raw, None, problems + [f"metadata.json: not valid UTF-8 JSON: {ex}"]
    if not isinstance(meta, dict):
        return raw, None, problems + ["metadata.json: not a JSON object"]
    if meta.get("format_version") == 2 and found is None:
        problems.append("metadata.json: a version-2 file that does not end with its digest (FORMAT.md §3.6)")
    elif "digest" in meta and (found is None or list(meta)[-1] != "digest"):
        problems.append("metadata.json: the digest member is not the last of the file (FORMAT.md §3.6)")
    return raw, meta, problems


# ---------------------------------------------------------------------- layouts

class LayoutError(ValueError):
    pass


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def split_parts(split, n):
    """[(start, size)] of one dimension of extent n (FORMAT.md §3.3)."""
    if not isinstance(split, dict):
        raise LayoutError(f"split {split!r} is not an object")
    if "step" in split:
        s = split["step"]
        if not is_int(s):
            raise LayoutError(f"step {s!r} is not an integer")
        if n == 0:
            if s != 0:
                raise LayoutError(f"step {s} for an extent of 0 (must be 0)")
            return [(0, 0)]
        if s < 1:
            raise LayoutError(f"step {s} for extent {n} (must be >= 1)")
        return [(o, min(s, n - o)) for o in range(0, n, s)]
    sizes = split.get("sizes")
    if not isinstance(sizes, list) or not sizes or not all(is_int(s) for s in sizes):
        raise LayoutError(f"split {split!r} has neither a step nor integer sizes")
    if n == 0 and sizes != [0]:
        raise LayoutError(f"part sizes {sizes} for an extent of 0 (must be [0])")
    if n > 0 and not all(s >= 1 for s in sizes):
        raise LayoutError(f"part sizes {sizes} are not all >= 1")
    if sum(sizes) != n:
        raise LayoutError(f"part sizes {sizes} sum to {sum(sizes)}, not the extent {n}")
    starts = [0]
    for s in sizes[:-1]:
        starts.append(starts[-1] + s)
    return list(zip(starts, sizes))


def layout_chunks(layout, shape, nfiles):
    """The chunks a layout names: [(offsets, sizes, file index)] in layout order."""
    rank = len(shape)
    if "chunks" in layout:
        out = []
        for c in layout["chunks"]:
            offs, sizes, f = c.get("offsets"), c.get("sizes"), c.get("file")
            if not (isinstance(offs, list) and isinstance(sizes, list) and len(offs) == rank and len(sizes) == rank):
                raise LayoutError(f"chunk {c!r}: offsets/sizes not of the tensor's rank {rank}")
            if not is_int(f) or not 0 <= f < nfiles:
                raise LayoutError(f"chunk {c!r}: file index {f!r} outside files (of {nfiles})")
            out.append((list(offs), list(sizes), f))
        return out
    grid, fmap = layout.get("grid"), layout.get("files")
    if not isinstance(grid, list) or len(grid) != rank:
        raise LayoutError(f"grid of {len(grid) if isinstance(grid, list) else grid!r} splits for a tensor of rank {rank}")
    parts = [split_parts(s, n) for s, n in zip(grid, shape)]
    ncells = math.prod(len(p) for p in parts)
    if isinstance(fmap, list):
        if len(fmap) != ncells:
            raise LayoutError(f"cell->file list of {len(fmap)} entries for {ncells} cells")
    elif isinstance(fmap, dict):
        strides = fmap.get("strides")
        if not is_int(fmap.get("base")) or not isinstance(strides, list) or len(strides) != rank \
                or not all(is_int(t) for t in strides):
            raise LayoutError(f"cell->file map {fmap!r} is not a base and {rank} integer strides")
    else:
        raise LayoutError(f"cell->file map {fmap!r} is neither a list nor an affine map")
    zero_volume = 0 in shape
    if zero_volume and ncells != 1:
        raise LayoutError(f"a grid of {ncells} cells for a tensor of zero volume (must be 1)")
    out = []
    for cell, idx in enumerate(itertools.product(*[range(len(p)) for p in parts])):
        f = fmap[cell] if isinstance(fmap, list) else fmap["base"] + sum(i * t for i, t in zip(idx, fmap["strides"]))
        if not is_int(f) or not 0 <= f < nfiles:
            raise LayoutError(f"cell {cell} {list(idx)} maps to file index {f!r}, outside files (of {nfiles})")
        if not zero_volume:
            out.append(([p[j][0] for p, j in zip(parts, idx)], [p[j][1] for p, j in zip(parts, idx)], f))
        elif cell == 0:
            out.append(([0] * rank, list(shape), f))
    return out


def describe_grid(shape, chunks):
    """The grid splits that `chunks` [(offsets, sizes)] form, or None if they form no grid:
    the distinct offsets of each dimension cut it into parts and every cell
    is exactly one chunk. Used to check that a writer describes a grid as one (§3.3)."""
    if 0 in shape:
        return None
    rank = len(shape)
    cuts = [sorted({c[0][d] for c in chunks}) for d in range(rank)]
    parts = [[(b, e - b) for b, e in zip(cut, cut[1:] + [shape[d]])] for d, cut in enumerate(cuts)]
    boxes = {(tuple(o), tuple(s)) for o, s in chunks}
    cells = 0
    for idx in itertools.product(*[range(len(p)) for p in parts]):
        box = (tuple(parts[d][j][0] for d, j in enumerate(idx)), tuple(parts[d][j][1] for d, j in enumerate(idx)))
        if box not in boxes:
            return None
        cells += 1
    return parts if cells == len(chunks) else None


# ------------------------------------------------------------------------ dtypes

# FORMAT.md §4: dtype -> (numpy storage dtype, dtype attribute or None)
STORAGE = {
    "float64": ("<f8", None), "float32": ("<f4", None), "float16": ("<f2", None),
    "bfloat16": ("<u2", "bfloat16"), "float8_e4m3fn": ("u1", "float8_e4m3fn"),
    "float8_e5m2": ("u1", "float8_e5m2"), "int8": ("i1", None), "int16": ("<i2", None),
    "int32": ("<i4", None), "int64": ("<i8", None), "uint8": ("u1", None), "bool": ("u1", "bool"),
    "uint16": ("<u2", None), "uint32": ("<u4", None), "uint64": ("<u8", None),
    "float8_e8m0fnu": ("u1", "float8_e8m0fnu"), "float4_e2m1fn_x2": ("u1", "float4_e2m1fn_x2"),
}
FLOATING = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
            "float4_e2m1fn_x2"}


def itemsize(dtype):
    return np.dtype(STORAGE[dtype][0]).itemsize


def escape_key(key):
    """FORMAT.md §5.2."""
    s = key.replace("%", "%25").replace("/", "%2F").replace("@", "%40")
    return "%2E" + s[1:] if s.startswith(".") else s


def dataset_name(key, shape, offsets, sizes):
    if list(offsets) == [0] * len(shape) and list(sizes) == list(shape):
        return escape_key(key)
    return escape_key(key) + "@" + ",".join(str(o) for o in offsets)


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
# float8_e8m0fnu: 2^(b - 127), 0xff NaN.
E8M0 = np.array([math.nan if b == 0xFF else 2.0 ** (b - 127) for b in range(256)], dtype=np.float64)
# float4 e2m1 nibble: sign, 2 exponent bits (bias 1), 1 mantissa bit.
E2M1 = np.array([(-1.0 if n & 8 else 1.0) * ((n & 1) * 0.5 if (n >> 1) & 3 == 0 else
                                             (1 + (n & 1) / 2.0) * 2.0 ** (((n >> 1) & 3) - 1))
                 for n in range(16)], dtype=np.float64)


def to_float64(dtype, raw):
    """Decodes raw little-endian bytes of a floating dtype into float64 values."""
    if dtype in ("float64", "float32", "float16"):
        return np.frombuffer(raw, STORAGE[dtype][0]).astype(np.float64)
    if dtype == "bfloat16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "float8_e5m2":
        return (np.frombuffer(raw, "u1").astype(np.uint16) << 8).view(np.float16).astype(np.float64)
    if dtype == "float8_e4m3fn":
        return E4M3FN[np.frombuffer(raw, "u1")]
    if dtype == "float8_e8m0fnu":
        return E8M0[np.frombuffer(raw, "u1")]
    if dtype == "float4_e2m1fn_x2":  # two values per byte, low nibble first (FORMAT.md §4.5)
        b = np.frombuffer(raw, "u1")
        return np.stack([E2M1[b & 0xF], E2M1[b >> 4]], axis=-1).reshape(-1)
    raise ValueError(dtype)


def stats_of(dtype, raw):
    """FORMAT.md §7.3, from the data."""
    v = to_float64(dtype, raw)
    fin = v[np.isfinite(v)]
    s = {"nan_count": int(np.isnan(v).sum()), "inf_count": int(np.isinf(v).sum()), "finite_count": int(fin.size)}
    if fin.size:
        s.update(min=float(fin.min()), max=float(fin.max()), mean=float(fin.mean()),
                 l2=float(np.sqrt(np.sum(fin * fin))))
    else:
        s.update(min=None, max=None, mean=None, l2=0.0)
    return s


def aggregate_stats(stats):
    """FORMAT.md §7.4: a tensor's stats from its chunks' stats."""
    fin = sum(s["finite_count"] for s in stats)
    out = {"nan_count": sum(s["nan_count"] for s in stats), "inf_count": sum(s["inf_count"] for s in stats),
           "finite_count": fin}
    live = [s for s in stats if s["finite_count"] > 0]
    if fin == 0:
        out.update(min=None, max=None, mean=None, l2=0.0)
        return out
    out["min"] = min(s["min"] for s in live)
    out["max"] = max(s["max"] for s in live)
    out["mean"] = sum(s["mean"] * s["finite_count"] for s in live) / fin
    out["l2"] = None if any(s["l2"] is None for s in live) else math.sqrt(sum(s["l2"] ** 2 for s in live))
    return out


# ------------------------------------------------------------------------ shards

ZSTD_FILTER = 32015
SHUFFLE_FILTER = 2
INDEX_ATTR = "ckpt_shard_index"


def index_text(h5file):
    """The exact bytes of a shard's ckpt_shard_index text (FORMAT.md §5.5), or None."""
    if INDEX_ATTR not in h5file.attrs:
        return None
    v = h5file.attrs[INDEX_ATTR]
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, np.ndarray):
        v = v.item()
    return bytes(v).rstrip(b"\0")


def h5_order_is_le(ds):
    t = ds.id.get_type()
    return t.get_size() == 1 or t.get_order() == h5py.h5t.ORDER_LE


def filters_of(ds):
    plist = ds.id.get_create_plist()
    return [plist.get_filter(i) for i in range(plist.get_nfilters())]


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
        lib.ZSTD_compress.restype = ctypes.c_size_t
        lib.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
        lib.ZSTD_compressBound.restype = ctypes.c_size_t
        lib.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
        return lib
    return None


ZSTD_LIB = _load_zstd()


def zstd_decompress(src, size):
    dst = ctypes.create_string_buffer(max(size, 1))
    n = ZSTD_LIB.ZSTD_decompress(dst, size, src, len(src))
    if ZSTD_LIB.ZSTD_isError(n):
        raise ValueError("zstd frame does not decode")
    return dst.raw[:n]


def zstd_compress(data, level):
    cap = ZSTD_LIB.ZSTD_compressBound(len(data))
    dst = ctypes.create_string_buffer(cap)
    n = ZSTD_LIB.ZSTD_compress(dst, cap, data, len(data), level)
    return dst.raw[:n]


def read_raw_chunks(ds, storage_dtype):
    """Reads a chunked, shuffled+zstd dataset without the zstd filter: every HDF5 chunk raw,
    decoded here. Returns row-major bytes of the whole dataset."""
    shape, cshape = ds.shape, ds.chunks
    item = np.dtype(storage_dtype).itemsize
    out = np.zeros(shape, dtype=storage_dtype)
    if 0 in shape:
        return out.tobytes()
    filters = [f[0] for f in filters_of(ds)]
    nelem = int(np.prod(cshape))
    for offs in itertools.product(*[range(0, n, c) for n, c in zip(shape, cshape)]):
        mask, data = ds.id.read_direct_chunk(offs)
        for i in reversed(range(len(filters))):
            if mask & (1 << i):
                continue
            if filters[i] == ZSTD_FILTER:
                data = zstd_decompress(data, nelem * item)
            elif filters[i] == SHUFFLE_FILTER:
                data = np.frombuffer(data, "u1").reshape(item, nelem).T.tobytes()
            else:
                raise ValueError(f"unexpected filter {filters[i]}")
        if len(data) != nelem * item:
            raise ValueError(f"HDF5 chunk at {offs} decodes to {len(data)} bytes, expected {nelem * item}")
        block = np.frombuffer(data, storage_dtype).reshape(cshape)
        dst = tuple(slice(o, min(o + c, n)) for o, c, n in zip(offs, cshape, shape))
        out[dst] = block[tuple(slice(0, s.stop - s.start) for s in dst)]
    return out.tobytes()


def read_dataset(ds, storage_dtype):
    """Row-major little-endian bytes of a dataset, or None if it cannot be read here."""
    if ds.chunks is not None and filters_of(ds):
        try:
            return np.ascontiguousarray(ds[()], dtype=storage_dtype).tobytes()
        except (OSError, ValueError):
            if ZSTD_LIB is None:
                note("zstd datasets not read: no hdf5plugin for h5py and no libzstd for ctypes")
                return None
            note("h5py has no zstd filter (no hdf5plugin): zstd chunks read raw and decoded with libzstd")
            return read_raw_chunks(ds, storage_dtype)
    return np.ascontiguousarray(ds[()], dtype=storage_dtype).tobytes()


# ------------------------------------------------------------------ a checkpoint

PACK_NAME = re.compile(r"^\.ckpt_pack\.(0|[1-9][0-9]*)$")  # §5.7


class Chunk:
    """One stored chunk (or blob), whatever the version: where it is and how it is verified."""

    def __init__(self, key, file_index, file, record, offsets=None, sizes=None):
        self.key, self.file_index, self.file = key, file_index, file
        self.offsets, self.sizes = offsets, sizes  # None for a bytes entry
        self.dataset = record.get("dataset")
        self.checksum = record.get("checksum")
        self.stored_bytes = record.get("stored_bytes")
        self.compression = record.get("compression")
        self.stats = record.get("stats")
        self.block_bytes = record.get("block_bytes", 0)  # 0: a v1 chunk
        self.blocks = record.get("blocks", "")
        self.offset = record.get("offset")
        self.pack_offset = record.get("pack_offset")  # a packed chunk (§5.7): `dataset` is its pack

    def where(self):
        box = "" if self.offsets is None else f" chunk {self.offsets}+{self.sizes}"
        return f"{self.file}: {self.key!r}{box}"


class Checkpoint:
    """A checkpoint read per FORMAT.md. Problems are reported to `err` (default: collected
    in `problems`), not raised.
    `tensors[key]` / `blobs[key]` are the resolved chunks; `records[file]` the index records
    (v2: each with the entry it was matched to)."""

    def __init__(self, path, meta_validator=None, index_validator=None, err=None):
        self.dir = path
        self.problems = []
        self._err = err or self.problems.append
        self.tensors, self.blobs, self.records, self.indexes, self.h5 = {}, {}, {}, {}, {}
        self.raw, self.meta, probs = read_metadata(os.path.join(path, "metadata.json"))
        for p in probs:
            self.err(p)
        if self.meta is None:
            return
        if meta_validator is not None:
            for e in sorted(meta_validator.iter_errors(self.meta), key=lambda e: list(e.absolute_path)):
                where = "/".join(str(p) for p in e.absolute_path)
                self.err(f"metadata.json does not validate at '{where}': {e.message[:300]}")
        self.version = self.meta.get("format_version")
        self.files = [f.get("name") for f in self.meta.get("files", []) if isinstance(f, dict)]
        self.index_validator = index_validator
        try:
            if self.version == 2:
                self._resolve_v2()
            elif self.version == 1:
                self._resolve_v1()
            else:
                self.err(f"metadata.json: format_version {self.version!r} is not 1 or 2")
        except (KeyError, TypeError, ValueError, OSError) as ex:
            self.err(f"metadata.json: cannot be resolved: {type(ex).__name__}: {ex}")

    def err(self, msg):
        self._err(msg)

    def close(self):
        for f in self.h5.values():
            f.close()
        self.h5 = {}

    def open_file(self, name):
        if name not in self.h5:
            self.h5[name] = h5py.File(os.path.join(self.dir, name), "r")
        return self.h5[name]

    def entries(self):
        return self.meta.get("entries", {})

    def _index(self, i):
        """The parsed index of file i, trusted only once its digest matched (§7.5)."""
        if i in self.indexes:
            return self.indexes[i]
        name, fmeta = self.files[i], self.meta["files"][i]
        self.indexes[i] = None
        path = os.path.join(self.dir, name)
        if not os.path.isfile(path):
            self.err(f"{name}: listed in files but not there")
            return None
        text = index_text(self.open_file(name))
        if text is None:
            self.err(f"{name}: no root attribute {INDEX_ATTR}")
            return None
        if self.version == 2 and tag(text) != fmeta.get("index"):
            self.err(f"{name}: the digest of {INDEX_ATTR} is {tag(text)}, files[{i}].index says "
                     f"{fmeta.get('index')!r}: the index is not trusted (FORMAT.md §7.5)")
            return None
        try:
            idx = loads_strict(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as ex:
            self.err(f"{name}: {INDEX_ATTR} is not JSON: {ex}")
            return None
        if self.index_validator is not None:
            for e in list(self.index_validator.iter_errors(idx))[:5]:
                where = "/".join(str(p) for p in e.absolute_path)
                self.err(f"{name}: {INDEX_ATTR} does not validate at '{where}': {e.message[:300]}")
        if not isinstance(idx, dict) or idx.get("format") != "ckpt-shard" or idx.get("format_version") != self.version:
            self.err(f"{name}: {INDEX_ATTR} header is not ckpt-shard version {self.version}")
            return None
        self.indexes[i] = idx
        self.records[name] = idx.get("chunks", [])
        return idx

    def _resolve_v2(self):
        lookup, used = {}, {}
        for i, name in enumerate(self.files):
            idx = self._index(i)
            table = lookup[i] = {}
            for n, r in enumerate(idx.get("chunks", []) if idx else []):
                k = (r.get("key"), tuple(r.get("offsets", ())) if r.get("dtype") != "bytes" else None)
                table.setdefault(k, []).append(n)
            used[i] = set()

        def find(i, key, offsets):
            hits = lookup.get(i, {}).get((key, offsets), [])
            if self.indexes.get(i) is None:
                return None  # already reported
            if len(hits) != 1:
                self.err(f"{self.files[i]}: {key!r}: the index holds {len(hits)} records for the chunk at "
                         f"{list(offsets) if offsets is not None else 'the blob'}, expected exactly 1 (FORMAT.md §5.5)")
                return None
            used[i].add(hits[0])
            return self.indexes[i]["chunks"][hits[0]]

        for key, e in self.entries().items():
            kind = e.get("type")
            if kind == "tensor":
                shape = e.get("shape", [])
                try:
                    placed = layout_chunks(e.get("layout", {}), shape, len(self.files))
                except LayoutError as ex:
                    self.err(f"metadata.json: {key!r}: bad layout: {ex} (FORMAT.md §3.3)")
                    continue
                chunks = []
                for offs, sizes, f in placed:
                    r = find(f, key, tuple(offs))
                    if r is None:
                        continue
                    c = Chunk(key, f, self.files[f], r, offs, sizes)
                    if r.get("sizes") != sizes or r.get("dtype") != e.get("dtype") or r.get("shape") != shape:
                        self.err(f"{c.where()}: index record says dtype {r.get('dtype')} shape {r.get('shape')} "
                                 f"sizes {r.get('sizes')}, the layout dtype {e.get('dtype')} shape {shape} sizes {sizes}")
                    chunks.append(c)
                self._check_stored(key, e, chunks)
                codecs = [c.compression for c in chunks if c.compression]
                if "compression" in e and e["compression"] not in codecs or "compression" not in e and codecs:
                    self.err(f"metadata.json: {key!r}: compression {e.get('compression')!r}, but its chunks have "
                             f"{codecs[:1] or 'none'} (FORMAT.md §3.2)")
                self.tensors[key] = chunks
            elif kind == "bytes":
                f = e.get("file")
                if not is_int(f) or not 0 <= f < len(self.files):
                    self.err(f"metadata.json: bytes {key!r}: file index {f!r} outside files")
                    continue
                r = find(f, key, None)
                if r is None:
                    continue
                if r.get("size") != e.get("size"):
                    self.err(f"{self.files[f]}: bytes {key!r}: index size {r.get('size')}, metadata {e.get('size')}")
                self.blobs[key] = Chunk(key, f, self.files[f], r)
                self._check_stored(key, e, [self.blobs[key]])
        for i, idx in self.indexes.items():
            if idx is None:
                continue
            extra = [idx["chunks"][n] for n in range(len(idx.get("chunks", []))) if n not in used[i]]
            for r in extra[:5]:
                self.err(f"{self.files[i]}: index record {r.get('key')!r} {r.get('offsets', '')} is not a chunk "
                         f"metadata.json assigns to this file (FORMAT.md §5.5)")

    def _check_stored(self, key, e, chunks):
        """FORMAT.md §3.5: an entry's stored_bytes sums its chunks'."""
        want = sum(c.stored_bytes for c in chunks if is_int(c.stored_bytes))
        if e.get("stored_bytes") != want:
            self.err(f"metadata.json: {key!r}: stored_bytes {e.get('stored_bytes')!r}, its records sum to {want}")

    def _resolve_v1(self):
        pos = {n: i for i, n in enumerate(self.files)}
        for key, e in self.entries().items():
            if e.get("type") == "tensor":
                self.tensors[key] = [Chunk(key, pos.get(c["file"]), c["file"], c, c["offsets"], c["sizes"])
                                     for c in e.get("chunks", [])]
            elif e.get("type") == "bytes":
                self.blobs[key] = Chunk(key, pos.get(e["file"]), e["file"], e)
        for i in range(len(self.files)):
            self._index(i)  # v1: parsed for the comparison with metadata, never trusted (A.4)

    # ----------------------------------------------------------- reading chunks

    def dataset(self, c):
        if c.file not in self.h5 and not os.path.isfile(os.path.join(self.dir, c.file)):
            self.err(f"{c.where()}: file does not exist")
            return None
        f = self.open_file(c.file)
        if c.dataset not in f:
            self.err(f"{c.where()}: dataset {c.dataset!r} not in the file")
            return None
        return f[c.dataset]

    def read_packed(self, c, ds, dtype):
        """A packed chunk's bytes (§5.7): its slice of the pack, a 1-D uint8 contiguous dataset."""
        if not PACK_NAME.match(c.dataset or "") or ds.dtype != np.dtype("u1") or len(ds.shape) != 1 \
                or ds.chunks is not None or filters_of(ds):
            self.err(f"{c.where()}: pack {c.dataset!r} is not a 1-D uint8 contiguous pack dataset (§5.7)")
            return None
        if dtype == "bytes" or c.compression is not None or c.offset is None:
            self.err(f"{c.where()}: a packed record must be an uncompressed tensor chunk with an offset (§5.7)")
            return None
        n = itemsize(dtype) * int(np.prod(c.sizes))
        p = c.pack_offset
        if not is_int(p) or p < 0 or p + n > ds.shape[0]:
            self.err(f"{c.where()}: its {n} bytes at byte {p!r} of pack {c.dataset!r} lie outside the pack's "
                     f"{ds.shape[0]} bytes (§5.7)")
            return None
        return ds[p:p + n].tobytes()

    def check_packs(self):
        """§5.7: in every file, the members of each pack tile it exactly (no gap, no overlap)
        and give one pack data offset."""
        packs = {}  # (file, pack) -> [(pack_offset, bytes, chunk)]
        for key, chunks in self.tensors.items():
            dtype = self.entries()[key].get("dtype")
            for c in chunks:
                if c.pack_offset is not None and is_int(c.pack_offset):
                    n = itemsize(dtype) * int(np.prod(c.sizes))
                    packs.setdefault((c.file, c.dataset), []).append((c.pack_offset, n, c))
        for (file, name), members in packs.items():
            members.sort(key=lambda m: m[0])
            f = self.open_file(file)
            ds = f.get(name) if name in f else None
            if ds is None or len(ds.shape) != 1:
                continue  # reported by read_packed
            end = 0
            for p, n, c in members:
                if p != end:
                    self.err(f"{c.where()}: starts at byte {p} of pack {name!r}, the members before it end at "
                             f"byte {end}: {'an overlap' if p < end else 'a gap'} (§5.7)")
                if c.offset is not None and ds.id.get_offset() is not None and c.offset != ds.id.get_offset() + p:
                    self.err(f"{c.where()}: offset {c.offset}, its pack's data offset + pack_offset is "
                             f"{ds.id.get_offset() + p} (§5.7)")
                end = max(end, p + n)
            if end != ds.shape[0]:
                self.err(f"{file}: pack {name!r}: its members cover {end} bytes, its extent is {ds.shape[0]} (§5.7)")

    def read_chunk(self, c, dtype):
        """The chunk's raw bytes through h5py; for a v2 contiguous chunk also by its `offset`
        (checked inside the file, and equal). None when it cannot be read."""
        ds = self.dataset(c)
        if ds is None:
            return None
        storage = "u1" if dtype == "bytes" else STORAGE[dtype][0]
        data = read_dataset(ds, storage) if c.pack_offset is None else self.read_packed(c, ds, dtype)
        if c.offset is not None and data is not None:
            size = os.path.getsize(os.path.join(self.dir, c.file))
            if not (is_int(c.offset) and 0 <= c.offset and c.offset + len(data) <= size):
                self.err(f"{c.where()}: offset {c.offset} + {len(data)} bytes lies outside the file of {size} (§8.8)")
            else:
                with open(os.path.join(self.dir, c.file), "rb") as f:
                    f.seek(c.offset)
                    direct = f.read(len(data))
                if direct != data:
                    self.err(f"{c.where()}: the {len(data)} bytes at offset {c.offset} are not the dataset's data")
        return data

    def verify_chunk(self, c, data):
        """Checks raw bytes against the record: v1 checksum, or v2 blocks and checksum (§7)."""
        if self.version == 1:
            if c.checksum != tag(data):
                self.err(f"{c.where()}: checksum {c.checksum!r}, the data hashes to {tag(data)!r}")
            return
        if not valid_block_bytes(c.block_bytes):
            self.err(f"{c.where()}: block_bytes {c.block_bytes!r} is not a power of two in [4096, 64 MiB] (§7.1)")
            return
        digests = block_digests(data, c.block_bytes)
        if not isinstance(c.blocks, str) or len(c.blocks) != 16 * len(digests) or not HEX_BLOCKS.match(c.blocks):
            self.err(f"{c.where()}: blocks holds {len(c.blocks) if isinstance(c.blocks, str) else c.blocks!r} hex "
                     f"digits, expected {16 * len(digests)} for {len(data)} bytes in blocks of {c.block_bytes}")
            return
        recorded = [int(c.blocks[i:i + 16], 16) for i in range(0, len(c.blocks), 16)]
        if c.checksum != blocked_checksum(recorded):  # the checksum proves the block digests (§7.5)
            self.err(f"{c.where()}: checksum {c.checksum!r}, the recorded block digests hash to "
                     f"{blocked_checksum(recorded)!r}")
        for b, (got, want) in enumerate(zip(digests, recorded)):
            if got != want:
                lo = b * c.block_bytes
                self.err(f"{c.where()}: block {b} (bytes {lo}..{min(lo + c.block_bytes, len(data))}) has digest "
                         f"{got:016x}, the record says {want:016x}")
