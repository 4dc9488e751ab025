"""Point-to-point synchronisation (``wait_until``/``test`` families) and ordering
(``fence``/``quiet``/``barrier_all``/``sync_all``).

Waits spin on the local words in native code with the GIL released (so a transport's threads
and other Python threads run), and honour ``VKSHMEM_WAIT_TIMEOUT``.

An empty set (no variables, or ``status`` excluding every one) is OpenSHMEM 1.6's: the waits
return at once, ``wait_until_any``/``test_any`` return None (C's ``SIZE_MAX``),
``wait_until_some``/``test_some`` return ``[]`` and ``test_all`` returns True.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.fast import entry
from . import state
from . import streamcoll as _streamcoll
from .args import ND, DomainArray, heap_of, locate
from .enums import cmp_codes, cmp_function

try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # numpy < 2
    _byte_bounds = np.byte_bounds  # type: ignore[attr-defined]

__all__ = [
    "barrier_all", "fence", "quiet", "sync_all", "test", "test_all", "test_all_vector",
    "test_any", "test_any_vector", "test_some", "test_some_vector", "wait_until",
    "wait_until_all", "wait_until_all_vector", "wait_until_any", "wait_until_any_vector",
    "wait_until_some", "wait_until_some_vector",
]


def fence(ctx: Any = None, *, stream: Any = None) -> None:
    """Operations to each PE issued (on ``ctx``) before ``fence`` are delivered before later
    ones. With ``stream`` (keyword-only; see ``quiet``), as ``quiet(stream=)``."""
    if stream is not None and _streamcoll.quiet(ctx, stream):
        return
    if ctx is None:
        state.rt.fence()
    else:
        _ctx_method(ctx, "fence")()


def quiet(ctx: Any = None, *, stream: Any = None) -> None:
    """Wait until every operation this PE issued (on ``ctx``) is complete at its target.
    With ``stream`` (keyword-only: a CUDA stream, or any object with ``synchronize()``): the
    stream waits for this PE's non-blocking operations of the memory domains that take it
    (the CPU does not; operations issued on the stream are ordered by it already) and the
    CPU completes the rest; where no domain takes the stream it is synchronized, then
    ``quiet``."""
    if stream is not None and _streamcoll.quiet(ctx, stream):
        return
    if ctx is None:
        state.rt.quiet()
    else:
        _ctx_method(ctx, "quiet")()


def _ctx_method(ctx: Any, name: str) -> Callable[[], None]:
    try:
        return getattr(ctx, name)
    except AttributeError:
        raise InvalidTypeError(f"{name}: ctx must be a shmem.Ctx (or None for the default "
                               f"context), got {type(ctx).__name__}") from None


def barrier_all(*, stream: Any = None) -> None:
    """Collective over all PEs: ``quiet``, then wait until every PE arrives. With ``stream``
    (keyword-only; every PE passes one): where every PE maps every other's GPU heap of a
    domain that takes the stream, ``quiet(stream=)`` and a barrier kernel on the stream
    (bounded by ``VKSHMEM_GPU_TIMEOUT``), returning at once; otherwise the stream is
    synchronized and the blocking barrier made."""
    if stream is not None and _streamcoll.barrier_all(stream):
        return
    state.rt.barrier_all()


def sync_all(*, stream: Any = None) -> None:
    """Collective over all PEs: wait until every PE arrives (does not complete puts). With
    ``stream``: as ``barrier_all(stream=)`` without its quiet."""
    if stream is not None and _streamcoll.sync_all(stream):
        return
    state.rt.sync_all()


def _flat(ivars: Any, what: str) -> tuple[np.ndarray, int, int]:
    """``(flat values, address, nbytes)``; the address is -1 for GPU memory without a CPU
    view (the values are then a copy that :func:`_wait` refreshes), and for no values."""
    state.require()
    if getattr(ivars, "size", None) == 0:  # an empty set: nothing to watch
        return np.empty(0, ivars.dtype), -1, 0
    if type(ivars) is not ND and isinstance(ivars, DomainArray):
        addr = heap_of(ivars, what).watch_address(ivars.offset)
        if addr:
            return ivars.to_numpy(zero_copy=True).reshape(-1), addr, ivars.nbytes
        return ivars.to_numpy().reshape(-1), -1, ivars.nbytes
    if not isinstance(ivars, np.ndarray):
        raise InvalidTypeError(f"{what} needs a numpy array, got {type(ivars).__name__}")
    lo, hi = _byte_bounds(ivars)
    # a symmetric, live allocation, as RMA requires (a freed or private word would wait for a
    # write that can never come)
    locate(ivars if ivars.flags.c_contiguous else (ctypes.c_char * (hi - lo)).from_address(lo),
           hi - lo, what)
    return ivars.reshape(-1), lo, hi - lo


def _wait(pred: Callable[[], object], ivars: Any, flat: np.ndarray, addr: int, nbytes: int,
          what: str) -> None:
    rt = state.rt
    if addr >= 0:
        rt.waiter.wait(pred, addr, nbytes, what)
    else:  # device memory the CPU cannot see: poll copies of it
        heap_of(ivars, what).wait(pred, ivars.offset, memoryview(flat).cast("B"), what)


def _active(status: Sequence[int] | None, n: int) -> np.ndarray | None:
    """Which of ``n`` variables the set holds (``status`` nonzero excludes one; entries past
    the ``n``-th are ignored, as in shmem4py)."""
    if status is None:
        return None
    mask = np.asarray(status).reshape(-1)
    if mask.size < n:
        raise InvalidArgumentError(f"status has {mask.size} entries for {n} variables")
    return mask[:n] == 0


def _values(values: Any, flat: np.ndarray) -> np.ndarray:
    """One comparison value per variable (entries past the last variable are ignored)."""
    v = np.asarray(values, dtype=flat.dtype).reshape(-1)
    if v.size < flat.size:
        raise InvalidArgumentError(f"values has {v.size} entries for {flat.size} variables")
    return v[:flat.size]


def _empty(flat: np.ndarray, active: np.ndarray | None) -> bool:
    """Whether the wait/test set is empty: no variables, or ``status`` excludes them all
    (OpenSHMEM 1.6: waits return at once; ``all`` is satisfied, ``any`` finds no index)."""
    return flat.size == 0 or (active is not None and not active.any())


def _hits(flat: np.ndarray, f: Callable[[Any, Any], Any], value: Any,
          active: np.ndarray | None) -> np.ndarray:
    ok = np.asarray(f(flat, value))
    return ok if active is None else ok & active


def wait_until(ivar: np.ndarray, cmp: Any, value: Any) -> None:
    """Block until local ``ivar`` (one element) satisfies ``ivar cmp value``."""
    f = cmp_function(cmp)
    flat, addr, nbytes = _flat(ivar, "wait_until")
    if flat.size != 1:
        raise InvalidArgumentError(f"wait_until takes one element, got {flat.size}")
    _wait(lambda: f(flat[0], value), ivar, flat, addr, nbytes,
          f"wait_until(ivar {cmp} {value})")


def _wait_set(name: str, ivars: np.ndarray, cmp: Any, value: Any,
              status: Sequence[int] | None, vector: bool,
              done: Callable[[np.ndarray, np.ndarray | None], bool]) -> np.ndarray:
    f = cmp_function(cmp)
    flat, addr, nbytes = _flat(ivars, name)
    active = _active(status, flat.size)
    if vector:
        value = _values(value, flat)
    if _empty(flat, active):
        return np.zeros(flat.size, bool)
    box: list[np.ndarray] = []

    def pred() -> bool:
        hits = _hits(flat, f, value, active)
        box[:] = [hits]
        return done(hits, active)

    _wait(pred, ivars, flat, addr, nbytes, f"{name}(cmp {cmp})")
    return box[0]


def _all_done(hits: np.ndarray, active: np.ndarray | None) -> bool:
    return bool(hits.all()) if active is None else bool(hits[active].all())


def _any_done(hits: np.ndarray, active: np.ndarray | None) -> bool:
    return bool(hits.any())


#: ``*_any``'s rotation: per watched array (its address and length), the index returned last,
#: in a table the compiled path (fast_wait.c) reads and writes too. Rows: address, length,
#: index + 1 (address 0: free); an array's row lies within ``_ROT_PROBE`` rows of its home
#: row (:func:`_rot_home`); with all of those taken the home row is reused: forgetting only
#: restarts that array's rotation.
_ROT_SLOTS, _ROT_PROBE = 4096, 8
_rotation = np.zeros((_ROT_SLOTS + _ROT_PROBE, 3), np.uint64)
_M64 = (1 << 64) - 1


def _rot_home(addr: int, n: int) -> int:
    return ((((addr >> 3) * 0x9E3779B97F4A7C15) + n) & _M64) >> 52


def _rot_get(addr: int, n: int) -> int:
    home = _rot_home(addr, n)
    for a, m, i in _rotation[home:home + _ROT_PROBE].tolist():
        if a == addr and m == n:
            return int(i) - 1
    return -1


def _rot_set(addr: int, n: int, index: int) -> None:
    home = _rot_home(addr, n)
    rows = _rotation[home:home + _ROT_PROBE].tolist()
    free = [j for j, (a, m, _i) in enumerate(rows) if a == 0]
    j = next((j for j, (a, m, _i) in enumerate(rows) if a == addr and m == n),
             free[0] if free else 0)
    _rotation[home + j] = (addr, n, index + 1)


def _pick(hits: np.ndarray, ivars: Any) -> int | None:
    """A satisfied index, the first after the one returned last for the same array (round
    robin, wrapping to the first): a series of calls returns every index that stays satisfied
    (OpenSHMEM 1.5/1.6), rather than the lowest one for ever."""
    idx = np.flatnonzero(hits)
    if not idx.size:
        return None
    addr = _address(ivars) & _M64
    after = _rot_get(addr, hits.size)
    pos = int(np.searchsorted(idx, after, side="right"))
    chosen = int(idx[pos if pos < idx.size else 0])
    _rot_set(addr, hits.size, chosen)
    return chosen


def _address(ivars: Any) -> int:
    if isinstance(ivars, np.ndarray):
        return int(ivars.__array_interface__["data"][0])
    return id(ivars.domain) ^ (int(getattr(ivars, "offset", 0)) << 1)


def wait_until_all(ivars: np.ndarray, cmp: Any, value: Any,
                   status: Sequence[int] | None = None) -> None:
    """Block until every element not excluded by ``status`` (nonzero = excluded) satisfies
    ``ivar cmp value`` (at once when the set is empty)."""
    _wait_set("wait_until_all", ivars, cmp, value, status, False, _all_done)


def wait_until_any(ivars: np.ndarray, cmp: Any, value: Any,
                   status: Sequence[int] | None = None) -> int | None:
    """Block until some element satisfies the condition; return its index (None, at once,
    when the set is empty: no elements, or ``status`` excludes every one)."""
    return _pick(_wait_set("wait_until_any", ivars, cmp, value, status, False, _any_done),
                 ivars)


def wait_until_some(ivars: np.ndarray, cmp: Any, value: Any,
                    status: Sequence[int] | None = None) -> list[int]:
    """Block until at least one element satisfies the condition; return every such index
    (``[]``, at once, when the set is empty)."""
    hits = _wait_set("wait_until_some", ivars, cmp, value, status, False, _any_done)
    return [int(i) for i in np.flatnonzero(hits)]


def wait_until_all_vector(ivars: np.ndarray, cmp: Any, values: Sequence[Any],
                          status: Sequence[int] | None = None) -> None:
    """As ``wait_until_all`` with one comparison value per element."""
    _wait_set("wait_until_all_vector", ivars, cmp, values, status, True, _all_done)


def wait_until_any_vector(ivars: np.ndarray, cmp: Any, values: Sequence[Any],
                          status: Sequence[int] | None = None) -> int | None:
    """As ``wait_until_any`` with one comparison value per element."""
    return _pick(_wait_set("wait_until_any_vector", ivars, cmp, values, status, True,
                           _any_done), ivars)


def wait_until_some_vector(ivars: np.ndarray, cmp: Any, values: Sequence[Any],
                           status: Sequence[int] | None = None) -> list[int]:
    """As ``wait_until_some`` with one comparison value per element."""
    hits = _wait_set("wait_until_some_vector", ivars, cmp, values, status, True, _any_done)
    return [int(i) for i in np.flatnonzero(hits)]


def _test_hits(name: str, ivars: np.ndarray, cmp: Any, value: Any,
               status: Sequence[int] | None, vector: bool) -> tuple[np.ndarray, Any]:
    f = cmp_function(cmp)
    flat, _addr, _n = _flat(ivars, name)
    active = _active(status, flat.size)
    if vector:
        value = _values(value, flat)
    return _hits(flat, f, value, active), active


def test(ivar: np.ndarray, cmp: Any, value: Any) -> bool:
    """Whether local ``ivar`` (one element) satisfies ``ivar cmp value`` now."""
    hits, _ = _test_hits("test", ivar, cmp, value, None, False)
    if hits.size != 1:
        raise InvalidArgumentError(f"test takes one element, got {hits.size}")
    return bool(hits[0])


def test_all(ivars: np.ndarray, cmp: Any, value: Any,
             status: Sequence[int] | None = None) -> bool:
    """Whether every element not excluded by ``status`` satisfies the condition now (True for
    an empty set)."""
    return _all_done(*_test_hits("test_all", ivars, cmp, value, status, False))


def test_any(ivars: np.ndarray, cmp: Any, value: Any,
             status: Sequence[int] | None = None) -> int | None:
    """Index of an element that satisfies the condition now, or None."""
    return _pick(_test_hits("test_any", ivars, cmp, value, status, False)[0], ivars)


def test_some(ivars: np.ndarray, cmp: Any, value: Any,
              status: Sequence[int] | None = None) -> list[int]:
    """Indices of every element that satisfies the condition now."""
    return [int(i) for i in np.flatnonzero(
        _test_hits("test_some", ivars, cmp, value, status, False)[0])]


def test_all_vector(ivars: np.ndarray, cmp: Any, values: Sequence[Any],
                    status: Sequence[int] | None = None) -> bool:
    """As ``test_all`` with one comparison value per element."""
    return _all_done(*_test_hits("test_all_vector", ivars, cmp, values, status, True))


def test_any_vector(ivars: np.ndarray, cmp: Any, values: Sequence[Any],
                    status: Sequence[int] | None = None) -> int | None:
    """As ``test_any`` with one comparison value per element."""
    return _pick(_test_hits("test_any_vector", ivars, cmp, values, status, True)[0], ivars)


def test_some_vector(ivars: np.ndarray, cmp: Any, values: Sequence[Any],
                     status: Sequence[int] | None = None) -> list[int]:
    """As ``test_some`` with one comparison value per element."""
    return [int(i) for i in np.flatnonzero(
        _test_hits("test_some_vector", ivars, cmp, values, status, True)[0])]


# The shm hot path runs in C (vkshmem.core.fast): quiet/fence while no transport is open or
# every open one offers them in C (Transport.native_ops),
# barrier_all/sync_all on a TEAM_WORLD of shm peers, wait_until/test on one plain integer
# and the set-wide ones on a plain integer array.
# Everything else, and every error, takes the Python functions above.
fence = entry("quiet", fence, op=1)
quiet = entry("quiet", quiet, op=0)
barrier_all = entry("barrier_all", barrier_all, op=1)
sync_all = entry("barrier_all", sync_all, op=0)
wait_until = entry("wait_until", wait_until, opmap=cmp_codes())
test = entry("test", test, opmap=cmp_codes())
# the set-wide tests and waits on a plain numpy integer array (fast_wait.c's fast_wait_set:
# op = mode (0 all, 1 any, 2 some) | vector << 2 | wait << 3)
test_all = entry("wait_set", test_all, op=0, opmap=cmp_codes())
test_any = entry("wait_set", test_any, op=1, opmap=cmp_codes())
test_some = entry("wait_set", test_some, op=2, opmap=cmp_codes())
test_all_vector = entry("wait_set", test_all_vector, op=4, opmap=cmp_codes())
test_any_vector = entry("wait_set", test_any_vector, op=5, opmap=cmp_codes())
test_some_vector = entry("wait_set", test_some_vector, op=6, opmap=cmp_codes())
wait_until_all = entry("wait_set", wait_until_all, op=8, opmap=cmp_codes())
wait_until_any = entry("wait_set", wait_until_any, op=9, opmap=cmp_codes())
wait_until_some = entry("wait_set", wait_until_some, op=10, opmap=cmp_codes())
wait_until_all_vector = entry("wait_set", wait_until_all_vector, op=12, opmap=cmp_codes())
wait_until_any_vector = entry("wait_set", wait_until_any_vector, op=13, opmap=cmp_codes())
wait_until_some_vector = entry("wait_set", wait_until_some_vector, op=14, opmap=cmp_codes())
