"""``from_dlpack``: a symmetric array back from a tensor (torch, CuPy, JAX, numpy, ...) whose
memory lies in one of this PE's symmetric heaps, e.g. a tensor made from a symmetric array with
DLPack or the CUDA array interface, or a slice of one."""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from ..core.dlpack import KDL_CPU, KDL_CUDA, describe
from ..core.errors import InvalidArgumentError, InvalidTypeError
from . import state

__all__ = ["from_dlpack"]



def _where(x: Any) -> tuple[int, int, int, tuple[int, ...], np.dtype, Any]:
    """(device type, device id, address, shape, dtype, byte strides or None) of ``x``."""
    try:
        d = describe(x)
        return d.device_type, d.device_id, d.address, d.shape, d.dtype, d.strides
    except TypeError:
        pass
    iface = getattr(x, "__cuda_array_interface__", None)
    if iface is not None:  # no device id there: -1 matches any (CUDA addresses are unique)
        strides = iface.get("strides")
        return (KDL_CUDA, -1, int(iface["data"][0]), tuple(iface["shape"]),
                np.dtype(iface["typestr"]), tuple(strides) if strides else None)
    raise InvalidTypeError(f"from_dlpack takes an object with __dlpack__ or "
                           f"__cuda_array_interface__, got {type(x).__name__}")


def from_dlpack(x: Any) -> Any:
    """The symmetric array whose memory ``x`` views: a numpy array for the host heap, the
    domain's array type (e.g. a CudaArray) for a device heap. ``x`` is any DLPack tensor (or
    one with ``__cuda_array_interface__``) that lies, C-contiguous, in one of this PE's
    symmetric heaps: a tensor made from a symmetric array, or a slice of one. The result is a
    symmetric address like any array from ``shmem.zeros``: usable as the target of puts, AMOs
    and collectives, at the same offset on every PE. Not collective. InvalidArgumentError when
    the memory is in no symmetric heap or is not contiguous."""
    rt = state.require()
    dev_type, dev_id, address, shape, dtype, strides = _where(x)
    count = prod(shape)
    nbytes = count * dtype.itemsize
    if strides is not None and count > 1:
        want, step = [], dtype.itemsize
        for n in reversed(shape):
            want.append(step)
            step *= n
        if any(n > 1 and s != w for n, s, w in zip(shape, strides, reversed(want), strict=True)):
            raise InvalidArgumentError(f"from_dlpack: the tensor is not C-contiguous (strides "
                                       f"{strides} for shape {shape})")
    if dev_type == KDL_CPU:
        host = rt.host.segment
        if host.address <= address and address + nbytes <= host.address + host.size:
            off = address - host.address
            return np.frombuffer(host.buffer, dtype, count, off).reshape(shape)
    for heap in state.domain_heaps.values():
        where = heap.domain.dlpack_range()
        if where is None or where[0] != dev_type or dev_id not in (-1, where[1]):
            continue
        base, size = where[2], where[3]
        if base <= address and address + nbytes <= base + size:
            off = address - base
            if off % dtype.itemsize:
                raise InvalidArgumentError(f"from_dlpack: offset {off} in the {heap.name} heap "
                                           f"is not aligned to {dtype}")
            return heap.domain.make_array(off, shape, dtype)
    raise InvalidArgumentError(
        f"from_dlpack: the tensor's memory (device type {dev_type}, device {dev_id}, address "
        f"{address:#x}, {nbytes} bytes) is in no symmetric heap of this PE: make it from a "
        "symmetric array (shmem.zeros(..., domain=...)) first")
