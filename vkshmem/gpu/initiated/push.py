"""The push header every vkshmem kernel starts with, a kernel's own push constants
(:func:`pack_push`) and the compute entry points of a SPIR-V module (:func:`entry_points`).

The header (``VKS_PUSH_HEADER`` of ``shaders/vkshmem.glsl``, :data:`PUSH_HEADER`)::

    0  u64 device address of this PE's symmetric GPU heap     (vks_heap())
    8  u64 device address of this PE's request ring            (vks_ring())
    16 u64 device address of the kernel's scratch, or 0        (vks_scratch())
    24 u32 my PE                                               (vks_my_pe())
    28 u32 number of PEs                                       (vks_n_pes())
    32 the kernel's own push constants (at most 96 bytes: 128 is every device's minimum)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from vkshmem.core.errors import InvalidArgumentError

from ..vk.pipeline import PUSH_CONSTANT_SIZE, SPIRV_MAGIC

__all__ = ["PUSH_HEADER", "PUSH_HEADER_SIZE", "USER_PUSH_SIZE", "Pushable", "entry_points",
           "pack_push"]

#: heap address, ring address, scratch address, my PE, number of PEs (``VKS_PUSH_HEADER``)
PUSH_HEADER = struct.Struct("<QQQII")
PUSH_HEADER_SIZE = PUSH_HEADER.size
#: Bytes left for a kernel's own push constants after the header.
USER_PUSH_SIZE = PUSH_CONSTANT_SIZE - PUSH_HEADER_SIZE
assert PUSH_HEADER_SIZE == 32

_OP_ENTRY_POINT = 15
_OP_EXECUTION_MODE = 16
_MODEL_GLCOMPUTE = 5
_MODE_LOCAL_SIZE = 17

Pushable = bytes | bytearray | memoryview | Sequence[Any]


def entry_points(spirv: bytes) -> dict[str, tuple[int, int, int] | None]:
    """The compute (GLCompute) entry points of a SPIR-V module and their local sizes (None
    when set by specialisation constants, ``LocalSizeId``)."""
    words = memoryview(spirv).cast("I")
    if len(words) < 5 or words[0] != SPIRV_MAGIC:
        raise InvalidArgumentError("not a SPIR-V module (bad magic number or length)")
    names: dict[int, str] = {}
    sizes: dict[int, tuple[int, int, int]] = {}
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise InvalidArgumentError("malformed SPIR-V module (bad instruction length)")
        if op == _OP_ENTRY_POINT and count >= 4 and words[i + 1] == _MODEL_GLCOMPUTE:
            raw = bytes(words[i + 3:i + count])
            names[words[i + 2]] = raw.split(b"\0", 1)[0].decode(errors="replace")
        elif op == _OP_EXECUTION_MODE and count >= 6 and words[i + 2] == _MODE_LOCAL_SIZE:
            sizes[words[i + 1]] = (words[i + 3], words[i + 4], words[i + 5])
        i += count
    return {name: sizes.get(fid) for fid, name in names.items()}


def pack_push(*values: Any) -> bytes:
    """Pack a kernel's own push constants the way GLSL lays out the members after the header:
    each value a numpy scalar (``np.uint32(5)``, ``np.uint64(off)``, ``np.float32(x)``, ...)
    aligned to its size, or bytes-like (copied as is, aligned to 4 bytes). Python ``int`` and
    ``float`` are refused: their width would be a guess."""
    out = bytearray()
    for k, v in enumerate(values):
        if isinstance(v, bytes | bytearray | memoryview):
            out += bytes(-len(out) % 4)
            out += bytes(v)
        elif isinstance(v, np.generic) and v.dtype.kind in "iuf":
            size = v.dtype.itemsize
            out += bytes(-len(out) % size)
            out += v.astype(v.dtype.newbyteorder("<")).tobytes()
        else:
            raise InvalidArgumentError(
                f"push constant {k} is {type(v).__name__} {v!r}: give a numpy scalar of the "
                "member's type (np.uint32, np.int32, np.uint64, np.float32, ...) or bytes")
    return bytes(out)
