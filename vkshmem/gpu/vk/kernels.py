"""The shipped shaders as Python calls: AMOs (amo.comp), reductions (reduce.comp), shader
copies (copy.comp).

AMO hot path: a single AMO writes its 48-byte descriptor into a small host-visible parameter
buffer and submits a command buffer recorded once at first use (bind, push the descriptor's
device address, dispatch one workgroup): no struct is built and nothing is re-recorded per
call. The shader applies the op with the device's own atomic instruction, so GPU-memory AMOs
are atomic with any other shader atomic on the same word.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError
from vkshmem.core.transports.contract import AmoOp

from .submit import Slot

if TYPE_CHECKING:
    from .logical import LogicalDevice
    from .memory import GpuMemory
    from .physical import DeviceInfo
    from .pipeline import ComputePipeline

__all__ = ["REDUCE_DTYPES", "REDUCE_FEATURES", "REDUCE_OPS", "Kernels", "reduce_unsupported"]

#: Reduction op codes of reduce.comp (the names the core's collectives use).
REDUCE_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "and": 4, "or": 5, "xor": 6}
#: numpy dtype -> shipped reduce variant. complex64/complex128 sums run on reduce_f32/f64
#: over twice as many scalars; their products on reduce_c64/c128. longdouble stays on the
#: host: GPUs have no 80-bit (x87 extended) or 128-bit float type, and no SPIR-V type for it.
REDUCE_DTYPES = {np.dtype(np.int8): "reduce_i8", np.dtype(np.uint8): "reduce_u8",
                 np.dtype(np.int16): "reduce_i16", np.dtype(np.uint16): "reduce_u16",
                 np.dtype(np.int32): "reduce_i32", np.dtype(np.int64): "reduce_i64",
                 np.dtype(np.uint32): "reduce_u32", np.dtype(np.uint64): "reduce_u64",
                 np.dtype(np.float16): "reduce_f16",
                 np.dtype(np.float32): "reduce_f32", np.dtype(np.float64): "reduce_f64",
                 np.dtype(np.complex64): "reduce_c64", np.dtype(np.complex128): "reduce_c128"}
#: numpy dtype -> the device features (:data:`vkshmem.gpu.vk.physical.SHADER_FEATURES` names) its
#: variants need; a dtype not listed needs nothing optional.
REDUCE_FEATURES: dict[np.dtype, tuple[str, ...]] = {
    np.dtype(np.int8): ("shaderInt8", "storageBuffer8BitAccess"),
    np.dtype(np.uint8): ("shaderInt8", "storageBuffer8BitAccess"),
    np.dtype(np.int16): ("shaderInt16", "storageBuffer16BitAccess"),
    np.dtype(np.uint16): ("shaderInt16", "storageBuffer16BitAccess"),
    np.dtype(np.float16): ("shaderFloat16", "storageBuffer16BitAccess"),
    np.dtype(np.float64): ("shaderFloat64",),
    np.dtype(np.complex128): ("shaderFloat64",),
}
#: complex dtype -> the float variant its sums use
_COMPLEX_SUM = {np.dtype(np.complex64): "reduce_f32", np.dtype(np.complex128): "reduce_f64"}
_FLOAT_OPS = ("sum", "prod", "min", "max")
_COMPLEX_OPS = ("sum", "prod")


def _reduce_plan(dtype: Any, op: str) -> tuple[str, int, int, int]:
    """(variant, op code, scalar size in bytes, scalars per element) of a GPU reduction, or
    InvalidArgumentError when the dtype or op is not one reduce.comp has."""
    dt = np.dtype(dtype)
    key = dt.newbyteorder("=") if dt.isnative else None
    name = REDUCE_DTYPES.get(key) if key is not None else None
    if name is None:
        raise InvalidArgumentError(
            "GPU reductions take " + ", ".join(str(d) for d in REDUCE_DTYPES)
            + f" (native byte order); got {dt}")
    opname = str(op).lower()
    code = REDUCE_OPS.get(opname)
    if code is None:
        raise InvalidArgumentError(f"unknown reduction {op!r} (one of {sorted(REDUCE_OPS)})")
    if dt.kind == "f" and opname not in _FLOAT_OPS:
        raise InvalidArgumentError(f"reduction {op!r} takes integers, not {dt}")
    if dt.kind == "c":
        if opname not in _COMPLEX_OPS:
            raise InvalidArgumentError(f"reduction {op!r} is not defined for {dt}")
        half = dt.itemsize // 2
        if opname == "sum":  # elementwise on the (re, im) scalars
            return _COMPLEX_SUM[key], code, half, 2
        return name, code, half, 1
    return name, code, dt.itemsize, 1


def reduce_unsupported(info: DeviceInfo, dtype: Any, op: str) -> str | None:
    """None when :meth:`Kernels.reduce` can do ``op`` on ``dtype`` on the device described by
    ``info``; else why not (the dtype or op has no variant, or the device lacks a feature)."""
    try:
        _reduce_plan(dtype, op)
    except InvalidArgumentError as exc:
        return str(exc)
    missing = info.missing_features(*REDUCE_FEATURES.get(np.dtype(dtype).newbyteorder("="), ()))
    if missing:
        return f"{info.name} lacks {', '.join(missing)} for {np.dtype(dtype)} reductions"
    return None


_GROUP = 256  # local_size_x of reduce.comp and copy.comp
#: workgroups of one copy.comp dispatch at most (its invocations stride over the rest)
_COPY_GROUPS = 16384
_AMO_OPS = frozenset(int(op) for op in AmoOp)
_COPY_SHADER = {16: "copy_u128", 4: "copy_u32", 1: "copy_u8"}  # by element size
_AMO_GROUP = 64  # local_size_x of amo.comp
_DESC = struct.Struct("<QQQQII8x")  # AmoDesc of amo.comp (48 bytes)
_DESC_DTYPE = np.dtype({"names": ["addr", "operand", "compare", "old", "op", "width"],
                        "formats": ["<u8", "<u8", "<u8", "<u8", "<u4", "<u4"],
                        "offsets": [0, 8, 16, 24, 32, 36], "itemsize": 48})
_OLD = struct.Struct("<Q")
_PUSH_DESCS = struct.Struct("<QI4x")
_PUSH_2ADDR = struct.Struct("<QQII")

_SINGLE_OFF = {4: 0, 8: 64}  # where the single-AMO descriptors live in the params buffer
_BATCH_OFF = 4096
_BATCH_MAX = 4096
_PARAMS_SIZE = _BATCH_OFF + _BATCH_MAX * _DESC.size


def _copy_groups(count: int) -> int:
    """Workgroups of a copy.comp dispatch over ``count`` elements: about four elements per
    invocation (what keeps four loads in flight), at least 528 workgroups (4 per SM of an
    H100) when there is that much work, at most ``_COPY_GROUPS``. On an H100, 16 MiB: 9.9 us
    of GPU time with 1024 groups, 10.7 with 4096."""
    return min(-(-count // _GROUP), max(count // (4 * _GROUP), 528), _COPY_GROUPS)


class Kernels:
    """Per-device state of the shipped kernels (see module doc). ``pipeline`` gives the
    device's cached pipeline of a shipped shader by name (:meth:`VulkanDevice.pipeline
    <vkshmem.gpu.vk.device.VulkanDevice.pipeline>`)."""

    def __init__(self, device: LogicalDevice,
                 pipeline: Callable[[str], ComputePipeline]) -> None:
        self.device = device
        self._pipeline = pipeline
        self._lock = threading.Lock()
        self._single: dict[tuple[int, bool], Slot] = {}
        self._last: Slot | None = None  # the single-AMO slot submitted last
        self._copy_pipes: dict[int, ComputePipeline] = {}
        self.params: GpuMemory | None = device.alloc(_PARAMS_SIZE, exportable=False,
                                                     host_visible=True)
        view = self.params.map()
        if view is None:  # pragma: no cover - host-visible memory always maps
            raise FeatureNotAvailableError(f"parameter buffer: {self.params.map_reason}")
        self._pv = view

    # -- AMOs -------------------------------------------------------------------------------

    @staticmethod
    def _check_amo(mem: GpuMemory, offset: int, op: int, width: int) -> None:
        if width not in (4, 8):
            raise InvalidArgumentError(f"AMO width must be 4 or 8 bytes, got {width}")
        if op not in _AMO_OPS:
            raise InvalidArgumentError(f"unknown AMO op {op!r}")
        if offset % width:
            raise InvalidArgumentError(f"a {width}-byte AMO needs an offset aligned to {width}, "
                                       f"got {offset}")
        mem.check_range(offset, width, "AMO")

    def _pipeline_for(self, width: int) -> ComputePipeline:
        dev = self.device
        if width == 8 and not dev.info.int64_atomics:
            raise FeatureNotAvailableError(
                f"{dev.info.name} has no 64-bit shader atomics (shaderBufferInt64Atomics)")
        return self._pipeline("amo_u64" if width == 8 else "amo_u32")

    def _single_slot(self, width: int, lead: bool) -> Slot:
        """The prerecorded command buffer of a single ``width``-byte AMO, with or without the
        leading barrier (the caller holds ``device.lock``)."""
        slot = self._single.get((width, lead))
        if slot is None:
            dev = self.device
            pipe = self._pipeline_for(width)
            assert self.params is not None
            slot = Slot(dev, f"{width * 8}-bit AMO")
            push = _PUSH_DESCS.pack(self.params.device_address + _SINGLE_OFF[width], 1)
            slot.begin(reusable=True, lead=lead)
            pipe.record(slot, 1, push)
            slot.end()
            self._single[(width, lead)] = slot
        return slot

    def amo(self, mem: GpuMemory, offset: int, op: int, width: int, operand: int = 0,
            compare: int = 0, *, timeout: float | None = None) -> int:
        """One AMO; returns the word's previous value (unsigned, ``width`` bytes)."""
        self._check_amo(mem, offset, op, width)
        mask = (1 << (width * 8)) - 1
        dev = self.device
        with self._lock:
            dev.check_open()
            if self._last is not None:  # a previous call timed out: never rewrite its params
                self._last.wait(timeout)
            off = _SINGLE_OFF[width]
            _DESC.pack_into(self._pv, off, mem.device_address + offset, operand & mask,
                            compare & mask, 0, int(op), width)
            with dev.lock:
                slot = self._single_slot(width, dev.in_flight[0] > 0)
                slot.submit()
            self._last = slot
            slot.wait(timeout)
            return _OLD.unpack_from(self._pv, off + 24)[0] & mask

    def amo_batch(self, mem: GpuMemory, offsets: Any, op: int | Sequence[int], width: int,
                  operands: Any = 0, compares: Any = 0, *, timeout: float | None = None
                  ) -> np.ndarray:
        """Many AMOs in one dispatch, one invocation each (concurrently: several may hit the
        same word). Arguments broadcast like numpy's; returns the old values (uint32/uint64)."""
        offs = np.atleast_1d(np.asarray(offsets, dtype=np.int64))
        ops = np.broadcast_to(np.asarray(op, dtype=np.uint32), offs.shape)
        if width not in (4, 8):
            raise InvalidArgumentError(f"AMO width must be 4 or 8 bytes, got {width}")
        for o in np.unique(ops):
            self._check_amo(mem, 0, int(o), width)
        if offs.size and (offs.min() < 0 or offs.max() + width > mem.size or (offs % width).any()):
            raise InvalidArgumentError(f"AMO offsets must be {width}-aligned and inside the "
                                       f"{mem.size}-byte allocation")
        mask = np.uint64((1 << (width * 8)) - 1)
        descs = np.zeros(offs.shape, _DESC_DTYPE)
        descs["addr"] = np.uint64(mem.device_address) + offs.astype(np.uint64)
        for name, vals in (("operand", operands), ("compare", compares)):
            descs[name] = np.broadcast_to(np.asarray(vals).astype(np.uint64), offs.shape) & mask
        descs["op"] = ops
        descs["width"] = width
        pipe = self._pipeline_for(width)
        assert self.params is not None
        old = np.empty(offs.shape, np.uint64)
        base = self.params.device_address + _BATCH_OFF
        with self._lock:
            self.device.check_open()
            for s in range(0, offs.size, _BATCH_MAX):
                chunk = descs[s:s + _BATCH_MAX]
                k = chunk.size
                raw = memoryview(chunk.view(np.uint8).reshape(-1))
                self._pv[_BATCH_OFF:_BATCH_OFF + raw.nbytes] = raw
                groups = -(-k // _AMO_GROUP)
                pipe.dispatch(groups, _PUSH_DESCS.pack(base, k), timeout=timeout)
                got = np.frombuffer(self._pv, _DESC_DTYPE, k, _BATCH_OFF)
                old[s:s + k] = got["old"]
        return old.astype(np.uint32 if width == 4 else np.uint64)

    # -- reductions and shader copies -------------------------------------------------------

    def _chunks(self, count: int) -> list[tuple[int, int]]:
        per = self.device.info.max_workgroup_count[0] * _GROUP
        return [(s, min(per, count - s)) for s in range(0, count, per)]

    def reduce(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
               count: int, op: str, dtype: Any, *, timeout: float | None = None) -> None:
        """``dst[i] = op(dst[i], src[i])`` for ``count`` elements (see reduce.comp)."""
        dt = np.dtype(dtype)
        name, code, scalar, per = _reduce_plan(dt, op)
        missing = self.device.info.missing_features(*REDUCE_FEATURES.get(dt.newbyteorder("="),
                                                                           ()))
        if missing:
            raise FeatureNotAvailableError(
                f"{self.device.info.name} lacks {', '.join(missing)} for {dt} reductions")
        size = dt.itemsize
        if dst_offset % scalar or src_offset % scalar:
            raise InvalidArgumentError(f"{dt} reductions need offsets aligned to {scalar} bytes")
        dst.check_range(dst_offset, count * size, "reduction destination")
        src.check_range(src_offset, count * size, "reduction source")
        if count == 0:
            return
        if (dst.memory == src.memory and dst_offset != src_offset
                and abs(dst_offset - src_offset) < count * size):
            raise InvalidArgumentError("reduction source partially overlaps its destination")
        pipe = self._pipeline(name)
        da = dst.device_address + dst_offset
        sa = src.device_address + src_offset
        step = size // per  # bytes per invocation
        items = [(-(-k // _GROUP), _PUSH_2ADDR.pack(da + s * step, sa + s * step, k, code))
                 for s, k in self._chunks(count * per)]
        pipe.dispatch_many(items, timeout=timeout)

    def copy_plan(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
                  nbytes: int) -> tuple[ComputePipeline, list[tuple[int, bytes]]]:
        """The copy.comp dispatches (workgroups, push constants) that copy ``nbytes`` between
        disjoint ranges: 16-byte vectors when both addresses and the size are 16-aligned
        (what reaches HBM rate), else 4-byte words, else bytes. Disjoint dispatches: they
        need no barrier between them. :meth:`shader_copy` runs them, a stream records them."""
        dst.check_range(dst_offset, nbytes, "copy destination")
        src.check_range(src_offset, nbytes, "copy source")
        if dst.memory == src.memory and dst_offset < src_offset + nbytes \
                and src_offset < dst_offset + nbytes:
            raise InvalidArgumentError("shader copies need disjoint ranges (use copy())")
        da = dst.device_address + dst_offset
        sa = src.device_address + src_offset
        size = 16 if not (da | sa | nbytes) & 15 else 4 if not (da | sa | nbytes) & 3 else 1
        if size == 1 and not self.device.info.int8_storage:
            raise FeatureNotAvailableError("byte-granular shader copies need 8-bit storage")
        pipe = self._copy_pipes.get(size)
        if pipe is None:
            pipe = self._copy_pipes[size] = self._pipeline(_COPY_SHADER[size])
        limit = self.device.info.max_workgroup_count[0]
        # each invocation strides over its elements: a bounded grid, a short loop
        return pipe, [(min(_copy_groups(k), limit),
                       _PUSH_2ADDR.pack(da + s * size, sa + s * size, k, 0))
                      for s, k in self._chunks(nbytes // size)]

    def shader_copy(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
                    nbytes: int, *, timeout: float | None = None) -> None:
        """Copy with copy.comp (see :meth:`copy_plan`) and wait for it."""
        if nbytes == 0:
            return
        pipe, items = self.copy_plan(dst, dst_offset, src, src_offset, nbytes)
        if len(items) == 1:  # the common case: one dispatch, one C call
            pipe.run1(items[0][0], items[0][1], timeout)
            return
        pipe.dispatch_many(items, timeout=timeout)

    def close(self) -> None:
        with self._lock:
            for slot in self._single.values():
                slot.close()
            self._single.clear()
            if self.params is not None:
                self._pv = memoryview(b"")
                self.params.free()
                self.params = None
