"""Reductions and scans (shmem4py names and signatures): ``reduce`` and its per-operation
forms (``sum_reduce``, ``and_reduce``, ...), and the OpenSHMEM 1.6 scans
``sum_inscan``/``sum_exscan``. Collective over ``team`` with the rules of :mod:`.collectives`;
the algorithms are in :mod:`vkshmem.core.collectives.host`.

``reduce`` and the ``*_reduce`` forms take ``stream=`` (keyword-only; every member passes
one): GPU arrays of a domain that takes the stream, over the team of every PE, every PE mapping
every other's heap, a source that does not overlap the target and an op/dtype the domain's
kernel does: a barrier on the stream, the reduce kernel reading every member's source into this
PE's target, a barrier, returning at once (:mod:`.streamcoll`). Otherwise, and for the scans,
the stream is synchronized, then the blocking call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.collectives import device as _dev
from ..core.collectives import host as _core
from ..core.elements import count_of
from ..core.errors import InvalidArgumentError
from ..core.fast import entry
from . import state
from . import streamcoll as _streamcoll
from . import streams as _streams
from .args import ND, foreign
from .collargs import coll_args, prep, team_of
from .collcheck import agree
from .enums import OP

__all__ = [
    "and_reduce",
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
           size: int | None = None, team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: ``target`` = ``op`` applied elementwise over every member's
    ``source`` (``size`` elements; default: the shorter array), on every member. ``and``,
    ``or``, ``xor`` take integers; ``max``, ``min`` integers and floats; ``sum``, ``prod``
    every numeric dtype, complex included. ``source`` may be, or overlap, ``target``.
    ``stream``: see the module docstring."""
    if stream is not None and _streamcoll.reduce(target, source,
                                                 _op(op, np.dtype(target.dtype))[0], size,
                                                 team, stream):
        return
    if type(target) is not ND or type(source) is not ND:
        if _dev.reduce_again(state.rt, target, source, op, size, team):
            return  # a repeat of a device all-reduce whose path was kept
        if foreign(target, source):
            _dev.reduce(team_of(team), target, source, _op(op, np.dtype(target.dtype)), size,
                        lambda t, s: reduce(t, s, op, size, team), (op, size, team))
            return
    ct = team_of(team)
    dt, tgt, src, seg, off = prep(ct, target, source, "reduce")
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
        impl(coll_args(ct, "reduce", (seg, off), nbytes, src, cnt, op=entry[0]))
        return
    if ct.native is not None and ct.native.reduce(tgt, src, _CODES[entry[0]]):
        return  # a small all-reduce in a team of shm peers: in C, the same protocol
    _core.reduce(ct, tgt, seg, off, src, entry[1])


def _by_op(target: Any, source: Any, op: OP, size: Any, team: Any, stream: Any) -> None:
    """The ``*_reduce`` forms: ``reduce`` (its fast path where no stream is given)."""
    if stream is None:
        reduce(target, source, op, size, team)
    else:
        reduce(target, source, op, size, team, stream=stream)


def and_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: bitwise-AND all-reduce (``reduce`` with ``OP.AND``)."""
    _by_op(target, source, OP.AND, size, team, stream)


def or_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
              team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: bitwise-OR all-reduce (``reduce`` with ``OP.OR``)."""
    _by_op(target, source, OP.OR, size, team, stream)


def xor_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: bitwise-XOR all-reduce (``reduce`` with ``OP.XOR``)."""
    _by_op(target, source, OP.XOR, size, team, stream)


def max_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: maximum all-reduce (``reduce`` with ``OP.MAX``)."""
    _by_op(target, source, OP.MAX, size, team, stream)


def min_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: minimum all-reduce (``reduce`` with ``OP.MIN``)."""
    _by_op(target, source, OP.MIN, size, team, stream)


def sum_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: sum all-reduce (``reduce`` with ``OP.SUM``)."""
    _by_op(target, source, OP.SUM, size, team, stream)


def prod_reduce(target: np.ndarray, source: np.ndarray, size: int | None = None,
                team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team``: product all-reduce (``reduce`` with ``OP.PROD``)."""
    _by_op(target, source, OP.PROD, size, team, stream)


# The shm hot path (TEAM_WORLD of shm peers, plain numpy arrays, all-reduces of a type C
# computes: small ones in one butterfly phase, large ones by ring or in chunks) runs in C
# (vkshmem.core.fast); everything else, and every error, takes the Python functions above.
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
        _dev.scan(team_of(team), target, source, size, inclusive,
                  lambda t, s: _scan(t, s, size, team, inclusive))
        return
    ct = team_of(team)
    dt, tgt, src, seg, off = prep(ct, target, source, what)
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
        impl(coll_args(ct, what, (seg, off), nbytes, src, cnt, op="sum"))
        return
    if ct.native is not None and ct.native.scan(tgt, src, inclusive):
        return  # a team of shm peers, a type C adds: in C, the same protocol
    _core.scan(ct, tgt, seg, off, src, inclusive)


def sum_inscan(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team`` (OpenSHMEM 1.6): inclusive prefix sum. On team PE ``i``,
    ``target`` = the sum of ``source`` over team PEs ``0..i``, elementwise. ``stream``:
    synchronized, then the blocking call."""
    if stream is not None:
        _streams.sync(stream)
    _scan(target, source, size, team, True)


def sum_exscan(target: np.ndarray, source: np.ndarray, size: int | None = None,
               team: Any = None, *, stream: Any = None) -> None:
    """Collective over ``team`` (OpenSHMEM 1.6): exclusive prefix sum. On team PE ``i``,
    ``target`` = the sum of ``source`` over team PEs ``0..i-1`` (zeros on PE 0). ``stream``:
    synchronized, then the blocking call."""
    if stream is not None:
        _streams.sync(stream)
    _scan(target, source, size, team, False)


# The shm hot path (TEAM_WORLD of shm peers, plain numpy arrays of a type C adds) runs in C
# (vkshmem.core.fast); everything else, and every error, takes the Python functions above.
sum_inscan = entry("scan", sum_inscan, op=1)
sum_exscan = entry("scan", sum_exscan, op=0)
