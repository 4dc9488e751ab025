"""Collective operations (shmem4py names and signatures): ``broadcast``, ``collect``,
``fcollect``, ``alltoall``, ``alltoalls``, ``reduce`` and its per-operation forms, and the
OpenSHMEM 1.6 scans ``sum_inscan``/``sum_exscan``.

Every call is collective over ``team`` (default: every PE): each member makes the same calls in
the same order with the same ``size``/``root``/``op`` (collect's ``size`` may differ).
``target`` must be a symmetric array (or a contiguous slice of one) of the same dtype as
``source``; ``source`` may be any array. Arguments are checked before anything moves, and
checks that depend only on arguments every member passes alike (sizes, dtypes, root, op) fail
on every member, so nothing hangs. As OpenSHMEM requires, ``target`` must be ready on every
member before any member enters the call: reusing one ``target`` in back-to-back collectives
needs a ``team.sync()`` in between. The algorithms are in :mod:`vkshmem.core.collectives`.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..core import collectives as _core
from ..core._native import ffi, lib
from ..core.collectives import _TEAMS, CollTeam, coll_team
from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.fast import entry
from ..core.transport import CollectiveArgs
from . import device_collectives as _dev
from . import state
from .args import ND, contiguous, count_of, element_count, foreign, locate, same_dtype
from .collcheck import agree
from .enums import OP

__all__ = [
    "alltoall",
    "alltoalls",
    "and_reduce",
    "broadcast",
    "collect",
    "fcollect",
    "max_reduce",
    "min_reduce",
    "or_reduce",
    "prod_reduce",
    "reduce",
    "sum_exscan",
    "sum_inscan",
    "sum_reduce",
    "xor_reduce",
]

_MASK48 = (1 << 48) - 1
_vk_locate = lib.vk_locate
_from_buffer = ffi.from_buffer


# -- argument handling ------------------------------------------------------------------------
#
# These run on every call: the common case (1-D contiguous arrays, default team) takes the
# fewest attribute lookups and calls; anything else goes through the general helpers of args.py,
# which also produce the error messages.


def _team(team: Any) -> CollTeam:
    try:
        ts = state.rt.world if team is None else team.state
    except AttributeError:
        raise InvalidTypeError(f"team must be a shmem.Team, got {type(team).__name__}") \
            from None
    ct = _TEAMS.get(ts)
    if ct is None:
        if ts.me < 0:
            raise InvalidArgumentError("this PE is not a member of the team")
        ct = coll_team(ts)
    return ct


# Resolved targets, by id(): (weak reference, dtype, flat view, segment, offset, runtime).
# Collectives are usually called again and again on the same symmetric arrays; a hit costs a
# dict lookup and three identity checks instead of the flattening and the heap lookup.
_TARGETS: dict[int, tuple[weakref.ref[np.ndarray], np.dtype, np.ndarray, int, int, Any]] = {}
_TARGETS_MAX = 64


def _resolve(ct: CollTeam, target: Any, what: str) -> tuple[np.dtype, np.ndarray, int, int]:
    """(dtype, flat view in memory order, segment, offset) of symmetric ``target``."""
    try:
        dt = target.dtype
        flags = target.flags
    except AttributeError:
        raise InvalidTypeError(f"{what} target must be a numpy array from the symmetric "
                               f"heap, got {type(target).__name__}") from None
    if dt.hasobject:
        raise InvalidArgumentError("arrays of Python objects cannot be moved between PEs")
    if not flags.writeable:
        raise InvalidArgumentError(f"{what} target is read-only")
    tgt = target if flags.c_contiguous and target.ndim == 1 else _flat_target(target, what)
    r = _vk_locate(_from_buffer(tgt), tgt.nbytes)
    if r < 0:
        locate(tgt, tgt.nbytes, f"{what} target")  # raises with the reason
    seg, off = r >> 48, r & _MASK48
    if len(_TARGETS) >= _TARGETS_MAX:
        _TARGETS.clear()
    _TARGETS[id(target)] = (weakref.ref(target), dt, tgt, seg, off, ct.rt)
    return dt, tgt, seg, off


def _prep(ct: CollTeam, target: Any, source: Any,
          what: str) -> tuple[np.dtype, np.ndarray, np.ndarray, int, int]:
    """(dtype, flat target, flat source, segment, offset of the target), or the error: the
    target must be a writable, contiguous symmetric array, the source an array of its dtype."""
    e = _TARGETS.get(id(target))
    if e is not None and e[0]() is target and e[1] is target.dtype and e[5] is ct.rt:
        if not target.flags.writeable:
            raise InvalidArgumentError(f"{what} target is read-only")
        dt, tgt, seg, off = e[1], e[2], e[3], e[4]
    else:
        dt, tgt, seg, off = _resolve(ct, target, what)
    try:
        sdt = source.dtype
        sf = source.flags
    except AttributeError:
        raise InvalidTypeError(
            f"{what} source must be a numpy array, got {type(source).__name__}") from None
    if sdt is not dt and sdt != dt:
        same_dtype(target, source)  # raises: mismatch
    src = source if sf.c_contiguous and source.ndim == 1 else _flat_source(source)
    return dt, tgt, src, seg, off


def _flat_target(target: np.ndarray, what: str) -> np.ndarray:
    c = contiguous(target)
    if c is None:
        raise InvalidArgumentError(
            f"{what} target must be contiguous: a symmetric array or a contiguous slice of one")
    return c.reshape(-1)


def _flat_source(source: np.ndarray) -> np.ndarray:
    c = contiguous(source)
    if c is None:
        return np.ascontiguousarray(source).reshape(-1)
    return c.reshape(-1)


def _count(size: Any, limit: int) -> int:
    return limit if size is None else element_count(size, limit)


def _args(ct: CollTeam, name: str, target: tuple[int, int], tbytes: int, src: np.ndarray,
          nelems: int, **kw: Any) -> CollectiveArgs:
    return CollectiveArgs(name=name, team_pes=ct.pes, me=ct.me, target=target,
                          target_nbytes=tbytes, source=memoryview(src).cast("B"),
                          dtype=src.dtype.str, nelems=nelems, **kw)


# -- broadcast / collect / fcollect -----------------------------------------------------------


def broadcast(target: np.ndarray, source: np.ndarray, root: int, size: int | None = None,
              team: Any = None) -> None:
    """Collective over ``team``: copy ``size`` elements (default: the shorter array) of
    ``source`` on team PE ``root`` into ``target`` on every member, the root included
    (``source`` may be, or overlap, ``target``)."""
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _dev.broadcast(_team(team), target, source, int(root), size,
                       lambda t, s: broadcast(t, s, root, size, team))
        return
    ct = _team(team)
    dt, tgt, src, seg, off = _prep(ct, target, source, "broadcast")
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
        impl(_args(ct, "broadcast", (seg, off), nbytes, src, cnt, root=root))
        return
    if ct.native is not None and ct.native.broadcast(tgt, src, root):
        return  # a small broadcast in a team of shm peers: in C, the same protocol
    _core.broadcast(ct, tgt, seg, off, src, root)


def fcollect(target: np.ndarray, source: np.ndarray, size: int | None = None,
             team: Any = None) -> None:
    """Collective over ``team``: concatenate ``size`` elements (default: all of ``source``,
    the same count on every member) of each member's ``source`` in team order into
    ``target`` on every member (``MPI_Allgather``). ``source`` may be this member's own block
    of ``target`` (in place); any other overlap is refused."""
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _dev.fcollect(_team(team), target, source, size,
                      lambda t, s: fcollect(t, s, size, team))
        return
    ct = _team(team)
    dt, tgt, src, seg, off = _prep(ct, target, source, "fcollect")
    cnt = _count(size, src.size)
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
        impl(_args(ct, "fcollect", (seg, off), total * dt.itemsize, src, cnt))
        return
    if ct.native is not None and ct.native.fcollect(tgt, src):
        return  # a team of shm peers: in C, the same protocol
    _core.fcollect(ct, tgt, seg, off, src)


def collect(target: np.ndarray, source: np.ndarray, size: int | None = None,
            team: Any = None) -> None:
    """Collective over ``team``: concatenate ``size`` elements (default: all of ``source``;
    the count may differ from member to member) of each member's ``source`` in team order
    into ``target`` on every member (``MPI_Allgatherv``). The total must fit in ``target``
    (checked on every member after the counts are exchanged, before any data moves).
    ``source`` may be this member's own block of ``target`` (in place); any other overlap is
    refused."""
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _dev.collect(_team(team), target, source, size, lambda t, s: collect(t, s, size, team))
        return
    ct = _team(team)
    dt, tgt, src, seg, off = _prep(ct, target, source, "collect")
    agree(ct, "collect", dtype=dt)  # the counts may differ
    cnt = _count(size, src.size)
    if cnt > tgt.size:
        raise InvalidArgumentError(f"collect: {cnt} elements do not fit in a target of "
                                   f"{tgt.size}")
    if cnt != src.size:
        src = src[:cnt]
    impl = ct.offload("collect")
    if impl is not None:
        impl(_args(ct, "collect", (seg, off), tgt.nbytes, src, cnt))
        return
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
             team: Any = None) -> None:
    """Collective over ``team``: block ``j`` (``size`` elements; default: an equal share of
    the shorter array) of this member's ``source`` goes to block ``my_pe`` of member ``j``'s
    ``target``. ``source`` and ``target`` must not overlap."""
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        alltoalls(target, source, 1, 1, size, team)
        return
    ct = _team(team)
    dt, tgt, src, seg, off = _prep(ct, target, source, "alltoall")
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
        impl(_args(ct, "alltoall", (seg, off), tbytes, src, cnt))
        return
    _core.alltoall(ct, tgt[:n * cnt], seg, off, lambda j: src[j * cnt:(j + 1) * cnt], cnt)


def alltoalls(target: np.ndarray, source: np.ndarray, tst: int = 1, sst: int = 1,
              size: int | None = None, team: Any = None) -> None:
    """Collective over ``team``: strided ``alltoall``. Element ``i`` of the block for member
    ``j`` is ``source[(j*size + i)*sst]``; it lands in ``target[(my_pe*size + i)*tst]`` on
    member ``j``. ``source`` and ``target`` must not overlap."""
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        ct = _team(team)
        tst, sst = element_count(tst), element_count(sst)
        if tst < 1 or sst < 1:
            raise InvalidArgumentError(f"strides must be >= 1, got tst={tst}, sst={sst}")
        cnt = _a2a_count(target, source, size, ct.n, tst, sst)
        if cnt:
            _dev.alltoall(ct, target, source, cnt, tst, sst,
                          lambda t, s: alltoalls(t, s, tst, sst, size, team))
        return
    ct = _team(team)
    dt, tgt, src, seg, off = _prep(ct, target, source, "alltoalls")
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
        impl(_args(ct, "alltoalls", (seg, off), span * isz, src, cnt, tst=tst, sst=sst))
        return
    if tst == 1:

        def block(j: int) -> np.ndarray:
            s0 = j * cnt * sst
            return np.ascontiguousarray(src[s0:s0 + (cnt - 1) * sst + 1:sst])

        _core.alltoall(ct, tgt[:n * cnt], seg, off, block, cnt)
        return
    _core.alltoalls(ct, tgt[:span], src, cnt, tst, sst)


# -- reductions and scans ---------------------------------------------------------------------

# op (OP member or its value: they hash alike) -> (name, ufunc, dtype kinds it is defined on)
_OPS: dict[str, tuple[str, np.ufunc, str]] = {
    "and": ("and", np.bitwise_and, "iu"),
    "or": ("or", np.bitwise_or, "iu"),
    "xor": ("xor", np.bitwise_xor, "iu"),
    "max": ("max", np.maximum, "iuf"),
    "min": ("min", np.minimum, "iuf"),
    "sum": ("sum", np.add, "iufc"),
    "prod": ("prod", np.multiply, "iufc"),
}


#: the native all-reduce's operator codes (vkshmem/core/csrc/fast.h)
_CODES = {"sum": 1, "prod": 2, "min": 3, "max": 4, "and": 5, "or": 6, "xor": 7}


def _op(op: Any, dt: np.dtype) -> tuple[str, np.ufunc, str]:
    try:
        entry = _OPS.get(op) or _OPS[str(op).lower()]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"unknown reduction op {op!r}: use shmem.OP.AND/OR/XOR/MAX/MIN/SUM/PROD or "
            "their lower-case names") from None
    if dt.kind not in entry[2]:
        raise InvalidArgumentError(f"reduction op '{entry[0]}' is not defined for dtype {dt}")
    return entry


def reduce(target: np.ndarray, source: np.ndarray, op: OP | str = OP.SUM,
           size: int | None = None, team: Any = None) -> None:
    """Collective over ``team``: ``target`` = ``op`` applied elementwise over every member's
    ``source`` (``size`` elements; default: the shorter array), on every member. ``and``,
    ``or``, ``xor`` take integers; ``max``, ``min`` integers and floats; ``sum``, ``prod``
    every numeric dtype, complex included. ``source`` may be, or overlap, ``target``."""
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _dev.reduce(_team(team), target, source, _op(op, np.dtype(target.dtype)), size,
                    lambda t, s: reduce(t, s, op, size, team))
        return
    ct = _team(team)
    dt, tgt, src, seg, off = _prep(ct, target, source, "reduce")
    entry = _OPS.get(op)
    if entry is None or dt.kind not in entry[2]:
        entry = _op(op, dt)
    cnt = count_of(tgt, src, size)
    agree(ct, "reduce", op=entry[0], count=cnt, dtype=dt)
    nbytes = cnt * dt.itemsize
    if cnt == 0:
        return
    if cnt != tgt.size:
        tgt = tgt[:cnt]
    if cnt != src.size:
        src = src[:cnt]
    impl = ct.offload("reduce")
    if impl is not None:
        impl(_args(ct, "reduce", (seg, off), nbytes, src, cnt, op=entry[0]))
        return
    if ct.native is not None and ct.native.reduce(tgt, src, _CODES[entry[0]]):
        return  # a small all-reduce in a team of shm peers: in C, the same protocol
    _core.reduce(ct, tgt, seg, off, src, entry[1])


def and_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None) -> None:
    """Collective over ``team``: bitwise-AND all-reduce (``reduce`` with ``OP.AND``)."""
    reduce(target, source, OP.AND, size, team)


def or_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
              team: Any = None) -> None:
    """Collective over ``team``: bitwise-OR all-reduce (``reduce`` with ``OP.OR``)."""
    reduce(target, source, OP.OR, size, team)


def xor_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None) -> None:
    """Collective over ``team``: bitwise-XOR all-reduce (``reduce`` with ``OP.XOR``)."""
    reduce(target, source, OP.XOR, size, team)


def max_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None) -> None:
    """Collective over ``team``: maximum all-reduce (``reduce`` with ``OP.MAX``)."""
    reduce(target, source, OP.MAX, size, team)


def min_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None) -> None:
    """Collective over ``team``: minimum all-reduce (``reduce`` with ``OP.MIN``)."""
    reduce(target, source, OP.MIN, size, team)


def sum_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None) -> None:
    """Collective over ``team``: sum all-reduce (``reduce`` with ``OP.SUM``)."""
    reduce(target, source, OP.SUM, size, team)


def prod_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
                team: Any = None) -> None:
    """Collective over ``team``: product all-reduce (``reduce`` with ``OP.PROD``)."""
    reduce(target, source, OP.PROD, size, team)


# The shm hot path (TEAM_WORLD of shm peers, plain numpy arrays: broadcast, fcollect, and
# small all-reduces of a type C computes) runs in C (vkshmem.core.fast); everything else, and every
# error, takes the Python functions above.
broadcast = entry("broadcast", broadcast)
fcollect = entry("fcollect", fcollect)
reduce = entry("reduce", reduce, op=_CODES["sum"],
               opmap={**{m: _CODES[m.value] for m in OP}, **_CODES})
and_reduce = entry("reduce", and_reduce, op=_CODES["and"])
or_reduce = entry("reduce", or_reduce, op=_CODES["or"])
xor_reduce = entry("reduce", xor_reduce, op=_CODES["xor"])
max_reduce = entry("reduce", max_reduce, op=_CODES["max"])
min_reduce = entry("reduce", min_reduce, op=_CODES["min"])
sum_reduce = entry("reduce", sum_reduce, op=_CODES["sum"])
prod_reduce = entry("reduce", prod_reduce, op=_CODES["prod"])


def _scan(target: np.ndarray, source: np.ndarray, size: Any, team: Any,
          inclusive: bool) -> None:
    what = "sum_inscan" if inclusive else "sum_exscan"
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _dev.scan(_team(team), target, source, size, inclusive,
                  lambda t, s: _scan(t, s, size, team, inclusive))
        return
    ct = _team(team)
    dt, tgt, src, seg, off = _prep(ct, target, source, what)
    if dt.kind not in "iufc":
        raise InvalidArgumentError(f"{what} is not defined for dtype {dt}")
    cnt = count_of(tgt, src, size)
    agree(ct, what, count=cnt, dtype=dt)
    nbytes = cnt * dt.itemsize
    if cnt == 0:
        return
    if cnt != tgt.size:
        tgt = tgt[:cnt]
    if cnt != src.size:
        src = src[:cnt]
    impl = ct.offload(what)
    if impl is not None:
        impl(_args(ct, what, (seg, off), nbytes, src, cnt, op="sum"))
        return
    _core.scan(ct, tgt, seg, off, src, inclusive)


def sum_inscan(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None) -> None:
    """Collective over ``team`` (OpenSHMEM 1.6): inclusive prefix sum. On team PE ``i``,
    ``target`` = the sum of ``source`` over team PEs ``0..i``, elementwise."""
    _scan(target, source, size, team, True)


def sum_exscan(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None) -> None:
    """Collective over ``team`` (OpenSHMEM 1.6): exclusive prefix sum. On team PE ``i``,
    ``target`` = the sum of ``source`` over team PEs ``0..i-1`` (zeros on PE 0)."""
    _scan(target, source, size, team, False)
