"""What the bootstrap store knows of its job, and how it answers a member's requests.

:class:`StoreState` is the half of :class:`vkshmem.core.bootstrap.store.StoreServer` that has no
sockets: who is a member (:mod:`vkshmem.core.bootstrap.members`), the allgather rounds in
flight, the failures and aborts the PEs reported, and why the job can no longer complete (its
*poison*, with ``fail_fast``). One condition variable guards it all; the server's connection
threads call in with one request each (:meth:`StoreState._handle`) and wait there for a round to
complete, for a PE to be known absent, or for the round's time limit.

:mod:`vkshmem.core.bootstrap.store` serves it over TCP; :mod:`vkshmem.core.bootstrap.wire`
defines the requests.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from .members import Members, generation_name
from .wire import (
    I32,
    ROUND,
    TIMEOUT_VAR,
    Msg,
    deadline_in,
    format_seconds,
    pack_blobs,
    rank_list,
)

__all__ = ["StoreState"]


class _Round:
    __slots__ = ("blobs", "fetched", "result")

    def __init__(self) -> None:
        self.blobs: dict[int, bytes] = {}
        self.result: bytes | None = None
        self.fetched = 0


class StoreState:
    """The state of one job of ``size`` PEs as the store sees it, and the answers to requests.

    Not used alone: :class:`vkshmem.core.bootstrap.store.StoreServer` is one, and adds the
    sockets and threads that serve it (``fail_fast``, ``on_failure`` and ``on_abort`` are
    documented there). The methods named with a leading underscore are called by the server's
    connection threads; the others are the server's public API.
    """

    def __init__(
        self,
        size: int,
        *,
        fail_fast: bool = False,
        on_failure: Callable[[int, str], None] | None = None,
        on_abort: Callable[[int, int], None] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"job size must be >= 1, got {size}")
        self.size = size
        self.fail_fast = fail_fast
        self.on_failure = on_failure
        self.on_abort = on_abort
        self.failures: list[tuple[int, str]] = []
        self.aborts: list[tuple[int, int]] = []
        self._cond = threading.Condition()
        self._members = Members(size)
        self._next: dict[int, int] = {}  # rank -> its next round (in its generation)
        self._rounds: dict[tuple[int, int], _Round] = {}  # (generation, round) -> round
        self._poison: str | None = None
        self._closed = False

    def wait_members_gone(self, timeout: float | None, generation: int | None = None) -> bool:
        """Wait until every PE that ever connected has left; False if ``timeout`` ran out.

        With ``generation``, only connections of that generation or an older one are waited
        for (a PE that already joined the next runtime does not hold up the end of this one).
        PEs that never connected are not waited for, and nobody is waited for once a
        ``fail_fast`` store knows the job failed.
        """
        deadline = deadline_in(timeout)
        with self._cond:
            while (self._members.connected(generation) and not self._closed
                   and self._poison is None):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)
            return True

    def connected(self) -> list[int]:
        """The ranks that hold a member connection now."""
        with self._cond:
            return self._members.connected()

    def member_exited(self, rank: int) -> None:
        """The process of PE ``rank`` has ended (the launcher saw it): it cannot join again, so
        a round of a later generation that waits for it fails at once, naming it."""
        with self._cond:
            if self._members.exited(rank):
                self._cond.notify_all()

    def _failed(self, rank: int, text: str) -> None:
        """Record that PE ``rank`` failed (its report, or a refused join after a crash) and
        tell ``on_failure``."""
        self._record(self.failures, (rank, text), f"PE {rank} failed: {text}",
                     self.on_failure)

    def _record(self, into: list[tuple[int, Any]], event: tuple[int, Any], poison: str,
                callback: Callable[..., Any] | None) -> None:
        """Append a failure or abort ``event``, poison the store (fail-fast) with its text,
        wake every waiter, then tell ``callback(*event)`` (whose errors are dropped)."""
        with self._cond:
            into.append(event)
            if self.fail_fast and self._poison is None:
                self._poison = poison
            self._cond.notify_all()
        if callback is not None:
            with contextlib.suppress(Exception):
                callback(*event)

    def _handle(self, rank: int, generation: int, kind: int,
                payload: bytes) -> tuple[Msg, bytes]:
        if kind == Msg.ALLGATHER:
            if len(payload) < ROUND.size:
                return Msg.ERROR, b"malformed allgather request"
            if generation < 0:
                return Msg.ERROR, b"allgather on a control connection"
            round_no, limit_ms = ROUND.unpack_from(payload)
            return self._allgather(rank, generation, round_no, limit_ms / 1000.0,
                                   payload[ROUND.size:])
        if kind == Msg.FAILURE:
            self._failed(rank, payload.decode("utf-8", "replace"))
            return Msg.OK, b""
        if kind == Msg.ABORT:
            if len(payload) != I32.size:
                return Msg.ERROR, b"malformed abort request"
            (status,) = I32.unpack(payload)
            self._record(self.aborts, (rank, status), f"PE {rank} called global_exit({status})",
                         self.on_abort)
            return Msg.OK, b""
        return Msg.ERROR, f"unknown request kind {kind}".encode()

    def _allgather(self, rank: int, generation: int, round_no: int, limit: float,
                   blob: bytes) -> tuple[Msg, bytes]:
        name = f"allgather round {round_no}{generation_name(generation)}"
        with self._cond:
            expected = self._next[rank]
            if round_no != expected:
                return Msg.ERROR, (f"PE {rank} sent {name}, expected round "
                                   f"{expected}").encode()
            self._next[rank] = round_no + 1
            key = (generation, round_no)
            rnd = self._rounds.setdefault(key, _Round())
            rnd.blobs[rank] = blob
            if len(rnd.blobs) == self.size:
                rnd.result = pack_blobs(rnd.blobs[r] for r in range(self.size))
                rnd.blobs.clear()
                self._cond.notify_all()
            deadline = None if limit <= 0 else time.monotonic() + limit
            while rnd.result is None:
                problem = self._stuck(rnd, generation)
                if problem is not None:
                    return Msg.ERROR, f"{name} cannot complete: {problem}".encode()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return Msg.ERROR, self._timeout_text(name, generation, rnd, limit).encode()
                self._cond.wait(remaining)
            result = rnd.result
            rnd.fetched += 1
            if rnd.fetched >= self.size:
                self._rounds.pop(key, None)
        return Msg.RESULT, result

    def _stuck(self, rnd: _Round, generation: int) -> str | None:
        """Why a pending round can never complete, or None (caller holds the lock)."""
        if self._closed:
            return "the bootstrap store is shutting down"
        if self._poison is not None:
            return self._poison
        for r in range(self.size):
            if r not in rnd.blobs:
                why = self._members.absent(r, generation, self.fail_fast)
                if why is not None:
                    return f"PE {r} will not take part: {why}"
        return None

    def _timeout_text(self, name: str, generation: int, rnd: _Round, limit: float) -> str:
        missing = sorted(set(range(self.size)) - set(rnd.blobs))
        notes = self._members.notes(missing, generation)
        detail = f" ({'; '.join(notes)})" if notes else ""
        return (f"{name} timed out after {format_seconds(limit)} waiting "
                f"for PEs {rank_list(missing)}{detail}; {len(rnd.blobs)} of {self.size} PEs "
                f"arrived. {TIMEOUT_VAR} sets this limit: raise it if they are only slow, "
                f"otherwise find out why they stopped (every PE must make the same collective "
                f"calls in the same order)")
