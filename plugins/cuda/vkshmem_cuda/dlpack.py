"""DLPack export of CUDA memory (``__dlpack__`` / ``__dlpack_device__``), so that
``torch.from_dlpack``, ``cupy.from_dlpack``, ``jax.dlpack.from_dlpack`` and any other consumer
of the protocol view a :class:`~vkshmem_cuda.array.CudaArray` (or a peer's array from
``shmem.ptr``) without a copy.

The capsule holds a ``DLManagedTensor`` (DLPack 0.8 ABI, capsule name ``"dltensor"``) built with
ctypes; its shape, the struct and the deleter stay referenced here until the consumer calls the
deleter (or the capsule is dropped unused). The tensor borrows the symmetric heap: it must not
outlive ``shmem.free`` of the array or ``finalize``. vkshmem's operations are complete when they
return, so the producer has nothing to wait for on the consumer's ``stream``.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

__all__ = ["KDL_CPU", "KDL_CUDA", "dlpack_capsule", "dtype_code", "live_tensors"]

KDL_CPU = 1  # DLDeviceType kDLCPU
KDL_CUDA = 2  # DLDeviceType kDLCUDA
_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", _DELETER)]

# the capsule's destructor gets the dying capsule: a bare pointer (a py_object would revive it)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NAME = b"dltensor"

_api = ctypes.PyDLL(None)  # the interpreter's C API, with argtypes of our own
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

#: tensors handed out and not yet deleted: address -> what must stay alive
_live: dict[int, Any] = {}
_lock = threading.Lock()


def dtype_code(dtype: np.dtype) -> tuple[int, int]:
    """(DLDataTypeCode, bits) of ``dtype``; ValueError for what DLPack cannot describe."""
    dt = np.dtype(dtype)
    code = _CODES.get(dt.kind)
    if code is None or dt.byteorder == ">":
        raise ValueError(f"DLPack has no type for {dt}")
    return code, dt.itemsize * 8


@_DELETER
def _delete(managed: Any) -> None:
    with _lock:
        _live.pop(ctypes.addressof(managed.contents), None)


@_CAPSULE_DESTRUCTOR
def _drop_unused(capsule: Any) -> None:
    # A consumer renames the capsule ("used_dltensor") and owns the tensor; an unused one is
    # deleted here.
    if _api.PyCapsule_IsValid(capsule, _NAME):
        address = _api.PyCapsule_GetPointer(capsule, _NAME)
        with _lock:
            _live.pop(address, None)


def live_tensors() -> int:
    """Tensors handed out whose consumer has not deleted them yet."""
    with _lock:
        return len(_live)


def dlpack_capsule(pointer: int, shape: tuple[int, ...], dtype: np.dtype, device_id: int,
                   owner: Any, dl_device: Any = None, copy: Any = None,
                   device_type: int = KDL_CUDA) -> Any:
    """A ``"dltensor"`` capsule of C-contiguous memory at ``pointer`` on device
    (``device_type``, ``device_id``); ``owner`` is kept alive as long as the consumer holds the
    tensor. ``dl_device``/``copy`` are ``__dlpack__``'s: another device or a copy is refused."""
    if copy:
        raise BufferError("a symmetric array is exported without a copy only (copy=True "
                          "asked for one)")
    if dl_device is not None and tuple(dl_device) != (device_type, device_id):
        raise BufferError(f"this array lives on CUDA device {device_id}, not {dl_device}")
    code, bits = dtype_code(dtype)
    ndim = len(shape)
    dims = (ctypes.c_int64 * max(ndim, 1))(*shape)
    managed = _Managed()
    t = managed.dl_tensor
    t.data = pointer
    t.device = _Device(device_type, device_id)
    t.ndim = ndim
    t.dtype = _DataType(code, bits, 1)
    t.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    t.strides = None  # C-contiguous (DLPack allows NULL)
    t.byte_offset = 0
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    with _lock:
        _live[address] = (managed, dims, owner)
    return _api.PyCapsule_New(address, _NAME, _drop_unused)
