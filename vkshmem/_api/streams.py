"""``stream=``: the API's stream-ordered forms (see ``docs/guide/streams.md``).

Every function here either *enqueues* the operation on the user's stream through the memory
domain's :class:`~vkshmem.core.domains.stream.StreamOps` and returns True, or synchronizes the
stream (:func:`sync`) and returns False: the caller then makes the blocking call (the
*fallback*). A call enqueues where the arrays are one domain's, that domain takes the stream
(``MemoryDomain.stream_ops``) and the peers' segments are imported here (route ``direct``);
collectives and barriers where every PE of the job maps every other's segment. A stream wait
that timed out on the device raises ``WaitTimeoutError`` at the next call given a stream of
that domain (or its quiet, barrier_all, or finalize). :func:`gpu_stream` makes a
:class:`vkshmem.gpu.Stream`, the stream type of the Vulkan domain.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.domains.stream import StreamOps
from ..core.elements import count_of
from ..core.errors import FeatureNotAvailableError, InvalidArgumentError
from ..core.transports.contract import AmoOp
from . import state
from .args import DomainArray, check_pe, place, same_dtype

__all__ = ["ACCEPTED", "amo", "gpu_stream", "ops_of", "put_signal", "rma", "sync", "wait"]

#: what stream= takes (the error for anything else says it)
ACCEPTED = ("stream= takes a stream the array's memory domain enqueues on (the vulkan domain: "
            "a vkshmem.gpu.Stream from shmem.gpu_stream(); the cuda domain: a CUDA stream, as "
            "an int handle, a torch.cuda.Stream, a cupy.cuda.Stream, a cuda.bindings CUstream "
            "or an object with __cuda_stream__), or any object with a synchronize() method "
            "(the call then synchronizes it and blocks)")


def gpu_stream(domain: str = "gpu", *, name: str | None = None) -> Any:
    """A :class:`vkshmem.gpu.Stream` of the Vulkan GPU domain: work given ``stream=`` (and
    ``UserKernel.dispatch(..., stream=)``) is enqueued on it in call order and the call
    returns without waiting for the GPU; ``synchronize()`` waits, ``query()`` asks,
    ``close()`` (or ``with``) frees it. Opens the domain's heap if it is not open yet, which
    is collective (as the first GPU allocation); otherwise local. A domain with its own
    stream type (cuda: CUDA streams of torch, CuPy, cuda-bindings) raises
    FeatureNotAvailableError."""
    heap = state.require().domains.domain(domain)
    make = getattr(heap.domain, "gpu_stream", None)
    if make is None:
        raise FeatureNotAvailableError(
            f"gpu_stream makes streams of the vulkan domain; domain={domain!r} is "
            f"{heap.name!r} here" + (": pass a CUDA stream (torch, CuPy, cuda-bindings) as "
                                     "stream=" if heap.name == "cuda" else ""))
    return make(name)


def ops_of(heap: Any, stream: Any) -> StreamOps | None:
    """``heap``'s operations on ``stream`` (its recorded failures raised first), or None."""
    ops = heap.domain.stream_ops(stream)
    if ops is not None:
        ops.check()
    return ops


def sync(stream: Any) -> None:
    """The fallback's first step: wait until ``stream`` ran what was queued on it -- through an
    open domain that takes it, else its own ``synchronize()``; else InvalidArgumentError."""
    rt = state.require()
    for heap in rt.domains.open_heaps():
        ops = ops_of(heap, stream)
        if ops is not None:
            ops.synchronize()
            return
    fn = getattr(stream, "synchronize", None)
    if not callable(fn):
        raise InvalidArgumentError(f"{ACCEPTED}; got {type(stream).__name__} {stream!r}")
    fn()


def _remote(remote: Any, pe: Any, stream: Any) -> tuple[Any, Any, Any, int] | None:
    """``(heap, ops, peer's memory handle, world PE)`` where ``remote``, a domain's array on
    ``pe``, can be reached on ``stream``; None otherwise."""
    if not isinstance(remote, DomainArray):
        return None
    heap = state.domain_heaps.get(remote.domain)
    if heap is None:
        return None
    pe = check_pe(pe)
    mem = heap.direct[pe]
    if mem is None:
        return None
    ops = ops_of(heap, stream)
    if ops is None or not ops.reaches(mem):  # a domain whose stream sees only some peers
        return None
    return heap, ops, mem, pe


def _rma(is_put: bool, target: Any, source: Any, pe: Any, size: Any, ctx: Any,
         stream: Any) -> tuple[Any, Any, int] | None:
    """Issue the copy of a put or get; ``(heap, ops, world PE)`` when issued, else None."""
    remote, local = (target, source) if is_put else (source, target)
    found = _remote(remote, pe, stream) if ctx is None else None
    if found is None:
        return None
    heap, ops, mem, wpe = found
    what = "put" if is_put else "get"
    dt = same_dtype(target, source)
    nbytes = count_of(target, source, size) * dt.itemsize
    roff = place(remote, nbytes, f"{what} {'target' if is_put else 'source'}")[1]
    if isinstance(local, DomainArray):
        if local.domain is not remote.domain:
            return None
        loff = place(local, nbytes, f"{what} {'source' if is_put else 'target'}")[1]
        if not ops.reaches(heap.local):
            return None
        if is_put:
            ops.copy(mem, roff, heap.local, loff, nbytes)
        else:
            ops.copy(heap.local, loff, mem, roff, nbytes)
        return heap, ops, wpe
    if not isinstance(local, np.ndarray) or not local.flags.c_contiguous or \
            not (is_put or local.flags.writeable):
        return None
    mv = memoryview(local).cast("B")
    if mv.nbytes != nbytes:
        mv = mv[:nbytes]
    issued = ops.write(mem, roff, mv) if is_put else ops.read(mem, roff, mv)
    return (heap, ops, wpe) if issued else None


def rma(is_put: bool, target: Any, source: Any, pe: Any, size: Any, ctx: Any,
        stream: Any) -> bool:
    """put/get (and their ``_nbi`` forms) with ``stream=``: True when enqueued."""
    if _rma(is_put, target, source, pe, size, ctx, stream) is not None:
        return True
    sync(stream)
    return False


def _signal_word(signal: Any, heap: Any) -> int | None:
    """The offset of a one-word 64-bit ``signal`` of ``heap``, or None."""
    if not isinstance(signal, DomainArray) or state.domain_heaps.get(signal.domain) is not heap:
        return None
    dt = signal.dtype
    if signal.size != 1 or dt.kind not in "iu" or dt.itemsize != 8 or signal.offset & 7:
        return None
    return signal.offset


def put_signal(target: Any, source: Any, pe: Any, signal: Any, op: AmoOp, value: int,
               size: Any, ctx: Any, stream: Any) -> bool:
    """put_signal(_nbi) with ``stream=``: the copy, then the signal's update, both on the
    stream (the data lands first: stream order); True when enqueued."""
    found = _remote(target, pe, stream) if ctx is None else None
    off = _signal_word(signal, found[0]) if found is not None else None
    if found is not None and off is not None:
        issued = _rma(True, target, source, pe, size, ctx, stream)
        if issued is not None:
            found[1].amo(found[2], off, op, 8, value)
            return True
    sync(stream)
    return False


def amo(target: Any, pe: Any, op: AmoOp, width: int, operand: int, ctx: Any,
        stream: Any) -> bool:
    """A non-fetching AMO (or signal_add/set) with ``stream=``: True when enqueued."""
    found = _remote(target, pe, stream) if ctx is None else None
    if found is not None and target.offset % width == 0:
        place(target, width, "AMO target")
        found[1].amo(found[2], target.offset, op, width, operand)
        return True
    sync(stream)
    return False


def wait(signal: Any, cmp: int, value: int, stream: Any) -> bool:
    """signal_wait_until with ``stream=``: True when the wait is enqueued (bounded on the
    device: VKSHMEM_WAIT_TIMEOUT, else VKSHMEM_GPU_TIMEOUT)."""
    heap = state.domain_heaps.get(signal.domain) if isinstance(signal, DomainArray) else None
    ops = ops_of(heap, stream) if heap is not None else None
    off = _signal_word(signal, heap) if ops is not None else None
    if ops is not None and off is not None and ops.can_wait:
        ops.wait(off, cmp, value)
        return True
    sync(stream)
    return False
