"""ckpt: distributed-training checkpoints (libckpt) from Python.

    ckpt.save(path, state_dict, comm=None, ...)    collective save; arrays are not copied
    ckpt.load(path, state_dict, comm=None, ...)    collective load, in place, any layout
    ckpt.open(path)                                a reader: metadata, keys, read(key, region)
    ckpt.Writer(path, ...)                         write a checkpoint chunk by chunk
    ckpt.torch.StorageWriter / StorageReader       torch.distributed.checkpoint's storage layer

A path is a local directory or, where ckpt.HAVE_S3, a checkpoint on S3-compatible object storage,
"s3://bucket/prefix/step-100": reached with the AWS environment and profile files (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_PROFILE), which
the `s3=` argument (a ckpt.S3Options, or a dict of its fields) overrides field by field.

State dicts hold numpy arrays and CPU torch tensors (CUDA ones too where ckpt.HAVE_CUDA;
DTensors as their shards), scalars, bytes and JSON values; nested dicts are namespaces joined
with "." (ckpt._state describes them).
comm is None (one process), a torch.distributed ProcessGroup, or a ckpt comm (ckpt.comm).
Every failure raises ckpt.Error, with .code, .file and .key.
"""
import json
from dataclasses import dataclass, field

from . import _arrays, _ckpt, _s3, _state
from ._s3 import HAVE_S3, S3Options
from .comm import ProcessGroupComm, comm_of
from .errors import Error
from ._state import Json, Shard

__version__ = _ckpt.version
FORMAT_VERSION = _ckpt.format_version
DTYPES = tuple(_arrays.DTYPE_SIZES)
HAVE_CUDA = bool(_ckpt.have_cuda)  # save and load take CUDA torch tensors (built with ckpt::cuda)
# HAVE_S3: paths may be s3:// URLs (built with libckpt's S3 client, CKPT_WITH_S3).

__all__ = ["save", "load", "open", "read_metadata", "Writer", "Checkpoint", "LoadReport", "Error", "Json", "Shard",
           "S3Options", "ProcessGroupComm", "DTYPES", "FORMAT_VERSION", "HAVE_CUDA", "HAVE_S3"]


def _json_arg(value, what):
    if value is None:
        return "{}" if what == "user_metadata" else "null"
    return value if isinstance(value, str) else json.dumps(value)


def save(path, state_dict, comm=None, *, state_dict_type=None, overwrite=False, check_replicas=True,
         compression=None, level=3, user_metadata=None, mesh=None, s3=None):
    """COLLECTIVE. Saves this rank's `state_dict` to the checkpoint directory `path`, or to
    an s3:// URL (committed by one conditional PUT of metadata.json: of two saves racing to
    one new path exactly one wins, the other raising "already exists").

    Tensors are written from their memory (C-contiguous ones are not copied). Replicas (the
    same box on several ranks) are written once, after checking that they agree. Either every
    rank returns, or every rank raises ckpt.Error and nothing at `path` changed.
    state_dict_type: "SHARDED" (default), "FULL" or "LOCAL"; compression: None or "zstd";
    user_metadata: a JSON object (dict or text); mesh: JSON describing the device mesh;
    s3: ckpt.S3Options (or a dict of its fields) for an s3:// path.
    """
    path, s3 = _s3.target(path, s3)
    with _state.paused_gc():
        entries, views = _state.save_entries(state_dict)
    _ckpt.save(path, entries, comm_of(comm), str(state_dict_type or "SHARDED").upper(), overwrite,
               check_replicas, compression, level, _json_arg(user_metadata, "user_metadata"),
               _json_arg(mesh, "mesh"), s3)
    del views


@dataclass
class LoadReport:
    missing_keys: list = field(default_factory=list)
    unexpected_keys: list = field(default_factory=list)
    mismatched: list = field(default_factory=list)
    bytes_read: int = 0
    bytes_read_direct: int = 0

    @property
    def ok(self):
        return not (self.missing_keys or self.unexpected_keys or self.mismatched)


def load(path, state_dict, comm=None, *, state_dict_type="SHARDED", strict=True, verify_checksums=True,
         io_threads=None, direct_io="off", s3=None):
    """COLLECTIVE. Fills `state_dict` from the checkpoint at `path`, whatever layout and world
    size saved it: tensors in place (each rank gets exactly its region), scalars, bytes and
    JSON values replaced in their dicts. With strict=False, missing, unexpected and
    mismatched keys are reported in the LoadReport instead of raising. io_threads: readers
    per rank (None: the library's default, LoadOptions::io_threads). direct_io: "off" (the
    default) reads through the page cache; "auto" reads the bulk of contiguous chunks with
    O_DIRECT on a local disk's file system (ext4, XFS, btrfs, f2fs, ZFS) unless the page cache
    already holds most of a shard; "on" reads them with O_DIRECT
    wherever the file system allows it (LoadOptions::direct_io; the report's bytes_read_direct
    says how much was). An s3:// checkpoint is read by ranged GETs of the blocks wanted, every
    block checked against its digest (s3: ckpt.S3Options, or a dict of its fields)."""
    path, s3 = _s3.target(path, s3)
    with _state.paused_gc():
        entries, places, targets = _state.load_entries(state_dict)
    missing, unexpected, mismatched, nbytes, ndirect, values = _ckpt.load(
        path, entries, comm_of(comm), str(state_dict_type).upper(), strict, verify_checksums,
        io_threads or 0, str(direct_io), s3)
    with _state.paused_gc():
        for target in targets:
            target.finish()
        for key, raw in values.items():
            if key in missing or any(m.startswith(key + ":") for m in mismatched):
                continue
            container, name, old = places[key]
            container[name] = _state.loaded_value(old, raw)
    return LoadReport(list(missing), list(unexpected), list(mismatched), nbytes, ndirect)


def read_metadata(path, *, s3=None):
    """metadata.json of the checkpoint at `path` (a directory or an s3:// URL), parsed and
    checked, as a dict."""
    path, s3 = _s3.target(path, s3)
    return json.loads(_ckpt.read_metadata(path, False, s3))


def _region(region, shape, key):
    """(offsets, sizes) of `region`: None (all), a tuple of slices / ints, or (offsets, sizes)."""
    if region is None:
        return [0] * len(shape), list(shape)
    if (isinstance(region, tuple) and len(region) == 2 and all(isinstance(r, (list, tuple)) for r in region)):
        return list(region[0]), list(region[1])
    if not isinstance(region, tuple):
        region = (region,)
    if len(region) > len(shape):
        raise Error("invalid argument", f"key '{key}': region has {len(region)} dimensions, the tensor {len(shape)}",
                    key=key)
    offsets, sizes = [], []
    for d, extent in enumerate(shape):
        r = region[d] if d < len(region) else slice(None)
        if isinstance(r, int):
            r = slice(r, r + 1)
        if not isinstance(r, slice) or r.step not in (None, 1):
            raise Error("invalid argument", f"key '{key}': region {region!r}: slices with step 1 only", key=key)
        start, stop, _ = r.indices(extent)
        offsets.append(start)
        sizes.append(max(0, stop - start))
    return offsets, sizes


class Checkpoint:
    """A committed checkpoint, opened for reading (ckpt.open). Not collective; one per thread."""

    def __init__(self, path, resolve=True, *, s3=None):
        path, s3 = _s3.target(path, s3)
        self._r = _ckpt.Reader(path, resolve, s3)
        self.path = self._r.dir()
        self.metadata = json.loads(self._r.metadata_json())
        self._entries = {key: {"kind": kind, "dtype": dtype, "shape": list(shape)}
                         for key, kind, dtype, shape in self._r.entries()}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._r = None

    @property
    def format_version(self):
        return self.metadata["format_version"]

    @property
    def state_dict_type(self):
        return self.metadata["state_dict_type"]

    @property
    def world_size(self):
        return self.metadata["world_size"]

    @property
    def mesh(self):
        return self.metadata["mesh"]

    @property
    def user_metadata(self):
        return self.metadata["user"]

    def keys(self):
        return list(self._entries)

    def __contains__(self, key):
        return key in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)

    def entry(self, key):
        """{"kind", "dtype", "shape"} of `key` (kind: tensor, scalar, bytes or json)."""
        try:
            return dict(self._entries[key])
        except KeyError:
            raise Error("not found", f"{self.path}: no key '{key}'", self.path, key) from None

    def chunks(self, key):
        """[(offsets, sizes, file)] of the stored chunks of tensor `key`."""
        return [(list(o), list(s), f) for o, s, f in self._r.chunks(key)]

    def stats(self, key, chunk=None):
        """Statistics recorded at save (min, max, mean, l2, nan/inf/finite counts) of a
        floating tensor, or of one of its stored chunks; None for other dtypes."""
        return self._r.stats(key) if chunk is None else self._r.chunk_stats(key, chunk)

    def read(self, key, region=None, *, out=None, verify=True, like=None):
        """The value of `key`. A tensor's `region` (global coordinates: a tuple of slices, or
        (offsets, sizes)) is read into `out` or a new array: numpy, or torch when numpy has no
        such dtype (bfloat16, float8) or like="torch". Scalars and JSON values come back as
        Python values, bytes entries as bytes."""
        e = self.entry(key)
        if e["kind"] == "bytes":
            return self._r.read_bytes(key, verify)
        if e["kind"] in ("scalar", "json"):
            return json.loads(self._r.value(key))
        offsets, sizes = _region(region, e["shape"], key)
        result = out if out is not None else _arrays.empty(e["dtype"], sizes, like)
        target = _arrays.raw_view(result, e["dtype"], sizes, key)
        self._r.read_region(key, offsets, sizes, target.bytes, verify)
        target.finish()
        return result

    def verify_chunk(self, key, index):
        """Checks stored chunk `index` of `key` against its checksum (raises ckpt.Error)."""
        self._r.verify_chunk(key, index)

    @property
    def bytes_read(self):
        return self._r.bytes_read()


def open(path, resolve=True, *, s3=None):  # noqa: A001 (ckpt.open, as the API reads)
    """Opens the committed checkpoint at `path` (a directory or an s3:// URL; s3: a
    ckpt.S3Options or a dict of its fields) for reading."""
    return Checkpoint(path, resolve, s3=s3)


class Writer:
    """Writes a checkpoint from one process, chunk by chunk (libckpt's CheckpointWriter):
    nothing appears at `path` until commit(). As a context manager it commits on success and
    drops the checkpoint on an exception. On an s3:// path (s3: ckpt.S3Options, or a dict of
    its fields) the files are staged locally and uploaded at commit(), which then commits
    metadata.json by one conditional PUT."""

    def __init__(self, path, *, state_dict_type="FULL", world_size=1, num_files=1, overwrite=False,
                 compression=None, level=3, user_metadata=None, mesh=None, s3=None):
        path, s3 = _s3.target(path, s3)
        self._w = _ckpt.Writer(path, str(state_dict_type).upper(), world_size, num_files, overwrite,
                               compression, level, _json_arg(user_metadata, "user_metadata"),
                               _json_arg(mesh, "mesh"), s3)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None and self._w.is_open():
            self.commit()
        else:
            self.abort()

    def write(self, key, value, *, offsets=None, shape=None, file_index=0):
        """A tensor chunk (array `value` at global `offsets` of a tensor of global `shape`;
        by default the whole tensor; or a ckpt.Shard), or a scalar, bytes or JSON value."""
        if isinstance(value, Shard):
            value, offsets, shape = value.array, value.offsets, value.shape
        if _arrays.is_array(value):
            dtype, sizes, data = _arrays.read_view(value, key)
            shape = sizes if shape is None else list(shape)
            offsets = [0] * len(sizes) if offsets is None else list(offsets)
            self._w.write_chunk(key, dtype, shape, offsets, sizes, data, file_index)
            return
        kind, _, *rest = _state._save_entry(key, value, [])
        if kind == "scalar":
            self._w.write_scalar(key, rest[0], rest[1])
        elif kind == "bytes":
            self._w.write_bytes(key, rest[0], file_index)
        else:
            self._w.write_json(key, rest[0])

    def commit(self):
        """Checks the tiling, writes metadata.json and renames the checkpoint into place (on
        s3://: uploads the files, then PUTs metadata.json); returns the metadata as a dict."""
        return json.loads(self._w.commit())

    def abort(self):
        self._w.abort()
