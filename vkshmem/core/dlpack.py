"""DLPack, both ways, for memory domains and the API.

Export (:func:`dlpack_capsule`): a domain's array type implements ``__dlpack__`` /
``__dlpack_device__`` with it (the cuda plugin's ``CudaArray``: ``torch.from_dlpack``,
``cupy.from_dlpack``, JAX and any other consumer view it without a copy). The capsule holds a
``DLManagedTensor`` (DLPack 0.8 ABI, capsule name ``"dltensor"``) built with ctypes; its shape,
the struct and the deleter stay referenced here until the consumer calls the deleter (or the
capsule is dropped unused). The tensor borrows the symmetric heap: it must not outlive
``shmem.free`` of the array or ``finalize``. vkshmem's operations are complete when they return,
so the producer has nothing to wait for on the consumer's ``stream``.

Import (:func:`describe`): where an object's memory is (device type and id, data address,
shape, dtype, strides), read from its ``__dlpack__`` capsule without consuming it, so
``shmem.from_dlpack`` can find the symmetric heap that holds it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, NamedTuple

import numpy as np

__all__ = ["KDL_CPU", "KDL_CUDA", "Described", "cuda_array_interface", "describe",
           "dlpack_capsule", "dtype_code", "live_tensors"]

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


def cuda_array_interface(pointer: int, shape: tuple[int, ...], dtype: np.dtype
                         ) -> dict[str, Any]:
    """``__cuda_array_interface__`` (version 3) of C-contiguous CUDA memory at ``pointer``
    (synchronised: ``stream`` None)."""
    return {"shape": shape, "typestr": dtype.str, "descr": [("", dtype.str)],
            "data": (pointer, False), "strides": None, "version": 3, "stream": None}


_KINDS = {code: kind for kind, code in _CODES.items()}


class Described(NamedTuple):
    """Where a DLPack tensor's elements are (``address`` of the first, byte strides or None
    for C order)."""

    device_type: int
    device_id: int
    address: int
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...] | None


def describe(obj: Any) -> Described:
    """Read ``obj.__dlpack__()``'s tensor (the capsule is not consumed: dropping it returns the
    tensor to its producer). TypeError for an object without DLPack, ValueError for a tensor
    numpy has no dtype for."""
    try:
        capsule = obj.__dlpack__()
    except AttributeError:
        raise TypeError(f"{type(obj).__name__} has no __dlpack__") from None
    try:
        address = _api.PyCapsule_GetPointer(ctypes.c_void_p(id(capsule)), _NAME)
    except ValueError:  # another capsule name (a versioned or a consumed tensor)
        address = None
    if not address:
        raise TypeError(f"{type(obj).__name__}.__dlpack__ did not return a 'dltensor' capsule")
    t = _Managed.from_address(address).dl_tensor
    kind = _KINDS.get(t.dtype.code)
    if kind is None or t.dtype.lanes != 1 or t.dtype.bits % 8:
        raise ValueError(f"DLPack type code {t.dtype.code} ({t.dtype.bits} bits, "
                         f"{t.dtype.lanes} lanes) has no numpy dtype")
    dtype = np.dtype(f"{kind}{t.dtype.bits // 8}") if kind != "b" else np.dtype(bool)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * dtype.itemsize
                                               for i in range(t.ndim))
    result = Described(t.device.device_type, t.device.device_id,
                       (t.data or 0) + t.byte_offset, shape, dtype, strides)
    del t, capsule  # the producer's deleter runs when the capsule goes
    return result
