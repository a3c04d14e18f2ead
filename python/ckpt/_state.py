"""State dicts as libckpt's entry lists (python/src/module.cc describes the tuples).

A state dict is a mapping from key to value; nested mappings are namespaces joined with "."
({"model": {"fc.weight": t}} is key "model.fc.weight"), as torch.distributed.checkpoint
flattens them. Values:
  numpy array, torch tensor    a tensor (a DTensor: this rank's shard, at its global offsets)
  ckpt.Shard(array, offsets, shape)   this rank's region of a tensor of global `shape`
  bool, int, float, numpy scalar  a scalar
  bytes, bytearray, memoryview    a bytes entry
  ckpt.Json(value), str, None, list, tuple   a JSON entry
"""
import contextlib
import gc
import json
import math
import numbers
from collections.abc import Mapping

import numpy as np

from . import _arrays
from .errors import Error


class Json:
    """Marks a value to store as a JSON entry (a dict would otherwise be a namespace)."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"ckpt.Json({self.value!r})"

    def __eq__(self, other):
        return isinstance(other, Json) and other.value == self.value


class Shard:
    """This rank's region of a larger tensor: `array` holds the elements at global `offsets`
    of a tensor of global `shape` (ckpt::Tensor::Sharded's chunk). Several ranks holding the
    same region are replicas: written once, after checking that they agree."""

    def __init__(self, array, offsets, shape):
        self.array = array
        self.offsets = [int(o) for o in offsets]
        self.shape = [int(n) for n in shape]

    def __repr__(self):
        return f"ckpt.Shard(offsets={self.offsets}, shape={self.shape})"


def flatten(state_dict, prefix=""):
    """[(key, container, name, value)] in order: container[name] is the value's place."""
    if not isinstance(state_dict, Mapping):
        raise Error("invalid argument", f"a state dict is a mapping, not {type(state_dict).__name__}")
    out = []
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise Error("invalid argument", f"key {name!r} under '{prefix}': keys are strings")
        key = prefix + name
        if isinstance(value, Mapping):
            out.extend(flatten(value, key + "."))
        else:
            out.append((key, state_dict, name, value))
    return out


def _dtensor_class():
    torch = _arrays._torch()
    if torch is None:
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def is_dtensor(value):
    cls = _dtensor_class()
    return cls is not None and isinstance(value, cls)


def dtensor_chunk(t, key):
    """(global shape, offsets, local tensor) of this rank's shard of a DTensor."""
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    if any(isinstance(p, Partial) for p in t.placements):
        raise Error("invalid argument", f"key '{key}': a DTensor with a Partial placement holds partial sums; "
                    "redistribute it to Shard or Replicate first", key=key)
    local = t.to_local()
    shape, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if list(local.shape) != list(shape):
        raise Error("unsupported", f"key '{key}': local shard {list(local.shape)} is not the {list(shape)} "
                    "its placements give (padded or strided sharding)", key=key)
    return list(t.shape), list(offsets), local


def scalar_dtype(value):
    """ckpt dtype of a Python or numpy scalar, or None if the value is not a scalar."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, np.generic):
        name = value.dtype.name
        return name if name in _arrays.DTYPE_SIZES else None
    if isinstance(value, numbers.Integral):
        return "int64"
    if isinstance(value, numbers.Real):
        return "float64"
    return None


def scalar_value(value, dtype):
    if dtype == "bool":
        return int(bool(value))
    if dtype.startswith(("float", "bfloat")):
        return float(value)  # a NaN or Inf is refused by libckpt, naming the key
    return int(value)


@contextlib.contextmanager
def paused_gc():
    """The cyclic garbage collector paused (if it ran): building the entries of a state dict
    of many tensors makes many small objects, and every collection they trigger walks the
    whole state (a third of ckpt.load's time at 20,000 tensors). Nothing made here is cyclic.
    Not around libckpt's work, so other threads of the program collect as usual then."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def save_entries(state_dict):
    """(entries, views): views keep the arrays' bytes alive during the save."""
    entries, views = [], []
    for key, _, _, value in flatten(state_dict):
        entries.append(_save_entry(key, value, views))
    return entries, views


def _dtensor_chunks(shape, offsets, local, data):
    """A rank's chunk of a DTensor: none for an empty piece of a non-empty tensor (FORMAT.md
    §3.3), the whole tensor for one of zero volume (one chunk, claimed by every holder)."""
    if math.prod(shape) == 0:
        return [([0] * len(shape), list(shape), data)]
    return [(offsets, list(local.shape), data)] if local.numel() > 0 else []


def _save_entry(key, value, views):
    if isinstance(value, Shard):
        dtype, sizes, data = _arrays.read_view(value.array, key, device_ok=True)
        views.append(data)
        return ("tensor", key, dtype, value.shape, [(value.offsets, sizes, data)])
    if is_dtensor(value):
        shape, offsets, local = dtensor_chunk(value, key)
        dtype, _, data = _arrays.read_view(local, key, device_ok=True)
        views.append(data)
        return ("tensor", key, dtype, shape, _dtensor_chunks(shape, offsets, local, data))
    if _arrays.is_array(value):
        dtype, shape, data = _arrays.read_view(value, key, device_ok=True)
        views.append(data)
        return ("tensor", key, dtype, shape, [([0] * len(shape), shape, data)])
    dtype = scalar_dtype(value)
    if dtype is not None:
        return ("scalar", key, dtype, scalar_value(value, dtype))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", key, bytes(value))
    return ("json", key, json_text(key, value.value if isinstance(value, Json) else value))


def json_text(key, value):
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Error("invalid argument", f"key '{key}': a {type(value).__name__} is not a tensor, scalar, bytes "
                    f"or JSON value ({e})", key=key) from None


def load_entries(state_dict):
    """(entries, places, targets): places[key] = (container, name, original value) of every
    non-tensor entry, whose loaded value replaces it; targets finish the tensor copies."""
    entries, places, targets = [], {}, []
    for key, container, name, value in flatten(state_dict):
        if isinstance(value, Shard):
            target = _arrays.WriteTarget(value.array, key, device_ok=True)
            targets.append(target)
            entries.append(("tensor", key, target.dtype, value.shape, [(value.offsets, target.shape, target.bytes)]))
            continue
        if is_dtensor(value):
            shape, offsets, local = dtensor_chunk(value, key)
            target = _arrays.WriteTarget(local, key, device_ok=True)
            targets.append(target)
            entries.append(("tensor", key, target.dtype, shape, _dtensor_chunks(shape, offsets, local, target.bytes)))
            continue
        if _arrays.is_array(value):
            target = _arrays.WriteTarget(value, key, device_ok=True)
            targets.append(target)
            entries.append(("tensor", key, target.dtype, target.shape,
                            [([0] * len(target.shape), target.shape, target.bytes)]))
            continue
        places[key] = (container, name, value)
        dtype = scalar_dtype(value)
        if dtype is not None:
            entries.append(("scalar", key, dtype, scalar_value(value, dtype)))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            entries.append(("bytes", key, None))
        else:
            entries.append(("json", key, None))
    return entries, places, targets


def loaded_value(old, raw):
    """The Python value for a loaded scalar, bytes or JSON entry, in the kind `old` had."""
    if isinstance(old, (bool, np.bool_)):
        return bool(raw)
    if isinstance(old, np.generic):
        return old.dtype.type(raw)
    if isinstance(old, bytearray):
        return bytearray(raw)
    if isinstance(old, (bytes, memoryview)):
        return bytes(raw)
    if isinstance(old, numbers.Real) and not isinstance(old, numbers.Integral) and isinstance(raw, numbers.Real):
        return float(raw)
    if isinstance(raw, str):
        value = json.loads(raw)
        return Json(value) if isinstance(old, Json) else value
    return raw
