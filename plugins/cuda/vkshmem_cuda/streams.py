"""Stream-ordered operations of the cuda domain: :class:`CudaStreamOps` (the core's
:class:`~vkshmem.plugin.StreamOps`) on a user's CUDA stream, and :class:`CudaStreams`, the
domain's table of them.

A stream is accepted as an int handle (0: the legacy default stream), a ``torch.cuda.Stream``
(``.cuda_stream``), a CuPy ``Stream`` (``.ptr``), a ``cuda.bindings`` ``CUstream``, or anything
with the ``__cuda_stream__`` protocol (``(version, handle)``); it must belong to this PE's GPU
(the primary context, which torch and CuPy use). Everything is issued on that stream, nothing
waited for: copies by ``cuMemcpyAsync`` (host memory only where pinned: the symmetric host
heap), AMOs by a one-thread kernel with system-scope atomics, waits and barriers by
one-block kernels that spin on the word bounded by %globaltimer (``cu/stream.cu``), reductions
by the domain's reduce kernel, ``quiet`` by an event of the domain's own stream. A timed-out
wait records its failure in mapped pinned host memory; :meth:`CudaStreams.check` raises it
(``WaitTimeoutError``).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vkshmem.plugin import AmoOp, InvalidArgumentError, StreamOps, WaitTimeoutError, address_of

from ._ops import lib as _lib
from .driver import CudaError, check
from .kernels import MAX_SOURCES, compile_kernel, reduce_source

if TYPE_CHECKING:
    from .domain import CudaDomain
    from .driver import Mapping

__all__ = ["CudaStreamOps", "CudaStreams", "stream_handle"]

_SOURCE = Path(__file__).resolve().parent / "cu" / "stream.cu"
_WAIT, _AMO, _BARRIER = b"vkshmem_stream_wait", b"vkshmem_stream_amo", b"vkshmem_stream_barrier"
MAX_MEMBERS = 32  #: members one stream barrier takes (VKS_MAX_MEMBERS in cu/stream.cu)
_CU_STREAM_LEGACY = 1  # CUDA's handle of the legacy default stream (what handle 0 means)
_CMP = {1: "==", 2: "!=", 3: ">", 4: "<=", 5: "<", 6: ">="}
_NONFETCH = frozenset({AmoOp.SET, AmoOp.ADD, AmoOp.AND, AmoOp.OR, AmoOp.XOR})
_CACHE_MAX = 64


class _Words(ctypes.Structure):
    _fields_ = [("p", ctypes.c_uint64 * MAX_MEMBERS)]


def stream_handle(stream: Any) -> int | None:
    """The CUDA stream handle of ``stream``, or None where it is not a CUDA stream this plugin
    recognises (the core then falls back on its ``synchronize()``)."""
    if type(stream) is int:
        if stream < 0:
            raise InvalidArgumentError(f"stream={stream}: a CUDA stream handle is >= 0")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1])
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        value = getattr(stream, attr, None)
        if type(value) is int:
            return value
    if type(stream).__name__ in ("CUstream", "cudaStream_t"):  # cuda.bindings
        return int(stream)
    return None


class CudaStreams:
    """The domain's stream operations: kernels (compiled on first use), the failure record
    (pinned, mapped host words) and one :class:`CudaStreamOps` per stream."""

    def __init__(self, domain: CudaDomain, wait_timeout: float, barrier_timeout: float) -> None:
        self.domain = domain
        dev = self.device = domain.device
        cu = dev.cu
        dev.current()
        self.wait_ns = int(wait_timeout * 1e9)
        self.barrier_ns = int(barrier_timeout * 1e9)
        self.wait_timeout, self.barrier_timeout = wait_timeout, barrier_timeout
        self._host = int(check(cu.cuMemHostAlloc(64, 2), "cuMemHostAlloc"))  # DEVICEMAP
        self.fail_dev = int(check(cu.cuMemHostGetDevicePointer(self._host, 0),
                                  "cuMemHostGetDevicePointer"))
        self.fail = (ctypes.c_uint64 * 8).from_address(self._host)
        ctypes.memset(self._host, 0, 64)
        self._fns: dict[bytes, Any] = {}
        #: per stream object, weakly (a user's dropped stream is not kept alive here)
        self._by_object: weakref.WeakKeyDictionary[Any, CudaStreamOps] = \
            weakref.WeakKeyDictionary()
        self._by_handle: dict[int, CudaStreamOps] = {}
        #: per barrier family (0: every PE), the stream barriers issued so far
        self.barrier_seq: dict[int, int] = {}

    def fn(self, name: bytes) -> Any:
        """A kernel of ``cu/stream.cu`` (NVRTC, first use)."""
        f = self._fns.get(name)
        if f is None:
            dev = self.device
            dev.current()
            f = self._fns[name] = compile_kernel(dev.cu, check, dev.dev, _SOURCE.read_text(),
                                                 name, CudaError)
        return f

    def ops(self, stream: Any) -> CudaStreamOps | None:
        """The operations on ``stream`` (cached per stream object where it hashes)."""
        try:
            return self._by_object[stream]
        except (KeyError, TypeError):
            pass
        handle = stream_handle(stream)
        if handle is None:
            return None
        ops = self._by_handle.get(handle)
        if ops is None:
            if len(self._by_handle) >= _CACHE_MAX:
                self._evict()
            ops = self._by_handle[handle] = CudaStreamOps(self, handle)
        try:
            self._by_object[stream] = ops
        except TypeError:  # unhashable, or no weak references: normalised per call
            pass
        return ops

    def _evict(self) -> None:
        """Drop every cached stream's operations, releasing their events (an event a stream
        still waits on is freed by CUDA once that wait is over)."""
        for ops in self._by_handle.values():
            ops.close()
        self._by_handle.clear()
        self._by_object.clear()

    def failure(self) -> WaitTimeoutError | None:
        """The recorded failure as an error, cleared (None: none recorded)."""
        f = self.fail
        kind = f[0]
        if not kind:
            return None
        what, cmp, value, seen = f[1], f[2], f[3], f[4]
        f[0] = 0
        f[5] = 0  # the next failure may be recorded
        dom = self.domain
        if kind == 1:
            off = what - dom.local.va
            where = (f"the signal at offset {off} of PE {dom.my_pe}'s cuda heap"
                     if 0 <= off < dom.size else f"the word at CUDA address 0x{what:x}")
            return WaitTimeoutError(
                f"signal_wait_until(stream=) on PE {dom.my_pe}: {where} did not become "
                f"{_CMP.get(cmp, '?')} {value} within {self.wait_timeout:g} s (it held {seen}; "
                "VKSHMEM_WAIT_TIMEOUT, else VKSHMEM_GPU_TIMEOUT, bounds waits on a stream); "
                "the stream went on past the wait")
        return WaitTimeoutError(
            f"a barrier on a stream (barrier_all/sync_all/collective with stream=) on PE "
            f"{dom.my_pe}: member {what} did not arrive at barrier {value} within "
            f"{self.barrier_timeout:g} s (it had reached {seen}; VKSHMEM_GPU_TIMEOUT); the "
            "stream went on past the barrier")

    def check(self) -> None:
        """Raise the recorded failure, if any (once)."""
        if self.fail[0]:
            err = self.failure()
            if err is not None:
                raise err

    def close(self) -> None:
        if self._host:
            self.device.current()
            self._evict()
            self.device.cu.cuMemFreeHost(self._host)
            self._host = 0


class CudaStreamOps(StreamOps):
    """The cuda domain's operations on one CUDA stream (see the module docstring)."""

    def __init__(self, streams: CudaStreams, handle: int) -> None:
        self.streams = streams
        self.device = dev = streams.device
        self.handle = handle
        self._ptr = handle or _CU_STREAM_LEGACY
        self._stream = dev.cu.CUstream(self._ptr)
        self._event: Any = None

    def _launch(self, name: bytes, threads: int, args: Sequence[Any]) -> None:
        fn = self.streams.fn(name)
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        dev = self.device
        dev.current()
        check(dev.cu.cuLaunchKernel(fn, 1, 1, 1, threads, 1, 1, 0, self._stream,
                                    ctypes.addressof(params), 0), f"cuLaunchKernel ({name!r})")

    def _copy(self, kind: int, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            dev = self.device
            dev._done(_lib.vkc_copy(kind, dev.ctx_ptr, self._ptr, dst, src, nbytes, -1),
                      "cuMemcpyAsync (stream=)")

    def copy(self, dst: Mapping, dst_offset: int, src: Mapping, src_offset: int,
             nbytes: int) -> None:
        self._copy(0, dst.va + dst_offset, src.va + src_offset, nbytes)

    def _pinned(self, view: memoryview) -> int:
        addr = address_of(view)
        return addr if self.device._host_pinned(addr, view.nbytes) else 0

    def write(self, mem: Mapping, offset: int, src: memoryview) -> bool:
        addr = self._pinned(src)
        if not addr:
            return False
        self._copy(1, mem.va + offset, addr, src.nbytes)
        return True

    def read(self, mem: Mapping, offset: int, dst: memoryview) -> bool:
        addr = self._pinned(dst)
        if not addr:
            return False
        self._copy(2, addr, mem.va + offset, dst.nbytes)
        return True

    def amo(self, mem: Mapping, offset: int, op: AmoOp, width: int, operand: int) -> None:
        if op not in _NONFETCH:
            raise InvalidArgumentError(f"AMO {op!r} on a stream: only non-fetching AMOs are "
                                       "enqueued (call fetching AMOs without stream=)")
        self._launch(_AMO, 1, (ctypes.c_uint64(mem.va + offset), ctypes.c_int(int(op)),
                               ctypes.c_int(width), ctypes.c_uint64(operand)))

    def wait(self, offset: int, cmp: int, value: int) -> None:
        s = self.streams
        self._launch(_WAIT, 1, (ctypes.c_uint64(s.domain.local.va + offset), ctypes.c_int(cmp),
                                ctypes.c_uint64(value), ctypes.c_uint64(s.wait_ns),
                                ctypes.c_uint64(s.fail_dev)))

    def barrier(self, members: Sequence[Any], index: int, slot: int) -> bool:
        n = len(members)
        s = self.streams
        words = s.domain.barrier_words(slot, n)
        if n > MAX_MEMBERS or words < 0:
            return False
        seq = s.barrier_seq[slot] = s.barrier_seq.get(slot, 0) + 1
        arrive, mine = _Words(), _Words()
        local = s.domain.local
        for i, mem in enumerate(members):
            arrive.p[i] = mem.va + words + index * 8  # my word in member i's counters
            mine.p[i] = local.va + words + i * 8  # member i's word in mine
        self._launch(_BARRIER, MAX_MEMBERS, (arrive, mine, ctypes.c_int(n), ctypes.c_uint64(seq),
                                             ctypes.c_uint64(s.barrier_ns),
                                             ctypes.c_uint64(s.fail_dev)))
        return True

    def can_reduce(self, op: str, dtype: Any, members: int) -> bool:
        return members <= MAX_SOURCES and reduce_source(op, dtype) is not None

    def reduce(self, dst_offset: int, sources: Sequence[tuple[Any, int]], count: int, op: str,
               dtype: Any) -> None:
        dom = self.streams.domain
        dom.reducer.run([dom.local.va + dst_offset], [m.va + off for m, off in sources], count,
                        op, dtype, stream=self._ptr)

    def after_domain(self) -> None:
        dev = self.device
        cu = dev.cu
        dev.current()
        if self._event is None:
            self._event = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING),
                                "cuEventCreate")
        check(cu.cuEventRecord(self._event, dev.stream), "cuEventRecord")
        check(cu.cuStreamWaitEvent(self._stream, self._event, 0), "cuStreamWaitEvent")

    def check(self) -> None:
        self.streams.check()

    def synchronize(self) -> None:
        dev = self.device
        dev.current()
        check(dev.cu.cuStreamSynchronize(self._stream), "cuStreamSynchronize (stream=)")
        self.streams.check()

    def close(self) -> None:
        if self._event is not None:
            self.device.cu.cuEventDestroy(self._event)
            self._event = None
