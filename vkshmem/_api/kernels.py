"""GPU-initiated communication in the public API: user kernels, and symmetric offsets for them.

A kernel written against ``shaders/vkshmem.glsl`` addresses symmetric memory by (segment,
offset) in its own numbering — 0 the host heap, 1 the GPU heap —: :func:`offset_of` gives both
for any symmetric array (a DeviceArray's ``offset`` is the GPU one). :func:`gpu_kernel` loads
the kernel on this PE's launch device with its GPU heap, request ring and PE numbers in the
push header; its requests are served by this PE's ring service (see
:mod:`vkshmem.gpu.initiated.initiator`). :mod:`vkshmem.shmem` re-exports these names.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..core.domains.array import DomainArray
from ..core.errors import FeatureNotAvailableError, InvalidArgumentError, InvalidTypeError
from ..gpu.array import DeviceArray
from ..gpu.initiated.launch import UserKernel
from ..gpu.initiated.push import pack_push
from . import state
from .args import heap_of, locate

__all__ = ["device_context", "gpu_kernel", "offset_of", "pack_push"]

#: the kernels' segment numbers (``VKS_SEG_HOST``, ``VKS_SEG_GPU`` in vkshmem.glsl)
_KERNEL_HOST, _KERNEL_GPU = 0, 1


def gpu_kernel(spirv: str | os.PathLike[str] | bytes, *, name: str | None = None,
               entry: str = "main", scratch_bytes: int = 4096) -> UserKernel:
    """A user compute shader (SPIR-V bytes or a ``.spv`` path) that issues vkshmem operations
    from the GPU: dispatch it with ``kernel.dispatch(groups, push=shmem.pack_push(...))`` and
    wait with ``launch.wait()``. Opens the GPU heap if it is not open yet, which is collective
    (as the first GPU allocation); otherwise local."""
    heap = state.rt.domains.domain("gpu")
    get_initiator = getattr(heap.domain, "get_initiator", None)
    if get_initiator is None:
        raise FeatureNotAvailableError(f"gpu_kernel needs a GPU domain that runs Vulkan kernels "
                                       f"(vulkan, cuda); domain='gpu' is {heap.name!r} here")
    return get_initiator().kernel(spirv, name=name, entry=entry, scratch_bytes=scratch_bytes)


def device_context(domain: str = "gpu") -> int:
    """Device address of the context a CUDA kernel passes to the device API of the ``cuda``
    domain (``vkshmem_device.cuh`` in ``vkshmem_cuda.include_dir()``): every PE's heap as
    mapped in this process, this PE's number and the device-sync block. Opens the heap if it
    is not open yet, which is collective (as the first GPU allocation); otherwise local.
    Vulkan shaders use :func:`gpu_kernel` instead."""
    heap = state.rt.domains.domain(domain)
    make = getattr(heap.domain, "device_context", None)
    if make is None:
        raise FeatureNotAvailableError(
            f"device_context needs a domain with a CUDA device API (cuda); domain={domain!r} "
            f"is {heap.name!r} here: Vulkan shaders take the device API through gpu_kernel")
    return int(make())


def offset_of(a: Any) -> tuple[int, int]:
    """``(segment, offset)`` of symmetric array ``a`` as kernels address it: segment 0 the
    host heap, 1 the GPU heap; the same numbers on every PE."""
    if isinstance(a, DomainArray):
        heap = heap_of(a, "offset_of")
        if not isinstance(a, DeviceArray) and heap is not state.rt.domains.heaps.get("gpu"):
            raise InvalidArgumentError(f"offset_of: kernels address the host heap and the GPU "
                                       f"heap (domain='gpu', open once an array of it or "
                                       f"gpu_kernel was made); this array is in the "
                                       f"{heap.name} heap")
        return _KERNEL_GPU, a.offset
    if not isinstance(a, (np.ndarray, memoryview)):
        raise InvalidTypeError(f"offset_of takes a symmetric array, got {type(a).__name__}")
    seg, off = locate(a, 0, "offset_of")
    if seg != _KERNEL_HOST:
        raise InvalidArgumentError(f"offset_of: kernels address the host heap and the GPU heap; "
                                   f"this array is in segment {seg}")
    return seg, off
