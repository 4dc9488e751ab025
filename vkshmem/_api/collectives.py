"""Collective data movement (shmem4py names and signatures): ``broadcast``, ``collect``,
``fcollect``, ``alltoall``, ``alltoalls``; the reductions and scans are in :mod:`.reductions`.

Every call is collective over ``team`` (default: every PE): each member makes the same calls in
the same order with the same ``size``/``root``/``op`` (collect's ``size`` may differ).
``target`` must be a symmetric array (or a contiguous slice of one) of the same dtype as
``source``; ``source`` may be any array. Arguments are checked before anything moves, and
checks that depend only on arguments every member passes alike (sizes, dtypes, root, op) fail
on every member, so nothing hangs. As OpenSHMEM requires, ``target`` must be ready on every
member before any member enters the call: reusing one ``target`` in back-to-back collectives
needs a ``team.sync()`` in between. The algorithms are in :mod:`vkshmem.core.collectives.host`.

Every call takes ``stream=`` (keyword-only; every member passes one): ``broadcast``,
``fcollect`` and ``alltoall`` of GPU arrays of a domain that takes the stream, over the team
of every PE, every PE mapping every other's heap, are enqueued (a barrier on the stream, copies
pulling from the members' sources, a barrier: :mod:`.streamcoll`) and return at once;
``collect``, ``alltoalls`` and every other case synchronize the stream, then run blocking.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.collectives import device as _dev
from ..core.collectives import host as _core
from ..core.elements import count_of, element_count
from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.fast import entry
from . import streamcoll as _streamcoll
from . import streams as _streams
from .args import ND, foreign
from .collargs import coll_args, prep, size_or, team_of
from .collcheck import agree

__all__ = ["alltoall", "alltoalls", "broadcast", "collect", "fcollect"]


# -- broadcast / collect / fcollect -----------------------------------------------------------


def broadcast(target: np.ndarray, source: np.ndarray, root: int, size: int | None = None,
              team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: copy ``size`` elements (default: the shorter array) of
    ``source`` on team PE ``root`` into ``target`` on every member, the root included
    (``source`` may be, or overlap, ``target``). ``stream``: see the module docstring."""
    if stream is not None and _streamcoll.broadcast(target, source, root, size, team, stream):
        return
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _dev.broadcast(team_of(team), target, source, int(root), size,
                       lambda t, s: broadcast(t, s, root, size, team))
        return
    ct = team_of(team)
    dt, tgt, src, seg, off = prep(ct, target, source, "broadcast")
    cnt = count_of(tgt, src, size)
    if root.__class__ is not int:
        try:
            root = int(root.__index__())
        except AttributeError:
            raise InvalidTypeError(f"root must be an integer, got {root!r}") from None
    if not 0 <= root < ct.n:
        raise InvalidArgumentError(f"root {root} is not a PE of this team of {ct.n} PEs")
    agree(ct, "broadcast", root=root, count=cnt, dtype=dt)
    nbytes = cnt * dt.itemsize
    if cnt == 0:
        return
    if cnt != src.size:
        src = src[:cnt]
    if cnt != tgt.size:
        tgt = tgt[:cnt]
    impl = ct.offload("broadcast")
    if impl is not None:
        impl(coll_args(ct, "broadcast", (seg, off), nbytes, src, cnt, root=root))
        return
    if ct.native is not None and ct.native.broadcast(tgt, src, root):
        return  # a small broadcast in a team of shm peers: in C, the same protocol
    _core.broadcast(ct, tgt, seg, off, src, root)


def fcollect(target: np.ndarray, source: np.ndarray, size: int | None = None,
             team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: concatenate ``size`` elements (default: all of ``source``,
    the same count on every member) of each member's ``source`` in team order into
    ``target`` on every member (``MPI_Allgather``). ``source`` may be this member's own block
    of ``target`` (in place); any other overlap is refused. ``stream``: see the module
    docstring."""
    if stream is not None and _streamcoll.fcollect(target, source, size, team, stream):
        return
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _dev.fcollect(team_of(team), target, source, size,
                      lambda t, s: fcollect(t, s, size, team))
        return
    ct = team_of(team)
    dt, tgt, src, seg, off = prep(ct, target, source, "fcollect")
    cnt = size_or(size, src.size)
    agree(ct, "fcollect", count=cnt, dtype=dt)
    total = cnt * ct.n
    if total > tgt.size:
        raise InvalidArgumentError(f"fcollect: {ct.n} PEs x {cnt} elements do not fit in a "
                                   f"target of {tgt.size}")
    if cnt == 0:
        return
    if cnt != src.size:
        src = src[:cnt]
    if total != tgt.size:
        tgt = tgt[:total]
    impl = ct.offload("fcollect")
    if impl is not None:
        impl(coll_args(ct, "fcollect", (seg, off), total * dt.itemsize, src, cnt))
        return
    if ct.native is not None and ct.native.fcollect(tgt, src):
        return  # a team of shm peers: in C, the same protocol
    _core.fcollect(ct, tgt, seg, off, src)


def collect(target: np.ndarray, source: np.ndarray, size: int | None = None,
            team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: concatenate ``size`` elements (default: all of ``source``;
    the count may differ from member to member) of each member's ``source`` in team order
    into ``target`` on every member (``MPI_Allgatherv``). The total must fit in ``target``
    (checked on every member after the counts are exchanged, before any data moves).
    ``source`` may be this member's own block of ``target`` (in place); any other overlap is
    refused. ``stream``: synchronized, then the blocking call (the counts are exchanged by
    the CPU)."""
    if stream is not None:
        _streams.sync(stream)
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _dev.collect(team_of(team), target, source, size, lambda t, s: collect(t, s, size, team))
        return
    ct = team_of(team)
    dt, tgt, src, seg, off = prep(ct, target, source, "collect")
    agree(ct, "collect", dtype=dt)  # the counts may differ
    cnt = size_or(size, src.size)
    if cnt > tgt.size:
        raise InvalidArgumentError(f"collect: {cnt} elements do not fit in a target of "
                                   f"{tgt.size}")
    if cnt != src.size:
        src = src[:cnt]
    impl = ct.offload("collect")
    if impl is not None:
        impl(coll_args(ct, "collect", (seg, off), tgt.nbytes, src, cnt))
        return
    if ct.native is not None and ct.native.collect(tgt, src):
        return  # a team of shm peers: in C, the same protocol
    _core.collect(ct, tgt, seg, off, src)


# -- alltoall(s) ------------------------------------------------------------------------------


def _a2a_count(tgt: np.ndarray, src: np.ndarray, size: Any, n: int, tst: int,
               sst: int) -> int:
    tlen = -(-tgt.size // tst)
    slen = -(-src.size // sst)
    if size is None:
        cnt, rem = divmod(min(tlen, slen), n)
        if rem:
            raise InvalidArgumentError(
                f"alltoall: {min(tlen, slen)} elements do not split evenly over {n} PEs; "
                "pass size (elements per PE)")
        return cnt
    cnt = element_count(size)
    if cnt * n > tlen or cnt * n > slen:
        raise InvalidArgumentError(
            f"alltoall: {n} PEs x {cnt} elements do not fit in target ({tlen}) and source "
            f"({slen}) at strides {tst}, {sst}")
    return cnt


def alltoall(target: np.ndarray, source: np.ndarray, size: int | None = None,
             team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: block ``j`` (``size`` elements; default: an equal share of
    the shorter array) of this member's ``source`` goes to block ``my_pe`` of member ``j``'s
    ``target``. ``source`` and ``target`` must not overlap. ``stream``: see the module
    docstring."""
    if stream is not None and _streamcoll.alltoall(target, source, size, team, stream):
        return
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        alltoalls(target, source, 1, 1, size, team)
        return
    ct = team_of(team)
    dt, tgt, src, seg, off = prep(ct, target, source, "alltoall")
    n = ct.n
    cnt = _a2a_count(tgt, src, size, n, 1, 1)
    agree(ct, "alltoall", count=cnt, dtype=dt)
    tbytes = n * cnt * dt.itemsize
    if cnt == 0:
        return
    src = src[:n * cnt]
    if _core.overlap(src, seg, off, tbytes, True):
        raise InvalidArgumentError("alltoall: source and target must not overlap")
    impl = ct.offload("alltoall")
    if impl is not None:
        impl(coll_args(ct, "alltoall", (seg, off), tbytes, src, cnt))
        return
    if ct.native is not None and ct.native.alltoall(tgt, src, cnt, 1, 1):
        return  # a team of shm peers: in C, the same protocol
    _core.alltoall(ct, tgt[:n * cnt], seg, off, lambda j: src[j * cnt:(j + 1) * cnt], cnt)


def alltoalls(target: np.ndarray, source: np.ndarray, tst: int = 1, sst: int = 1,
              size: int | None = None, team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: strided ``alltoall``. Element ``i`` of the block for member
    ``j`` is ``source[(j*size + i)*sst]``; it lands in ``target[(my_pe*size + i)*tst]`` on
    member ``j``. ``source`` and ``target`` must not overlap. ``stream``: synchronized, then
    the blocking call."""
    if stream is not None:
        _streams.sync(stream)
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        ct = team_of(team)
        tst, sst = element_count(tst), element_count(sst)
        if tst < 1 or sst < 1:
            raise InvalidArgumentError(f"strides must be >= 1, got tst={tst}, sst={sst}")
        cnt = _a2a_count(target, source, size, ct.n, tst, sst)
        if cnt:
            _dev.alltoall(ct, target, source, cnt, tst, sst,
                          lambda t, s: alltoalls(t, s, tst, sst, size, team))
        return
    ct = team_of(team)
    dt, tgt, src, seg, off = prep(ct, target, source, "alltoalls")
    tst = element_count(tst)
    sst = element_count(sst)
    if tst < 1 or sst < 1:
        raise InvalidArgumentError(f"strides must be >= 1, got tst={tst}, sst={sst}")
    n = ct.n
    cnt = _a2a_count(tgt, src, size, n, tst, sst)
    agree(ct, "alltoalls", count=cnt, tst=tst, sst=sst, dtype=dt)
    isz = dt.itemsize
    span = (n * cnt - 1) * tst + 1 if cnt else 0
    if cnt == 0:
        return
    src = src[:(n * cnt - 1) * sst + 1]
    if _core.overlap(src, seg, off, span * isz, True):
        raise InvalidArgumentError("alltoalls: source and target must not overlap")
    impl = ct.offload("alltoalls")
    if impl is not None:
        impl(coll_args(ct, "alltoalls", (seg, off), span * isz, src, cnt, tst=tst, sst=sst))
        return
    if ct.native is not None and ct.native.alltoall(tgt, src, cnt, tst, sst):
        return  # a team of shm peers: in C, the same protocol
    if tst == 1:

        def block(j: int) -> np.ndarray:
            s0 = j * cnt * sst
            return np.ascontiguousarray(src[s0:s0 + (cnt - 1) * sst + 1:sst])

        _core.alltoall(ct, tgt[:n * cnt], seg, off, block, cnt)
        return
    _core.alltoalls(ct, tgt[:span], src, cnt, tst, sst)


# The shm hot path (TEAM_WORLD of shm peers, plain numpy arrays) runs in C
# (vkshmem.core.fast); everything else, and every error, takes the Python functions above.
broadcast = entry("broadcast", broadcast)
fcollect = entry("fcollect", fcollect)
collect = entry("collect", collect)
alltoall = entry("alltoall", alltoall)
alltoalls = entry("alltoall", alltoalls)
