"""Distributed mutual-exclusion locks: ``set_lock``/``test_lock``/``clear_lock`` and ``Lock``.

Algorithm: a **ticket lock**, fair (FIFO) under contention. A lock is one symmetric 64-bit word
(``new_lock()`` gives a one-element ``int64`` array; any one-element, 8-byte aligned 64-bit
integer symmetric array that starts at 0 works too, as in C). Only one PE's copy of the word is
used: the *owner*, ``(byte offset of the word in its segment // 64) % n_pes``, so different
locks spread over the PEs (``Lock.owner`` says which PE it is). The word packs two 32-bit
counters: ``next`` (high half: the next ticket to hand out) and ``serving`` (low half: the
ticket that holds the lock).

* ``set_lock`` takes a ticket with one fetch-add of ``2**32`` on the owner; when the old
  ``serving`` equals the ticket the lock is held at once. Otherwise it waits until ``serving``
  reaches the ticket: spinning on the word itself (GIL released, native spin helper) when the
  owner's memory is mapped here (the owner is this PE, or a same-node PE over the shm path);
  else polling it with an atomic fetch and a backoff proportional to its place in the queue
  (sleeps, so the GIL and the CPU are free for others). PEs are served in ticket order.
* ``test_lock`` reads the word and, if ``next == serving`` (free, nobody queued),
  compare-swaps ``next`` one up: it returns False when that took the lock (as in C).
* ``clear_lock`` runs ``quiet`` (the critical section's writes complete first), then adds 1 to
  ``serving`` (cancelling the carry into ``next`` when ``serving`` wraps at ``2**32``).

Waiting honours ``VKSHMEM_WAIT_TIMEOUT`` (WaitTimeoutError) and Ctrl-C. A waiter that gives up
withdraws its ticket when nobody queued behind it (or releases the lock if it was granted in
the meantime); otherwise the ticket cannot be withdrawn, the PEs queued behind it wait until
their own timeout, and the error says so.

Locks are held by a PE (any thread of it may release). ``new_lock``, ``del_lock``, ``Lock()``
and ``Lock.destroy`` are collective.

When the owner is on the shm path and the lock a plain numpy word, ``set_lock``/``test_lock``/
``clear_lock`` run in C (:mod:`vkshmem.core.fast`, ``csrc/fast_lock.c``): the same atomics on
the owner's word and the same ``_held`` table; a ``set_lock`` that must queue waits here
(``_wait_ticket``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ..core._native import ffi, lib
from ..core.domains.contract import DomainArray
from ..core.domains.heap import DomainHeap
from ..core.errors import InvalidArgumentError, InvalidTypeError, TransportError, WaitTimeoutError
from ..core.fast import entry
from ..core.transports.contract import AmoOp
from . import state
from .alloc import free, new_array
from .args import check_pe, locate, place, resolve

__all__ = ["Lock", "clear_lock", "del_lock", "new_lock", "set_lock", "test_lock"]

_MASK64 = (1 << 64) - 1
_MASK48 = (1 << 48) - 1
_DTYPES = frozenset(np.dtype(c) for c in "lLqQ")  # native 64-bit integers
_LOW = (1 << 32) - 1
_TICKET = 1 << 32
_RELEASE_WRAP = (1 - _TICKET) & _MASK64  # +1 on serving at 2**32 - 1, the carry cancelled
_FETCH, _ADD, _CSWAP = AmoOp.FETCH, AmoOp.ADD, AmoOp.CSWAP
_BACKOFF_S = 10e-6  # remote polling: sleep this much per PE ahead in the queue ...
_BACKOFF_MAX_S = 1e-3  # ... at most

#: Locks this PE holds: (segment, offset) -> (ticket, thread that took it).
_held: dict[tuple[int, int], tuple[int, int]] = {}


class _Where:
    """Where a lock's word lives and how to reach it."""

    __slots__ = ("key", "off", "owner", "seg", "t")

    def __init__(self, lock: Any, what: str) -> None:
        if type(lock) is not np.ndarray and isinstance(lock, DomainArray):
            self._in_domain(lock, what)
            return
        try:
            r = lib.vk_locate(ffi.from_buffer(lock), 8) \
                if lock.dtype in _DTYPES and lock.size == 1 else -1
        except (AttributeError, TypeError, BufferError, ValueError):
            r = -1
        if r < 0 or r & 7:
            _explain(lock, what)
        seg, off = r >> 48, r & _MASK48
        self.seg, self.off, self.key = seg, off, (seg, off)
        self.owner, self.t = resolve(None, (off >> 6) % state.rt.n_pes)

    def _in_domain(self, lock: DomainArray, what: str) -> None:
        """A lock word in a domain's heap (GPU memory): the heap routes its AMOs to the owner
        (imported memory, a link, a transport or the domain proxy)."""
        if lock.dtype not in _DTYPES or lock.size != 1:
            raise InvalidArgumentError(f"{what}: a lock is one 64-bit integer word (int64), got "
                                       f"{lock.size} x {lock.dtype}")
        heap, off = place(lock, 8, f"{what} lock")
        if off & 7:
            raise InvalidArgumentError(f"{what}: the lock is not 8-byte aligned (offset {off})")
        self.seg, self.off, self.key = heap.seg_id, off, (heap.seg_id, off)
        self.owner = check_pe((off >> 6) % state.rt.n_pes)
        self.t = heap

    def amo(self, op: AmoOp, operand: int = 0, compare: int = 0, fetch: bool = True) -> int:
        try:
            return self.t.amo(self.owner, self.seg, self.off, op, 8, operand, compare, fetch)
        except TransportError as exc:  # a PeerFailedError if the owner failed (as cause)
            raise state.rt.waiter.translate(exc, self.owner)  # noqa: B904

    def direct_address(self) -> int:
        """Address of the owner's word when it can be loaded here, else 0 (a domain's word:
        this PE's own, where the domain lets the CPU watch it)."""
        rt = state.rt
        if isinstance(self.t, DomainHeap):
            return self.t.watch_address(self.off) if self.owner == rt.my_pe else 0
        if self.t is state.shm or self.owner == rt.my_pe:
            base = lib.vk_peer_base(self.seg, self.owner)
            if base:
                return int(base) + self.off
        return 0

    def release(self, ticket: int) -> None:
        self.amo(_ADD, _RELEASE_WRAP if ticket == _LOW else 1, 0, False)


def _explain(lock: Any, what: str) -> None:
    """Raise the InvalidArgumentError that says what is wrong with ``lock``."""
    dt = getattr(lock, "dtype", None)
    if not isinstance(lock, np.ndarray) or dt is None:
        raise InvalidTypeError(f"{what}: a lock is a one-element symmetric int64 array "
                               f"(from shmem.new_lock()), got {type(lock).__name__}")
    if dt.kind not in "iu" or dt.itemsize != 8 or not dt.isnative:
        raise InvalidArgumentError(f"{what}: a lock must be a 64-bit integer word (int64), "
                                   f"not {dt}")
    if lock.size != 1:
        raise InvalidArgumentError(f"{what}: a lock is one element, got {lock.size}")
    _seg, off = locate(lock, 8, f"{what} lock")  # raises: not symmetric
    raise InvalidArgumentError(f"{what}: the lock is not 8-byte aligned (offset {off})")


def new_lock(domain: str = "host") -> np.ndarray:
    """Collective: a new lock (a one-element symmetric int64 array set to 0 = free); with
    ``domain='gpu'`` the word lies in GPU memory (``set_lock`` and the rest take it alike)."""
    return new_array(1, np.int64, domain=domain)


def del_lock(lock: np.ndarray) -> None:
    """Collective: release a lock from :func:`new_lock` (it must not be held or awaited)."""
    seg_off = _Where(lock, "del_lock").key
    _held.pop(seg_off, None)
    free(lock)


def set_lock(lock: np.ndarray) -> None:
    """Acquire ``lock``, waiting in FIFO order behind the PEs that asked first."""
    w = _Where(lock, "set_lock")
    me = threading.get_ident()
    mine = _held.get(w.key)
    if mine is not None and mine[1] == me:
        raise InvalidArgumentError("set_lock: this thread already holds the lock (locks are "
                                   "not recursive: it would wait for itself)")
    old = w.amo(_ADD, _TICKET)
    ticket = (old >> 32) & _LOW
    if old & _LOW != ticket:
        _wait_turn(w, ticket)
    lib.vk_fence()  # the critical section's accesses stay after the acquisition
    _held[w.key] = (ticket, me)


def _wait_turn(w: _Where, ticket: int) -> None:
    """Wait until ``serving`` reaches ``ticket``; give the ticket back on timeout/interrupt."""
    waiter = state.rt.waiter
    what = f"set_lock (ticket {ticket} of the lock on PE {w.owner})"
    try:
        addr = w.direct_address()
        if addr:  # a load of the word (the domain's CPU view of its own memory, too)
            amo = lib.vk_amo
            waiter.wait(lambda: amo(addr, _FETCH, 8, 0, 0) & _LOW == ticket, addr, 8, what)
            return
        timeout = waiter.timeout
        deadline = time.monotonic() + timeout if timeout else None
        lv = state.rt.liveness
        while True:
            ahead = (ticket - w.amo(_FETCH)) & _LOW
            if ahead == 0:
                return
            if lv.any:
                raise lv.error(what)
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeoutError(f"{what} did not happen within {timeout:g} s "
                                       "(VKSHMEM_WAIT_TIMEOUT; 0 waits for ever)")
            time.sleep(min(_BACKOFF_MAX_S, _BACKOFF_S * (ahead - 1)))
    except WaitTimeoutError as exc:
        note = "" if _give_up(w, ticket) else (
            "; its ticket could not be withdrawn (PEs queued behind it), so the lock stays "
            "blocked for them")
        raise WaitTimeoutError(f"{exc}{note}") from None
    except BaseException:
        try:
            _give_up(w, ticket)
        except Exception:  # keep the interrupt; the lock's fate is secondary
            pass
        raise


def _give_up(w: _Where, ticket: int) -> bool:
    """Withdraw ``ticket`` (or release the lock if it was granted meanwhile); False when
    neither is possible because other PEs queued behind it."""
    for _ in range(100):
        word = w.amo(_FETCH)
        if word & _LOW == ticket:  # granted after all: hand it on
            w.release(ticket)
            return True
        if (word >> 32) & _LOW != (ticket + 1) & _LOW:
            return False
        if w.amo(_CSWAP, (word - _TICKET) & _MASK64, word) == word:
            return True
    return False


def test_lock(lock: np.ndarray) -> bool:
    """Take ``lock`` only if it is free now, without waiting. Returns **False when the lock
    was acquired** and True when it was already held (as in C and shmem4py)."""
    w = _Where(lock, "test_lock")
    word = w.amo(_FETCH)
    serving = word & _LOW
    if (word >> 32) & _LOW != serving:
        return True  # held (or queued for)
    if w.amo(_CSWAP, (word + _TICKET) & _MASK64, word) != word:
        return True  # somebody else got there first
    lib.vk_fence()
    _held[w.key] = (serving, threading.get_ident())
    return False


def clear_lock(lock: np.ndarray) -> None:
    """Release ``lock``, held by this PE: ``quiet`` first, so every access made while holding
    it is complete before the next PE in line gets it."""
    w = _Where(lock, "clear_lock")
    mine = _held.pop(w.key, None)
    if mine is None:
        raise InvalidArgumentError("clear_lock: this PE does not hold the lock")
    state.rt.quiet()
    w.release(mine[0])


def _wait_ticket(lock: np.ndarray, ticket: int) -> None:
    """The compiled ``set_lock`` queued with ``ticket``: wait for its turn here."""
    _wait_turn(_Where(lock, "set_lock"), ticket)


# When the lock's owner is on the shm path (plain numpy word), the three run in C
# (vkshmem.core.fast) on the owner's word, sharing _held with the functions above; a queued
# set_lock waits in _wait_ticket. Everything else, and every error, takes the Python functions.
_LOCK_STATE = {"held": _held, "wait": _wait_ticket}
set_lock = entry("set_lock", set_lock, opmap=_LOCK_STATE)
test_lock = entry("test_lock", test_lock, opmap=_LOCK_STATE)
clear_lock = entry("clear_lock", clear_lock, opmap=_LOCK_STATE)


class Lock:
    """A lock object (shmem4py's ``Lock``). Creating it is collective, as is ``destroy``.

    ``with lock:`` holds it for the block. ``Lock(domain="gpu")`` puts its word in GPU
    memory (as :func:`new_lock` does). See the module docstring for the algorithm.
    """

    _lock: np.ndarray | None

    def __init__(self, domain: str = "host") -> None:
        self._lock = None
        self._lock = new_lock(domain)

    def _word(self) -> np.ndarray:
        if self._lock is None:
            raise InvalidArgumentError("this Lock was destroyed")
        return self._lock

    @property
    def lock(self) -> np.ndarray:
        """The symmetric word (usable with ``set_lock``/``test_lock``/``clear_lock``)."""
        return self._word()

    @property
    def owner(self) -> int:
        """The PE whose copy of the word implements the lock."""
        return _Where(self._word(), "Lock.owner").owner

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock: wait for it (``blocking``, returns True), or try once and return
        whether it was acquired."""
        lock = self._word()
        if blocking:
            set_lock(lock)
            return True
        return not test_lock(lock)

    def release(self) -> None:
        """Release the lock (after a ``quiet``)."""
        clear_lock(self._word())

    def destroy(self) -> None:
        """Collective: free the lock's memory (a destroyed Lock cannot be used)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            del_lock(lock)

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return "Lock(destroyed)" if self._lock is None else f"Lock(owner=PE {self.owner})"
