"""ckpt as the storage layer of torch.distributed.checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    import ckpt.torch
    dcp.save(state_dict, storage_writer=ckpt.torch.StorageWriter("ckpt/step-100"))
    dcp.load(state_dict, storage_reader=ckpt.torch.StorageReader("ckpt/step-100"))

The path may be an s3:// URL (where ckpt.HAVE_S3): the checkpoint then lives on S3-compatible
object storage, reached as ckpt.save reaches it (the AWS environment, or s3=ckpt.S3Options(...)),
and committed by one conditional PUT of its metadata.json.

What dcp.save writes is a ckpt checkpoint (ckpt-verify, -inspect, -merge and -diff read it):
each DTensor shard is a chunk at its global offsets, a region several ranks hold (Replicate
placements, plain tensors every rank has) is written once after ckpt checks that the copies
agree, and the state-dict type (SHARDED when there are DTensors, else FULL) and every
DTensor's mesh and placements are recorded in metadata.json. Non-tensor values are DCP's
pickles, stored as bytes entries and listed in the user metadata. StorageReader unpickles
them with torch.load(weights_only=True)'s rules (numbers, strings, bytes, lists, tuples,
dicts, sets, tensors, torch.Size, dtypes; and BytesIO, frozenset, slice, range; more with
torch.serialization.add_safe_globals): a pickle of anything else is refused with a
ckpt.Error naming the key, as it could run code from the checkpoint, unless the reader
is given allow_pickle=True ("runs code from the checkpoint": for checkpoints you trust).

StorageReader reads any ckpt checkpoint, whoever wrote it: DCP plans the resharding from
the stored chunks, and each read is one ckpt region read straight into the target tensor.
Scalars, JSON values and bytes entries the C++ library wrote load as Python numbers, JSON
values and bytes.

The ranks of the save are those of `process_group` (default: the default group when
torch.distributed is initialized, else one process); dcp.save(..., no_dist=True) or
use_collectives=False saves this process's state alone.

The C++ runtime's checkpoints (ckpt::runtime: model, optimizer and scheduler state under
their prefixes, FORMAT.md section 10.1) load into an equivalent torch model and optimizer:

    ckpt.torch.load_module_state("ckpt/step-100", model)             # prefix "model"
    ckpt.torch.load_optimizer_state("ckpt/step-100", model, optimizer)  # prefix "optimizer"

optimizer_state_dict() returns the torch.optim state_dict without loading it.
"""
import io
import json
import math
import os
from collections.abc import Mapping

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
from . import _arrays, _s3
from ._state import is_dtensor

__all__ = ["StorageWriter", "StorageReader", "USER_KEY", "unpickle", "load_module_state", "optimizer_state_dict",
           "load_optimizer_state"]

# Key of the user metadata under which the writer records what DCP needs back.
USER_KEY = "torch.distributed.checkpoint"


def _done(value):
    fut = Future()
    fut.set_result(value)
    return fut


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

    A drop-in for FileSystemWriter: its arguments are taken in its order, with its defaults.
    overwrite (default True, as FileSystemWriter): a re-save to `path` replaces the committed
    checkpoint there, atomically (readers see the old one or the new one, never neither);
    False refuses it ("already exists"). _extensions: None, or DCP's ZStandard (the same as
    compression="zstd"); any other extension is refused. single_file_per_rank, sync_files,
    thread_count, per_thread_copy_ahead, cache_staged_state_dict and serialization_format are
    accepted and change nothing: ckpt writes one shard file per writing rank, always fsyncs
    before its atomic commit, writes straight from the tensors' memory (no staging copies)
    in its own format (FORMAT.md).

    ckpt's own: check_replicas: copies of a region held by several ranks must agree (a
    desync is an error naming key and ranks); compression: None or "zstd"; user_metadata: a
    JSON object recorded beside DCP's; process_group: the ranks of the save (default: the
    default group when torch.distributed is initialized), the group given to dcp.save;
    single_process: save this process's state alone; s3: ckpt.S3Options (or a dict of its
    fields) for an s3:// path, overriding the AWS environment. dcp.save(..., no_dist=True) and
    use_collectives=False save this process's state alone too (a checkpoint of world size 1:
    ranks that all do so need a path each).

    If any rank fails, every rank raises (DCP's CheckpointException names the cause) and
    nothing is committed. Every key of the state dict DCP's planner was given must be in the
    plan: a plan that leaves one out is refused, never committed without it."""

    def __init__(self, path=None, single_file_per_rank=True, sync_files=True, thread_count=1,
                 per_thread_copy_ahead=10_000_000, cache_staged_state_dict=False, overwrite=True,
                 _extensions=None, serialization_format=None, *, check_replicas=True, compression=None, level=3,
                 user_metadata=None, process_group=None, single_process=False, s3=None):
        super().__init__()
        self.path = None if path is None else os.fspath(path)
        self.s3 = _s3.options(s3)
        self.overwrite = bool(overwrite)
        self.check_replicas = check_replicas
        for ext in _extensions or ():
            if type(ext).__name__ != "ZStandard":
                raise _ckpt.Error("unsupported", f"ckpt.torch.StorageWriter: extension {type(ext).__name__}: ckpt "
                                  "takes DCP's ZStandard only (compression='zstd')")
            compression = compression or "zstd"
        if compression not in (None, "none", "zstd"):
            raise _ckpt.Error("invalid argument", f"ckpt.torch.StorageWriter: compression {compression!r}: ckpt "
                              "knows 'zstd' and 'none'")
        self.compression = compression
        self.level = level
        self.user_metadata = dict(user_metadata or {})
        self.process_group = process_group
        self.single_process = single_process
        self._local_plan = None
        self._use_collectives = True
        self._global_plans = None
        self.is_coordinator = True

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._local_plan = None
        self._global_plans = None

    def set_up_storage_writer(self, is_coordinator, *args, use_collectives=True, **kwargs):
        self.is_coordinator = is_coordinator
        self._use_collectives = use_collectives

    def prepare_local_plan(self, plan):
        # Kept whole: DCP's global plan drops the copies of replicated tensors, but ckpt wants
        # every holder's claim so that it can check them against each other.
        self._local_plan = plan
        return plan

    def prepare_global_plan(self, plans):
        self._global_plans = len(plans)
        return plans

    def _save_comm(self):
        """The ranks of this save: None when DCP runs without them (no_dist=True, which gives
        the coordinator a global plan of its own local plan alone, or use_collectives=False)."""
        if self.single_process or not self._use_collectives:
            return None
        if not (dist.is_available() and dist.is_initialized()):
            return None
        if self.is_coordinator and self._global_plans == 1 and dist.get_world_size(self.process_group) > 1:
            return None
        return _ckpt.ProcessGroupComm(self.process_group)

    def _tensor_plan(self, planner):
        """This rank's whole local plan. With DefaultSavePlanner(enable_plan_caching=True) a
        save whose plan did not change hands DCP an empty, unusable plan; the planner keeps
        the real one (`plan`)."""
        local = self._local_plan
        if local is None or not getattr(local, "usable", True):
            local = getattr(planner, "plan", None)
        if local is None or not getattr(local, "usable", True):
            raise _ckpt.Error("unsupported", f"{self.path}: the save planner ({type(planner).__name__}) gave no usable "
                              "local plan (plan caching without the plan kept): nothing was written", self.path)
        return local

    def _entries(self, plan, planner):
        """(entries, keep, sharded, pickled, missing): what this rank writes; `missing` the
        keys of the planner's state dict that this rank does not write."""
        if self.path is None:
            raise _ckpt.Error("invalid argument", "ckpt.torch.StorageWriter: no path (pass one, or checkpoint_id)")
        _s3.target(self.path, self.s3)  # an s3:// path this build cannot reach fails every rank here
        tensor_items = [i for i in self._tensor_plan(planner).items if i.type != WriteItemType.BYTE_IO]
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
            # A rank's empty piece of a non-empty tensor is no chunk (FORMAT.md §3.3); a tensor
            # of zero volume is one chunk, the whole tensor, claimed by every rank that holds it.
            if math.prod(td.size) == 0:
                tensors[fqn][4][:] = [([0] * len(td.size), list(td.size), data)]
            elif data.size:
                tensors[fqn][4].append((list(td.chunk.offsets), list(td.chunk.sizes), data))
        for item in byte_items:
            buf = planner.resolve_data(item)
            entries.append(("bytes", item.index.fqn, buf.getvalue() if hasattr(buf, "getvalue") else bytes(buf)))
        pickled = sorted(i.index.fqn for i in byte_items)
        state = getattr(planner, "state_dict", None)
        written = set(tensors) | set(pickled)
        missing = sorted(k for k in state if k not in written) if isinstance(state, Mapping) else []
        return entries, keep, sharded, pickled, missing

    def write_data(self, plan, planner):
        comm = self._save_comm()
        failure, status = None, {"error": None, "pickled": [], "missing": []}
        try:
            entries, keep, sharded, status["pickled"], status["missing"] = self._entries(plan, planner)
        except Exception as e:  # noqa: BLE001 (every rank must learn of it: see _agree)
            failure = e
            status["error"] = [getattr(e, "code", "internal error"), f"{type(e).__name__}: {e}"]
        everyone = _agree(comm, status)
        if failure is not None:
            raise failure
        _raise_any_failure(everyone, self.path)
        pickled = sorted({n for s in everyone for n in s["pickled"]})
        lost = sorted({n for s in everyone for n in s["missing"]} - set(pickled))
        if lost:
            lost = _not_written_anywhere(comm, lost, {e[1] for e in entries})
        if lost:
            raise _ckpt.Error("internal error", f"{self.path}: the save plan of {type(planner).__name__} leaves out "
                              f"key '{lost[0]}' ({len(lost)} of the state dict's keys in all): nothing was written",
                              self.path, lost[0])
        state = getattr(planner, "state_dict", None)
        user = dict(self.user_metadata)
        user[USER_KEY] = {"pickled": pickled, "planner_data": _jsonable(getattr(planner, "mappings", None))}
        mesh = _mesh_record(state)
        path, s3 = _s3.target(self.path, self.s3)
        _ckpt._ckpt.save(path, entries, _ckpt.comm_of(comm), "SHARDED" if sharded or mesh else "FULL",
                         self.overwrite, self.check_replicas, self.compression, self.level, json.dumps(user),
                         json.dumps(mesh), s3)
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


def _agree(comm, status):
    """Every rank's `status` (a JSON object), this rank's included: a collective every rank
    reaches, whether its preparation failed or not, so that one rank's failure reaches the
    others instead of leaving them in ckpt's collective save (a hang, or mismatched
    collectives)."""
    if comm is None:
        return [status]
    return [json.loads(blob) for blob in comm.all_gather(json.dumps(status).encode())]


def _raise_any_failure(everyone, path):
    failed = [(r, s["error"]) for r, s in enumerate(everyone) if s["error"]]
    if failed:
        code = failed[0][1][0] if failed[0][1][0] in _ckpt.errors.CODES else "internal error"
        raise _ckpt.Error(code, "; ".join(f"rank {r}: {text}" for r, (_, text) in failed) +
                          f" (nothing was written to {path})", path)


def _not_written_anywhere(comm, keys, mine):
    """The `keys` that no rank writes (`mine`: what this rank writes)."""
    found = set(keys) & mine
    if comm is not None:
        found = {k for blob in comm.all_gather(json.dumps(sorted(found)).encode()) for k in json.loads(blob)}
    return [k for k in keys if k not in found]


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
    is read from the stored chunks that overlap it). verify_checksums: check every byte read.

    The bytes entries DCP pickled at save time are unpickled with torch.load(weights_only=True)'s
    rules (see the module's doc) and handed to DCP's planner re-pickled from the values so
    built; a pickle of any other type is refused (ckpt.Error "unsupported" naming the key).
    allow_pickle=True hands DCP the stored pickles as they are, which DCP's planner loads with
    torch.load(weights_only=False): that RUNS CODE FROM THE CHECKPOINT, for checkpoints whose
    writer you trust only. _extension_registry (FileSystemReader's) is accepted and unused.
    s3: ckpt.S3Options (or a dict of its fields) for an s3:// path, overriding the AWS
    environment."""

    def __init__(self, path=None, _extension_registry=None, *, verify_checksums=True, allow_pickle=False, s3=None):
        super().__init__()
        self.path = None if path is None else os.fspath(path)
        self.s3 = _s3.options(s3)
        self.verify_checksums = verify_checksums
        self.allow_pickle = allow_pickle
        self._reader = None

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._reader = None

    def _open(self):
        if self._reader is None:
            if self.path is None:
                raise _ckpt.Error("invalid argument", "ckpt.torch.StorageReader: no path (pass one, or checkpoint_id)")
            self._reader = _ckpt.open(self.path, s3=self.s3)
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
        value = r.read(key, verify=self.verify_checksums)  # bytes, a number or a JSON value
        if pickled:
            if self.allow_pickle:
                return value
            value = unpickle(value, key=key, file=r.path)
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        if not isinstance(checkpoint_id, (str, os.PathLike)):
            return False
        if _s3.is_url(os.fspath(checkpoint_id)):
            return True  # (no request made here: a missing checkpoint is reported by the load)
        return os.path.isfile(os.path.join(os.fspath(checkpoint_id), "metadata.json"))


# Types a DCP pickle may hold beyond torch.load(weights_only=True)'s own: values DCP
# pickles (a BytesIO in a state dict is stored as itself) and harmless builtins.
_SAFE_EXTRA = (io.BytesIO, frozenset, slice, range)


def unpickle(data, *, key=None, file=None, allow_pickle=False):
    """The value of a pickle `data` (DCP's non-tensor values: torch.save's zip or a plain
    pickle) built with torch.load(weights_only=True)'s rules: numbers, strings, bytes, lists,
    tuples, dicts, sets, tensors, torch.Size, dtypes, OrderedDict, BytesIO, frozenset,
    slice, range, and what torch.serialization.add_safe_globals allows. Anything else is
    refused (ckpt.Error "unsupported" naming `key` and `file`) without running any of it.
    allow_pickle=True: torch.load(weights_only=False), which RUNS CODE FROM THE DATA."""
    if allow_pickle:
        return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")
    try:
        with torch.serialization.safe_globals(list(_SAFE_EXTRA)):
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 (torch's refusal, or a damaged pickle)
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "GLOBAL" in ln or "global" in ln.split(" ")[:3]), lines[0] if lines else
                   type(e).__name__)
        where = f"{file}: " if file else ""
        raise _ckpt.Error("unsupported", f"{where}key '{key}': a pickle that torch.load(weights_only=True) refuses "
                          f"({why}); loading it could run code from the checkpoint: pass allow_pickle=True only "
                          "for a checkpoint whose writer you trust", file, key) from None


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
