"""``stream=`` on quiet, fence, barriers and collectives (see :mod:`.streams` and
``docs/guide/streams.md``).

Barriers and collectives enqueue where the team is every PE of the job and every PE maps every
other's segment of a domain that takes the stream (route ``direct`` everywhere: the same
answer on every PE); every member must then pass a stream (a CUDA one, on the cuda domain)
alike. A collective on a stream is: a barrier on the stream (every member's target is ready),
copies pulling from the members' sources into this PE's target (a reduction: the domain's
reduce kernel reading every member's source), a barrier (no member changes its source before
every member pulled it). Otherwise the stream is synchronized and the blocking call made.
"""

from __future__ import annotations

from typing import Any

from ..core._native import lib
from ..core.elements import count_of
from ..core.errors import InvalidArgumentError
from . import state
from .args import DomainArray, place, same_dtype
from .streams import ops_of, sync

__all__ = ["alltoall", "barrier_all", "broadcast", "fcollect", "quiet", "reduce", "sync_all",
           "team_sync"]


def quiet(ctx: Any, stream: Any) -> bool:
    """quiet/fence with ``stream=``: the stream waits for this PE's non-blocking operations of
    every domain that takes it (an event; the CPU does not wait for them); the rest (the
    transports', the domain proxy's, other domains') are completed by the CPU, as ``quiet``
    does. False (stream synchronized) where no open domain takes the stream or ``ctx`` is
    given."""
    rt = state.require()
    took = []
    if ctx is None:
        for heap in rt.domains.open_heaps():
            ops = ops_of(heap, stream)
            if ops is not None:
                ops.after_domain()
                took.append(heap)
    if not took:
        sync(stream)
        return False
    lib.vk_fence()
    for t in rt.routing.transports:
        t.quiet()
    for heap in rt.domains.nbi_heaps:
        if heap not in took:
            heap.quiet()
        elif heap.proxy is not None:
            heap.proxy.quiet()
    return True


def _world(stream: Any) -> tuple[Any, Any, list[Any]] | None:
    """``(heap, ops, every PE's memory handle)`` of a domain every PE maps and that takes
    ``stream``, or None."""
    rt = state.require()
    pes = rt.world.pes
    for heap in rt.domains.open_heaps():
        if heap.maps_all(pes):
            ops = ops_of(heap, stream)
            if ops is not None:
                return heap, ops, [heap.direct[pe] for pe in pes]
    return None


def _barrier(found: tuple[Any, Any, list[Any]]) -> bool:
    return bool(found[1].barrier(found[2], state.rt.my_pe, 0))


def sync_all(stream: Any) -> bool:
    """Collective: sync_all(stream=)."""
    found = _world(stream)
    if found is not None and _barrier(found):
        return True
    sync(stream)
    return False


def barrier_all(stream: Any) -> bool:
    """Collective: barrier_all(stream=): :func:`quiet` on the stream, then its barrier."""
    found = _world(stream)
    if found is not None:
        quiet(None, stream)
        if _barrier(found):
            return True
    sync(stream)
    return False


def team_sync(team_state: Any, stream: Any) -> bool:
    """Collective over the team: Team.sync(stream=) (enqueued for the team of every PE)."""
    if team_state is state.require().world:
        return sync_all(stream)
    sync(stream)
    return False


def _coll(target: Any, source: Any, team: Any, stream: Any) -> tuple[Any, Any, list[Any]] | None:
    if not isinstance(target, DomainArray) or not isinstance(source, DomainArray) or \
            target.domain is not source.domain:
        return None
    rt = state.require()
    if team is not None and getattr(team, "state", None) is not rt.world:
        return None
    heap = state.domain_heaps.get(target.domain)
    if heap is None or not heap.maps_all(rt.world.pes):
        return None
    ops = ops_of(heap, stream)
    return None if ops is None else (heap, ops, [heap.direct[pe] for pe in rt.world.pes])


def _pulls(found: tuple[Any, Any, list[Any]], copies: list[tuple[int, int, int, int]]) -> bool:
    """barrier, ``(member, target offset, source offset, bytes)`` copies into this PE's
    target, barrier."""
    heap, ops, members = found
    if not _barrier(found):
        return False
    for member, toff, soff, nbytes in copies:
        if nbytes and not (members[member] is heap.local and toff == soff):
            ops.copy(heap.local, toff, members[member], soff, nbytes)
    _barrier(found)
    return True


def broadcast(target: Any, source: Any, root: Any, size: Any, team: Any, stream: Any) -> bool:
    """Collective: broadcast(stream=)."""
    found = _coll(target, source, team, stream)
    if found is not None:
        n = len(found[2])
        root = int(root)
        if not 0 <= root < n:
            raise InvalidArgumentError(f"root {root} is not a PE of this team of {n} PEs")
        nbytes = count_of(target, source, size) * same_dtype(target, source).itemsize
        toff = place(target, nbytes, "broadcast target")[1]
        soff = place(source, nbytes, "broadcast source")[1]
        if _pulls(found, [(root, toff, soff, nbytes)]):
            return True
    sync(stream)
    return False


def fcollect(target: Any, source: Any, size: Any, team: Any, stream: Any) -> bool:
    """Collective: fcollect(stream=)."""
    found = _coll(target, source, team, stream)
    if found is not None:
        n = len(found[2])
        isz = same_dtype(target, source).itemsize
        cnt = source.size if size is None else int(size)
        if cnt * n > target.size or cnt > source.size or cnt < 0:
            raise InvalidArgumentError(f"fcollect: {n} PEs x {cnt} elements do not fit in a "
                                       f"target of {target.size} (source {source.size})")
        b = cnt * isz
        toff = place(target, b * n, "fcollect target")[1]
        soff = place(source, b, "fcollect source")[1]
        if _pulls(found, [(i, toff + i * b, soff, b) for i in range(n)]):
            return True
    sync(stream)
    return False


def alltoall(target: Any, source: Any, size: Any, team: Any, stream: Any) -> bool:
    """Collective: alltoall(stream=)."""
    found = _coll(target, source, team, stream)
    if found is not None:
        n = len(found[2])
        me = state.rt.my_pe
        isz = same_dtype(target, source).itemsize
        cnt = source.size // n if size is None else int(size)
        if cnt < 0 or cnt * n > target.size or cnt * n > source.size:
            raise InvalidArgumentError(f"alltoall: {n} PEs x {cnt} elements do not fit in "
                                       f"target ({target.size}) and source ({source.size})")
        b = cnt * isz
        toff = place(target, b * n, "alltoall target")[1]
        soff = place(source, b * n, "alltoall source")[1]
        if _pulls(found, [(i, toff + i * b, soff + me * b, b) for i in range(n)]):
            return True
    sync(stream)
    return False


def reduce(target: Any, source: Any, op: str, size: Any, team: Any, stream: Any) -> bool:
    """Collective: reduce and the ``*_reduce`` forms with ``stream=`` (``op``: the checked
    name). Enqueued where the domain's kernel does ``op`` on the dtype for this many members
    and ``source`` does not overlap ``target``; otherwise the fallback."""
    found = _coll(target, source, team, stream)
    if found is not None:
        _heap, ops, members = found
        dt = same_dtype(target, source)
        cnt = count_of(target, source, size)
        nbytes = cnt * dt.itemsize
        toff = place(target, nbytes, "reduce target")[1]
        soff = place(source, nbytes, "reduce source")[1]
        apart = toff + nbytes <= soff or soff + nbytes <= toff
        if apart and ops.can_reduce(op, dt, len(members)) and _barrier(found):
            if cnt:
                ops.reduce(toff, [(m, soff) for m in members], cnt, op, dt)
            _barrier(found)
            return True
    sync(stream)
    return False
