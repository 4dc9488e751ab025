"""Collectives whose target or source is a domain's array (e.g. a DeviceArray in GPU memory).

Called by :mod:`.host` when such an array is involved. With a host target the device
source is read once and the host algorithm runs. With a device target the data moves by
domain puts (each member pushes its blocks straight into the members' targets: imported
memory on the same device, a transport or the domain proxy elsewhere) between team barriers;
reductions and scans gather every member's contribution into the team's scratch slot of the
domain's heap (``SCRATCH_BYTES`` per team, in chunks) and reduce on the device with the
domain's ``reduce`` (the Vulkan domain: ``reduce.comp`` for every integer dtype of 8 to 64 bits,
float16/32/64, complex64/128 sums and products, where the device has the shader features the
dtype needs). Anything else (a device lacking a feature, bool, longdouble) is reduced by numpy
on the host after the gather. The fold order is member 0, 1, ... on every PE, so
floating-point results agree everywhere. An all-reduce whose members' sources are all mapped on
every member's device reduces straight from them (``_in_place_call``); a large one between
members that are not (from a source of the target's domain, not in place) runs as a ring
reduce-scatter + all-gather into the targets instead of the gather (:mod:`.device_ring`).
An all-reduce that took one domain call between two barriers (the in-place reduce, or two
members' pair round) is kept under its arrays: a repeat with the same arrays, op, size and
team goes from one lookup to that call (``reduce_again``), skipping the checks and decisions
(11-19 us of Python per call on the two-H200 hosts).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..domains.contract import DomainArray
from ..domains.heap import DomainHeap
from ..elements import count_of, host_copy
from ..errors import InvalidArgumentError
from .device_ring import pair_call, quiet_sync, ring_reduce
from .team import CollTeam

__all__ = ["alltoall", "broadcast", "collect", "fcollect", "reduce", "reduce_again", "scan"]

#: the host collective to run instead, given (target, host copy of the source)
_Host = Callable[[Any, Any], None]


def _check(ct: CollTeam, target: Any, source: Any, what: str) -> np.dtype:
    ct.rt.domains.heap_of_array(target, f"{what} target")
    dt = np.dtype(target.dtype)
    if np.dtype(source.dtype) != dt:
        raise InvalidArgumentError(f"{what}: dtype mismatch: target is {dt}, source is "
                                   f"{source.dtype}")
    if dt.hasobject:
        raise InvalidArgumentError("arrays of Python objects cannot be moved between PEs")
    return dt


class _Source:
    """Byte ranges of a local source (device or host) pushed into peers' device memory."""

    def __init__(self, heap: DomainHeap, source: Any) -> None:
        self.gpu = heap
        self.device = isinstance(source, DomainArray) and source.domain is heap.domain
        if self.device:  # of the target's heap, which is open
            self.offset = source.offset
        else:
            source = host_copy(source)
            flat = np.ascontiguousarray(source).reshape(-1)
            self.bytes = memoryview(flat).cast("B")

    def push(self, pe: int, dst_off: int, lo: int, nbytes: int) -> None:
        if nbytes == 0:
            return
        if self.device:
            self.gpu.transfers.put_device(pe, dst_off, self.offset + lo, nbytes)
        else:
            self.gpu.put(pe, self.gpu.seg_id, dst_off, self.bytes[lo:lo + nbytes])


def broadcast(ct: CollTeam, target: DomainArray, source: Any, root: int, size: Any,
              host: _Host) -> None:
    """See :func:`vkshmem.shmem.broadcast`."""
    if not isinstance(target, DomainArray):
        host(target, host_copy(source))
        return
    dt = _check(ct, target, source, "broadcast")
    cnt = count_of(target, source, size)
    if not 0 <= root < ct.n:
        raise InvalidArgumentError(f"root {root} is not a PE of this team of {ct.n} PEs")
    ct.ts.sync()  # every member's target is free to be written
    if ct.me == root:
        src = _Source(ct.rt.domains.heap_of_array(target, "collective target"), source)
        for pe in ct.pes:
            src.push(pe, target.offset, 0, cnt * dt.itemsize)
    quiet_sync(ct)


def fcollect(ct: CollTeam, target: DomainArray, source: Any, size: Any,
             host: _Host) -> None:
    """See :func:`vkshmem.shmem.fcollect`."""
    if not isinstance(target, DomainArray):
        host(target, host_copy(source))
        return
    dt = _check(ct, target, source, "fcollect")
    cnt = source.size if size is None else count_of(source, source, size)
    if cnt * ct.n > target.size:
        raise InvalidArgumentError(f"fcollect: {ct.n} PEs x {cnt} elements do not fit in a "
                                   f"target of {target.size}")
    isz = dt.itemsize
    ct.ts.sync()
    src = _Source(ct.rt.domains.heap_of_array(target, "collective target"), source)
    for pe in ct.pes:
        src.push(pe, target.offset + ct.me * cnt * isz, 0, cnt * isz)
    quiet_sync(ct)


def collect(ct: CollTeam, target: DomainArray, source: Any, size: Any,
            host: _Host) -> None:
    """See :func:`vkshmem.shmem.collect`: the counts travel through the GPU scratch first."""
    if not isinstance(target, DomainArray):
        host(target, host_copy(source))
        return
    dt = _check(ct, target, source, "collect")
    cnt = source.size if size is None else count_of(source, source, size)
    gpu = ct.rt.domains.heap_of_array(target, "collect target")
    scratch = gpu.scratch_off + ct.ts.slot * gpu.scratch_bytes
    ct.ts.sync()
    mine = np.array([cnt], np.uint64)
    for pe in ct.pes:
        gpu.put(pe, gpu.seg_id, scratch + 8 * ct.me, memoryview(mine).cast("B"))
    quiet_sync(ct)
    counts = np.empty(ct.n, np.uint64)
    gpu.read_local(scratch, memoryview(counts).cast("B"))
    total = int(counts.sum())
    if total > target.size:
        raise InvalidArgumentError(f"collect: {total} elements from {ct.n} PEs do not fit in "
                                   f"a target of {target.size}")
    isz = dt.itemsize
    start = int(counts[:ct.me].sum())
    src = _Source(ct.rt.domains.heap_of_array(target, "collective target"), source)
    for pe in ct.pes:
        src.push(pe, target.offset + start * isz, 0, cnt * isz)
    quiet_sync(ct)


def alltoall(ct: CollTeam, target: DomainArray, source: Any, cnt: int, tst: int, sst: int,
             host: _Host) -> None:
    """See :func:`vkshmem.shmem.alltoalls` (``alltoall`` is ``tst = sst = 1``); ``cnt`` is
    the checked element count per member."""
    if not isinstance(target, DomainArray):
        host(target, host_copy(source))
        return
    dt = _check(ct, target, source, "alltoall")
    isz = dt.itemsize
    me = ct.me
    ct.ts.sync()
    if tst == 1 and sst == 1:
        src = _Source(ct.rt.domains.heap_of_array(target, "collective target"), source)
        for j, pe in enumerate(ct.pes):
            src.push(pe, target.offset + me * cnt * isz, j * cnt * isz, cnt * isz)
    else:
        flat = np.ascontiguousarray(host_copy(source)).reshape(-1)
        gpu = ct.rt.domains.heap_of_array(target, "alltoall target")
        for j, pe in enumerate(ct.pes):
            block = np.ascontiguousarray(flat[j * cnt * sst:(j * cnt + cnt - 1) * sst + 1:sst])
            for i in range(cnt):
                at = target.offset + (me * cnt + i) * tst * isz
                gpu.put(pe, gpu.seg_id, at, memoryview(block[i:i + 1]).cast("B"))
    quiet_sync(ct)


def _gather_reduce(ct: CollTeam, target: DomainArray, source: Any, cnt: int, op: str,
                   ufunc: np.ufunc, members: Callable[[int], range]) -> None:
    """target[i] = op over members(me) of their source[i], gathered through the domain's
    scratch and reduced on the device where the domain can (else by numpy)."""
    heap = ct.rt.domains.heap_of_array(target, "collective target")
    dt = np.dtype(target.dtype)
    isz = dt.itemsize
    n = ct.n
    per = heap.scratch_bytes // (n * isz)
    if per == 0:
        raise InvalidArgumentError(f"a team of {n} PEs is too large for {heap.name} reductions "
                                   f"of {dt}")
    scratch = heap.scratch_off + ct.ts.slot * heap.scratch_bytes
    src = _Source(heap, source)
    on_device = True  # until the domain says it cannot (the device's features decide)
    for lo in range(0, cnt, per):
        m = min(per, cnt - lo)
        ct.ts.sync()  # the scratch is free (everyone finished the previous chunk)
        for pe in ct.pes:
            src.push(pe, scratch + ct.me * m * isz, lo * isz, m * isz)
        quiet_sync(ct)
        want = members(ct.me)
        dst = target.offset + lo * isz
        if not want:
            heap.zero(dst, m * isz)
            continue
        if on_device:
            heap.copy_local(dst, scratch + want[0] * m * isz, m * isz)
            on_device = all(heap.reduce(dst, scratch + j * m * isz, m, op, dt)
                            for j in want[1:])
        if not on_device:
            parts = np.empty((n, m), dt)
            heap.read_local(scratch, memoryview(parts.reshape(-1)).cast("B"))
            out = ufunc.reduce(parts[want.start:want.stop], axis=0)
            heap.write_local(dst, memoryview(np.ascontiguousarray(out, dt)).cast("B"))
    ct.ts.sync()  # nobody reuses the scratch while a member still reads it


class _Kept:
    """A device all-reduce's arguments and the call it took (:func:`reduce_again`)."""

    __slots__ = ("call", "op", "rt", "size", "source", "sync", "target", "team", "ts")

    def __init__(self, target: DomainArray, source: DomainArray, key: tuple[Any, Any, Any],
                 ct: CollTeam, call: Callable[[], None]) -> None:
        self.target, self.source = weakref.ref(target), weakref.ref(source)
        self.op, self.size, self.team = key
        self.rt, self.ts, self.sync, self.call = ct.rt, ct.ts, ct.ts.sync, call


# (id(target), id(source)) -> the call a device all-reduce of them took between two
# barriers (the domain's in-place reduce or a pair's round): a repeated call goes from one
# lookup and identity checks to it, skipping the checks and decisions that gave it.
_KEPT: dict[tuple[int, int], _Kept] = {}
_KEPT_MAX = 64


def reduce_again(rt: Any, target: Any, source: Any, op: Any, size: Any, team: Any) -> bool:
    """Collective: an all-reduce whose arguments are those of an earlier one that took a
    single call between two barriers (the same arrays, op, size and team objects, in the
    same runtime, the team not destroyed), run again that way; False where none is kept
    (nothing done). Each member decides alone: a member without the entry takes the full
    path, which runs the same protocol."""
    kept = _KEPT.get((id(target), id(source)))
    if kept is None or kept.target() is not target or kept.source() is not source or \
            kept.op is not op or kept.team is not team or rt is not kept.rt or \
            kept.ts.destroyed or (size is not kept.size and  # None, or an equal int
                                  not (type(size) is int and size == kept.size)):
        return False
    sync = kept.sync
    sync()  # every member's source is ready, every target free to be written
    kept.call()
    sync()  # nobody returns while a member still reads its source or writes its target
    return True


def reduce(ct: CollTeam, target: Any, source: Any, entry: tuple[str, np.ufunc, str],
           size: Any, host: _Host, key: tuple[Any, Any, Any] | None = None) -> None:
    """See :func:`vkshmem.shmem.reduce` (``entry`` is the checked op; ``key``: the caller's
    op, size and team, under which a single-call path is kept for :func:`reduce_again`)."""
    if not isinstance(target, DomainArray):
        host(target, host_copy(source))
        return
    dt = _check(ct, target, source, "reduce")
    cnt = count_of(target, source, size)
    if not cnt:
        return
    heap = ct.rt.domains.heap_of_array(target, "collective target")
    op = entry[0]
    call = _in_place_call(ct, heap, target, source, cnt, op, dt) or \
        pair_call(ct, heap, target, source, cnt, op, dt)
    if call is not None:
        if key is not None:
            if len(_KEPT) >= _KEPT_MAX or any(k.rt is not ct.rt for k in _KEPT.values()):
                _KEPT.clear()  # full, or holding an earlier runtime's (finalized) objects
            _KEPT[id(target), id(source)] = _Kept(target, source, key, ct, call)
        ct.ts.sync()
        call()
        ct.ts.sync()
    elif not ring_reduce(ct, heap, target, source, cnt, op, entry[1]):
        _gather_reduce(ct, target, source, cnt, op, entry[1], lambda me: range(ct.n))


def _in_place_call(ct: CollTeam, heap: DomainHeap, target: DomainArray, source: Any, cnt: int,
                   op: str, dt: np.dtype) -> Callable[[], None] | None:
    """Where every member's source is mapped on every member's device (same domain, routes
    ``direct``) and the domain can, each PE reduces the members' sources straight into its
    target: one kernel between two barriers (the first: every source is ready; the second:
    nobody changes a source another member still reads), no gather. Not for a target
    overlapping the source (a member may still read what another overwrites). The same
    answer on every PE; None when not taken."""
    if not (isinstance(source, DomainArray) and source.domain is heap.domain
            and heap.domain.can_reduce_from(op, dt) and heap.maps_all(ct.pes)):
        return None
    nbytes = cnt * dt.itemsize
    if target.offset < source.offset + nbytes and source.offset < target.offset + nbytes:
        return None
    return functools.partial(heap.reduce_from, target.offset, ct.pes, source.offset, cnt, op,
                             dt)


def scan(ct: CollTeam, target: Any, source: Any, size: Any, inclusive: bool,
         host: _Host) -> None:
    """See :func:`vkshmem.shmem.sum_inscan` / ``sum_exscan``."""
    if not isinstance(target, DomainArray):
        host(target, host_copy(source))
        return
    dt = _check(ct, target, source, "sum_inscan" if inclusive else "sum_exscan")
    if dt.kind not in "iufc":
        raise InvalidArgumentError(f"prefix sums are not defined for dtype {dt}")
    cnt = count_of(target, source, size)
    if cnt:
        _gather_reduce(ct, target, source, cnt, "sum", np.add,
                       lambda me: range(me + 1 if inclusive else me))
