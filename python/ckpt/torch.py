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

The C++ runtime's checkpoints (ckpt::runtime: model, optimizer and scheduler state under
their prefixes, FORMAT.md section 10.1) load into an equivalent torch model and optimizer:

    ckpt.torch.load_module_state("ckpt/step-100", model)             # prefix "model"
    ckpt.torch.load_optimizer_state("ckpt/step-100", model, optimizer)  # prefix "optimizer"

optimizer_state_dict() returns the torch.optim state_dict without loading it.
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

__all__ = ["StorageWriter", "StorageReader", "USER_KEY", "load_module_state", "optimizer_state_dict",
           "load_optimizer_state"]

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
            if t.device.type != "cpu" and not (t.device.type == "cuda" and _ckpt.HAVE_CUDA):
                t = t.cpu()  # CUDA memory goes to libckpt as it is where ckpt has its CUDA backend
            dtype, sizes, data = _arrays.read_view(t, item.index.fqn, device_ok=True)
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


# What the runtime's optimizers keep per parameter (FORMAT.md 10.1), by torch.optim class.
_RUNTIME_STATE = {"adam": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}


def _as_checkpoint(checkpoint):
    return checkpoint if isinstance(checkpoint, _ckpt.Checkpoint) else _ckpt.open(checkpoint)


def load_module_state(checkpoint, module, *, prefix="model", verify_checksums=True):
    """Loads the tensors `prefix + "." + name` of the checkpoint at `checkpoint` (a path or a
    ckpt.Checkpoint) into `module`'s parameters and buffers, in place: what the C++ runtime
    saved for a model prepared under `prefix`, whatever world size and strategy saved it.
    Every entry of module.state_dict() must be there with its shape (else ckpt.Error naming
    the checkpoint and key); other entries of the checkpoint are ignored."""
    r = _as_checkpoint(checkpoint)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            key = f"{prefix}.{name}" if prefix else name
            _check_entry(r, key, tensor.shape)
            if _arrays.torch_dtype_name(tensor.dtype, key) == r.entry(key)["dtype"] and tensor.is_contiguous():
                r.read(key, out=tensor, verify=verify_checksums)
            else:
                tensor.copy_(r.read(key, verify=verify_checksums, like="torch"))


def _check_entry(r, key, shape):
    if key not in r:
        raise _ckpt.Error("not found", f"{r.path}: no key '{key}'", r.path, key)
    e = r.entry(key)
    if e["kind"] != "tensor" or list(e["shape"]) != list(shape):
        raise _ckpt.Error("invalid argument",
                          f"{r.path}: key '{key}' is a {e['dtype']} {e['kind']} of shape {e['shape']}, "
                          f"expected a tensor of shape {list(shape)}", r.path, key)


def _optimizer_kind(optimizer):
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        if any(g.get("amsgrad") for g in optimizer.param_groups):
            raise _ckpt.Error("invalid argument", "ckpt.torch: the runtime's AdamW keeps no max_exp_avg_sq: "
                              "amsgrad=True cannot resume from it")
        return "adam"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    raise _ckpt.Error("invalid argument", f"ckpt.torch: no mapping of the runtime's optimizer state to "
                      f"{type(optimizer).__name__} (Adam, AdamW and SGD have one)")


def _scalar_dtype():
    """The dtype torch's Adam keeps `step` in (float32 unless the default dtype is float64)."""
    try:
        from torch.optim.optimizer import _get_scalar_dtype
    except ImportError:
        return torch.float32
    return _get_scalar_dtype()


def optimizer_state_dict(checkpoint, module, optimizer, *, prefix="optimizer", model_prefix="model",
                         verify_checksums=True):
    """The torch.optim state_dict of `optimizer` (Adam, AdamW or SGD over `module`'s
    parameters) that the C++ runtime's optimizer saved under `prefix` in `checkpoint` (a path
    or a ckpt.Checkpoint), its model under `model_prefix`: parameter i of the optimizer's
    param groups is the parameter `name` of module.named_parameters(), whose state is
    `prefix.state.<model_prefix>.<name>.*`; Adam/AdamW get exp_avg, exp_avg_sq and step (a
    float tensor, as torch keeps it), SGD momentum_buffer; every group gets the saved lr.
    Hyper-parameters the runtime does not save (betas, eps, weight decay, momentum) stay the
    optimizer's own. The tensors are read whole, as saved, whatever the world size of the save.
    Raises ckpt.Error naming the file and key when one is missing or has another shape, or
    when the checkpoint holds another optimizer's state."""
    r = _as_checkpoint(checkpoint)
    kind = _optimizer_kind(optimizer)
    names = {id(p): n for n, p in module.named_parameters()}
    sd = optimizer.state_dict()
    lr_key = f"{prefix}.lr"
    if lr_key not in r:
        raise _ckpt.Error("not found", f"{r.path}: no key '{lr_key}' (no optimizer saved under prefix "
                          f"'{prefix}')", r.path, lr_key)
    lr = float(r.read(lr_key))
    state = {}
    for group, saved_group in zip(optimizer.param_groups, sd["param_groups"]):
        saved_group["lr"] = lr
        for p, index in zip(group["params"], saved_group["params"]):
            if id(p) not in names:
                raise _ckpt.Error("invalid argument", "ckpt.torch: an optimizer parameter is not a parameter of the "
                                  "module given")
            base = f"{prefix}.state.{model_prefix}.{names[id(p)]}." if model_prefix else \
                f"{prefix}.state.{names[id(p)]}."
            other = [n for k, ns in _RUNTIME_STATE.items() if k != kind for n in ns if base + n in r]
            if other:
                raise _ckpt.Error("invalid argument",
                                  f"{r.path}: key '{base + other[0]}' is state of another optimizer than "
                                  f"{type(optimizer).__name__}", r.path, base + other[0])
            s = {}
            for n in _RUNTIME_STATE[kind]:
                _check_entry(r, base + n, p.shape)
                s[n] = r.read(base + n, verify=verify_checksums, like="torch")
            if kind == "adam":
                if base + "step" not in r:
                    raise _ckpt.Error("not found", f"{r.path}: no key '{base}step'", r.path, base + "step")
                s["step"] = torch.tensor(float(r.read(base + "step")), dtype=_scalar_dtype())
            state[index] = s
    sd["state"] = state
    return sd


def load_optimizer_state(checkpoint, module, optimizer, **kwargs):
    """optimizer.load_state_dict(optimizer_state_dict(checkpoint, module, optimizer, ...)):
    the C++ runtime's optimizer state, loaded into a torch optimizer (see there)."""
    optimizer.load_state_dict(optimizer_state_dict(checkpoint, module, optimizer, **kwargs))
