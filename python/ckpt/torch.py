"""ckpt as the storage layer of torch.distributed.checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    import ckpt.torch
    dcp.save(state_dict, storage_writer=ckpt.torch.StorageWriter("ckpt/step-100"))
    dcp.load(state_dict, storage_reader=ckpt.torch.StorageReader("ckpt/step-100"))

What dcp.save writes is a ckpt checkpoint (ckpt-verify, -inspect, -merge and -diff read it):
each DTensor shard is a chunk at its global offsets, a region several ranks hold (Replicate
placements, plain tensors every rank has) is written once after ckpt checks that the copies
agree, and the state-dict type (SHARDED when there are DTensors, else FULL) and every
DTensor's mesh and placements are recorded in metadata.json. Non-tensor values are DCP's
pickles, stored as bytes entries and listed in the user metadata.

StorageReader reads any ckpt checkpoint, whoever wrote it: DCP plans the resharding from
the stored chunks, and each read is one ckpt region read straight into the target tensor.
Scalars, JSON values and bytes entries the C++ library wrote load as Python numbers, JSON
values and bytes.

The ranks of the save are those of `process_group` (default: the default group when
torch.distributed is initialized, else one process); dcp.save(..., no_dist=True) needs
single_process=True here.
"""
import io
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import StorageReader as _DcpStorageReader
from torch.distributed.checkpoint import StorageWriter as _DcpStorageWriter
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

import ckpt as _ckpt
from . import _arrays
from ._state import is_dtensor

__all__ = ["StorageWriter", "StorageReader", "USER_KEY"]

# Key of the user metadata under which the writer records what DCP needs back.
USER_KEY = "torch.distributed.checkpoint"


def _done(value):
    fut = Future()
    fut.set_result(value)
    return fut


def _comm(process_group, single_process):
    if single_process or not (dist.is_available() and dist.is_initialized()):
        return None
    return _ckpt.ProcessGroupComm(process_group)


def _placement(p):
    """"Shard(0)", "StridedShard(0)", "Replicate()", or torch's own text for the others."""
    if p.is_shard():
        return f"{type(p).__name__.lstrip('_')}({p.dim})"
    if p.is_replicate():
        return "Replicate()"
    return str(p)


def _mesh_record(state_dict):
    """JSON of the meshes and placements of the DTensors in DCP's flattened state dict."""
    meshes, tensors = [], {}
    for fqn, value in (state_dict or {}).items():
        if not is_dtensor(value):
            continue
        m = value.device_mesh
        desc = {"device_type": m.device_type, "shape": list(m.shape),
                "dim_names": list(m.mesh_dim_names) if m.mesh_dim_names else None, "ranks": m.mesh.tolist()}
        if desc not in meshes:
            meshes.append(desc)
        tensors[fqn] = {"mesh": meshes.index(desc), "placements": [_placement(p) for p in value.placements]}
    if not meshes:
        return None
    return {"framework": "torch.distributed.checkpoint", "meshes": meshes, "tensors": tensors}


class StorageWriter(_DcpStorageWriter):
    """Writes dcp.save's state as a ckpt checkpoint at `path` (a directory).

    overwrite: replace a committed checkpoint there (atomically); check_replicas: copies of
    a region held by several ranks must agree (a desync is an error naming key and ranks);
    compression: None or "zstd"; user_metadata: a JSON object recorded beside DCP's."""

    def __init__(self, path=None, *, overwrite=False, check_replicas=True, compression=None, level=3,
                 user_metadata=None, process_group=None, single_process=False):
        super().__init__()
        self.path = None if path is None else os.fspath(path)
        self.overwrite = overwrite
        self.check_replicas = check_replicas
        self.compression = compression
        self.level = level
        self.user_metadata = dict(user_metadata or {})
        self.process_group = process_group
        self.single_process = single_process
        self._local_plan = None

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._local_plan = None

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan):
        # Kept whole: DCP's global plan drops the copies of replicated tensors, but ckpt wants
        # every holder's claim so that it can check them against each other.
        self._local_plan = plan
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def write_data(self, plan, planner):
        if self.path is None:
            raise _ckpt.Error("invalid argument", "ckpt.torch.StorageWriter: no path (pass one, or checkpoint_id)")
        tensor_items = [i for i in (self._local_plan or plan).items if i.type != WriteItemType.BYTE_IO]
        byte_items = [i for i in plan.items if i.type == WriteItemType.BYTE_IO]
        entries, keep, tensors, sharded = [], [], {}, False
        for item in tensor_items:
            t = planner.resolve_data(item)
            td = item.tensor_data
            if item.type == WriteItemType.SHARD:
                sharded = True
            if t.device.type != "cpu":
                t = t.cpu()
            dtype, sizes, data = _arrays.read_view(t, item.index.fqn)
            keep.append(data)
            fqn = item.index.fqn
            if fqn not in tensors:
                tensors[fqn] = ("tensor", fqn, dtype, list(td.size), [])
                entries.append(tensors[fqn])
            if data.size:
                tensors[fqn][4].append((list(td.chunk.offsets), list(td.chunk.sizes), data))
        for item in byte_items:
            buf = planner.resolve_data(item)
            entries.append(("bytes", item.index.fqn, buf.getvalue() if hasattr(buf, "getvalue") else bytes(buf)))
        state = getattr(planner, "state_dict", None)
        user = dict(self.user_metadata)
        user[USER_KEY] = {"pickled": sorted(i.index.fqn for i in byte_items),
                          "planner_data": _jsonable(getattr(planner, "mappings", None))}
        comm = _comm(self.process_group, self.single_process)
        user[USER_KEY]["pickled"] = _union(comm, user[USER_KEY]["pickled"])
        mesh = _mesh_record(state)
        _ckpt._ckpt.save(self.path, entries, _ckpt.comm_of(comm), "SHARDED" if sharded or mesh else "FULL",
                         self.overwrite, self.check_replicas, self.compression, self.level, json.dumps(user),
                         json.dumps(mesh))
        del keep
        results = [WriteResult(index=i.index, size_in_bytes=_item_bytes(i), storage_data=None) for i in plan.items]
        return _done(results)

    def finish(self, metadata, results):
        # The checkpoint was committed by the collective save in write_data: every rank
        # agreed on it before any returned.
        return None

    def storage_meta(self):
        try:
            from torch.distributed.checkpoint.metadata import StorageMeta
        except ImportError:
            return None
        return StorageMeta(checkpoint_id=self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))


def _union(comm, names):
    """The sorted union of `names` over the ranks of `comm` (None: this process)."""
    if comm is None:
        return names
    everyone = comm.all_gather(json.dumps(names).encode())
    return sorted({n for blob in everyone for n in json.loads(blob)})


def _jsonable(mappings):
    if not mappings:
        return None
    try:
        return {k: list(v) for k, v in mappings.items()}
    except TypeError:
        return None


def _item_bytes(item):
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return 0
    n = 1
    for s in item.tensor_data.chunk.sizes:
        n *= s
    return n * item.tensor_data.properties.dtype.itemsize


class StorageReader(_DcpStorageReader):
    """Reads any ckpt checkpoint at `path` for dcp.load (DCP reshards: every target region
    is read from the stored chunks that overlap it). verify_checksums: check every byte read."""

    def __init__(self, path=None, *, verify_checksums=True):
        super().__init__()
        self.path = None if path is None else os.fspath(path)
        self.verify_checksums = verify_checksums
        self._reader = None

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._reader = None

    def _open(self):
        if self._reader is None:
            if self.path is None:
                raise _ckpt.Error("invalid argument", "ckpt.torch.StorageReader: no path (pass one, or checkpoint_id)")
            self._reader = _ckpt.open(self.path)
        return self._reader

    def read_metadata(self):
        r = self._open()
        sd = {}
        for key in r.keys():
            e = r.entry(key)
            if e["kind"] != "tensor":
                sd[key] = BytesStorageMetadata()
                continue
            chunks = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s, _ in r.chunks(key)]
            sd[key] = TensorStorageMetadata(properties=TensorProperties(dtype=getattr(torch, e["dtype"])),
                                            size=torch.Size(e["shape"]), chunks=chunks)
        ours = (r.user_metadata or {}).get(USER_KEY) or {}
        planner_data = {k: tuple(v) for k, v in (ours.get("planner_data") or {}).items()}
        md = Metadata(state_dict_metadata=sd, planner_data=planner_data)
        try:
            from torch.distributed.checkpoint.metadata import StorageMeta
            md.storage_meta = StorageMeta(checkpoint_id=self.path)
        except (ImportError, AttributeError):
            pass
        return md

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.metadata = metadata

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        r = self._open()
        pickled = set(((r.user_metadata or {}).get(USER_KEY) or {}).get("pickled") or [])
        for item in plan.items:
            key = item.storage_index.fqn
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(self._bytes(r, key, key in pickled)))
                continue
            target = planner.resolve_tensor(item).detach()
            offsets = [int(c) + int(s) for c, s in zip(item.storage_index.offset, item.storage_offsets)]
            lengths = [int(n) for n in item.lengths]
            stored = r.entry(key)["dtype"]
            direct = target.device.type == "cpu" and _arrays.torch_dtype_name(target.dtype, key) == stored
            if direct:
                r.read(key, (offsets, lengths), out=target, verify=self.verify_checksums)
            else:  # another device or dtype: read as stored, then copy (converting) as DCP does
                tmp = r.read(key, (offsets, lengths), verify=self.verify_checksums, like="torch")
                target.copy_(tmp)
            planner.commit_tensor(item, target)
        return _done(None)

    def _bytes(self, r, key, pickled):
        if pickled:
            return r.read(key, verify=self.verify_checksums)
        value = r.read(key, verify=self.verify_checksums)  # bytes, a number or a JSON value
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike)) and os.path.isfile(
            os.path.join(os.fspath(checkpoint_id), "metadata.json"))
