"""GPU-initiated communication from the API: user kernels, and symmetric offsets for them.

A kernel written against ``shaders/vkshmem.glsl`` addresses symmetric memory by (segment,
offset): :func:`offset_of` gives both for any symmetric array, a DeviceArray's ``offset`` is
the GPU one. :func:`gpu_kernel` loads the kernel on this PE's launch device with its GPU heap,
request ring and PE numbers in the push header; its requests are served by this PE's ring
service (see :mod:`vkshmem.gpu.initiated`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..core.errors import InvalidTypeError
from ..gpu.launch import UserKernel, pack_push
from . import state
from .args import GPU_SEG, DeviceArray, live, locate

__all__ = ["gpu_kernel", "offset_of", "pack_push"]


def gpu_kernel(spirv: str | os.PathLike[str] | bytes, *, name: str | None = None,
               entry: str = "main", scratch_bytes: int = 4096) -> UserKernel:
    """A user compute shader (SPIR-V bytes or a ``.spv`` path) that issues vkshmem operations
    from the GPU: dispatch it with ``kernel.dispatch(groups, push=shmem.pack_push(...))`` and
    wait with ``launch.wait()``. Opens the GPU heap if it is not open yet, which is collective
    (as the first GPU allocation); otherwise local."""
    return state.rt.gpu_domain().get_initiator().kernel(spirv, name=name, entry=entry,
                                                          scratch_bytes=scratch_bytes)


def offset_of(a: Any) -> tuple[int, int]:
    """``(segment, offset)`` of symmetric array ``a`` as kernels address it: segment 0 the
    host heap, 1 the GPU heap; the same numbers on every PE."""
    if type(a) is DeviceArray:
        return GPU_SEG, live(a, "offset_of").offset
    if not isinstance(a, (np.ndarray, memoryview)):
        raise InvalidTypeError(f"offset_of takes a symmetric array, got {type(a).__name__}")
    return locate(a, 0, "offset_of")
