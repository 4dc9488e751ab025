"""Argument handling shared by the collectives of :mod:`.collectives` and :mod:`.reductions`.

These run on every call: the common case (1-D contiguous arrays, default team) takes the
fewest attribute lookups and calls; anything else goes through the general helpers of
:mod:`.args`, which also produce the error messages.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..core._native import ffi, lib
from ..core.collectives.team import _TEAMS, CollTeam, coll_team
from ..core.elements import element_count
from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.transports.contract import CollectiveArgs
from . import state
from .args import contiguous, locate, same_dtype

__all__ = ["coll_args", "prep", "size_or", "team_of"]

_MASK48 = (1 << 48) - 1
_vk_locate = lib.vk_locate
_from_buffer = ffi.from_buffer

def team_of(team: Any) -> CollTeam:
    """The collective state of ``team`` (default: every PE), or the error."""
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


def prep(ct: CollTeam, target: Any, source: Any,
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


def size_or(size: Any, limit: int) -> int:
    """``size`` checked as an element count (``limit`` when None)."""
    return limit if size is None else element_count(size, limit)


def coll_args(ct: CollTeam, name: str, target: tuple[int, int], tbytes: int,
              src: np.ndarray, nelems: int, **kw: Any) -> CollectiveArgs:
    """What an offloading transport's collective gets."""
    return CollectiveArgs(name=name, team_pes=ct.pes, me=ct.me, target=target,
                          target_nbytes=tbytes, source=memoryview(src).cast("B"),
                          dtype=src.dtype.str, nelems=nelems, **kw)
