"""Arrays as libckpt sees them: a dtype name and a flat uint8 view of the caller's bytes.

numpy arrays and CPU torch tensors are viewed, never copied, when they are C-contiguous;
a non-contiguous one is copied once (save) or read into a temporary and copied back (load).
Where ckpt was built with its CUDA backend (_ckpt.have_cuda), CUDA torch tensors are taken
the same way for save and load, passed by DLPack: libckpt copies them through pinned staging
buffers on a stream of its own, so the tensor's device is synchronized first (the work
queued on it, which may still be writing or reading the tensor, finishes before ckpt copies).
"""
import sys

import numpy as np

from . import _ckpt
from .errors import Error

DTYPE_SIZES = dict(_ckpt.dtypes)  # ckpt dtype name -> bytes per element

# numpy dtypes ckpt stores under the same name (bf16 and fp8 have no numpy dtype).
_NUMPY = {name: np.dtype(name) for name in ("float64", "float32", "float16", "int8", "int16", "int32",
                                            "int64", "uint8", "bool")}


def _torch():
    """The torch module if the program already imported it (ckpt never imports it for numpy)."""
    return sys.modules.get("torch")


def is_torch_tensor(value):
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def is_array(value):
    return isinstance(value, np.ndarray) or is_torch_tensor(value)


def _numpy_dtype_name(arr, key):
    name = arr.dtype.name
    if name not in _NUMPY or arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder != "little"):
        raise Error("unsupported", f"key '{key}': numpy dtype {arr.dtype.str} is not one ckpt stores "
                    f"(little-endian {', '.join(_NUMPY)}; bfloat16 and float8 as torch tensors)", key=key)
    return name


def torch_dtype_name(dtype, key):
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_SIZES:
        raise Error("unsupported", f"key '{key}': torch dtype {name} is not one ckpt stores "
                    f"({', '.join(DTYPE_SIZES)})", key=key)
    return name


def _torch_tensor(t, key, device_ok=False):
    """t detached, after checking that ckpt can take its memory: CPU, or CUDA where
    `device_ok` (save and load) and ckpt has its CUDA backend."""
    if t.device.type == "cuda" and device_ok and _ckpt.have_cuda:
        _torch().cuda.synchronize(t.device)
    elif t.device.type != "cpu":
        where = ("CPU memory and, in ckpt.save and ckpt.load, CUDA memory" if _ckpt.have_cuda
                 else "CPU memory only (no CUDA backend in this build)")
        raise Error("unsupported", f"key '{key}': a {t.device.type} tensor; ckpt reads and writes {where} "
                    "(move it with .cpu())", key=key)
    if t.layout != _torch().strided or t.is_quantized:
        raise Error("unsupported", f"key '{key}': a {t.layout} tensor; ckpt stores dense tensors", key=key)
    return t.detach()


def dtype_and_shape(value, key):
    """(ckpt dtype name, shape) of a numpy array or torch tensor."""
    if isinstance(value, np.ndarray):
        return _numpy_dtype_name(value, key), list(value.shape)
    return torch_dtype_name(value.dtype, key), list(value.shape)


def _flat_bytes(value):
    """A 1-D uint8 view of the bytes of a C-contiguous array or tensor: numpy for host
    memory, a torch tensor (DLPack) for CUDA memory."""
    if isinstance(value, np.ndarray):
        return value.reshape(-1).view(np.uint8)
    flat = value.reshape(-1).view(_torch().uint8)
    return flat if flat.device.type == "cuda" else flat.numpy()


def read_view(value, key, device_ok=False):
    """(dtype, shape, bytes) for saving: a view when contiguous, else one contiguous copy.
    device_ok: CUDA tensors are taken too (ckpt.save), where ckpt has its CUDA backend."""
    if not isinstance(value, np.ndarray):
        value = _torch_tensor(value, key, device_ok)
    dtype, shape = dtype_and_shape(value, key)
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value)
    else:
        value = value.contiguous()
    return dtype, shape, _flat_bytes(value)


class WriteTarget:
    """Where a load writes an array: straight into it when it is a writable contiguous
    array, else into a temporary (on the same device) that finish() copies back. device_ok:
    CUDA tensors are taken too (ckpt.load), where ckpt has its CUDA backend."""

    def __init__(self, value, key, device_ok=False):
        self.value = value if isinstance(value, np.ndarray) else _torch_tensor(value, key, device_ok)
        self.dtype, self.shape = dtype_and_shape(self.value, key)
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            raise Error("invalid argument", f"key '{key}': the target array is read-only", key=key)
        contiguous = (self.value.flags.c_contiguous if isinstance(self.value, np.ndarray)
                      else self.value.is_contiguous())
        if contiguous:
            self.temp = None
        elif isinstance(self.value, np.ndarray):
            self.temp = np.empty_like(self.value, order="C")
        else:
            self.temp = _torch().empty_like(self.value, memory_format=_torch().contiguous_format)
        self.bytes = _flat_bytes(self.value if self.temp is None else self.temp)

    def finish(self):
        if self.temp is None:
            return
        if isinstance(self.value, np.ndarray):
            self.value[...] = self.temp
        else:
            self.value.copy_(self.temp)


def empty(dtype, shape, like=None):
    """A new array for a read: numpy when numpy has the dtype (unless `like` is "torch"),
    else a torch tensor (bfloat16, float8)."""
    if like != "torch" and dtype in _NUMPY:
        return np.empty(shape, dtype=_NUMPY[dtype])
    torch = _torch()
    if torch is None:
        try:
            import torch
        except ImportError:
            raise Error("unsupported", f"dtype {dtype} has no numpy dtype: reading it needs torch") from None
    return torch.empty(shape, dtype=getattr(torch, dtype))


def raw_view(out, dtype, shape, key):
    """For out= of a read: a writable target of `shape` and of the tensor's own dtype."""
    target = WriteTarget(out, key)
    if list(target.shape) != list(shape):
        raise Error("invalid argument", f"key '{key}': out has shape {target.shape}, the region is {list(shape)}",
                    key=key)
    if target.dtype != dtype:
        raise Error("mismatch", f"key '{key}': out is {target.dtype}, the tensor is {dtype}", key=key)
    return target
