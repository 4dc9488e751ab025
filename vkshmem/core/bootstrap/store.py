"""A small TCP rendezvous service (the "store") that the ``local`` and ``env`` bootstraps use.

One :class:`StoreServer` serves one job of ``size`` PEs; every PE holds one
:class:`StoreClient` connection to it (:mod:`vkshmem.core.bootstrap.client`). The server is
hosted by the launcher (``vkshmem run``, bootstrap ``local``) or by rank 0 (bootstrap ``env``).

Operations
----------
``allgather(blob)`` (collective)
    Every PE contributes one blob per *round*; when all ``size`` blobs of a round have arrived,
    every PE receives the list indexed by rank. Rounds are numbered by each client, so a PE that
    makes one call too many or too few desynchronises visibly (a timeout naming the missing PEs)
    instead of silently pairing the wrong blobs.
``barrier()`` (collective)
    ``allgather(b"")``.
``report_failure(text)`` (not collective)
    Tell the server (and so the launcher) that this PE is failing and why.
``abort(status)`` (not collective)
    Ask for the whole job to end with ``status`` (``global_exit``).

The wire format and its limits are :mod:`vkshmem.core.bootstrap.wire`'s.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

from .client import StoreClient
from .wire import (
    HELLO,
    HELLO_TIMEOUT,
    I32,
    MAGIC,
    ROUND,
    TIMEOUT_VAR,
    Msg,
    Role,
    deadline_in,
    format_seconds,
    pack_blobs,
    rank_list,
    recv_frame,
    send_frame,
    unpack_blobs,
)

__all__ = [
    "TIMEOUT_VAR",
    "StoreClient",
    "StoreServer",
    "format_seconds",
    "pack_blobs",
    "unpack_blobs",
]

# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------

class _Round:
    __slots__ = ("blobs", "fetched", "result")

    def __init__(self) -> None:
        self.blobs: dict[int, bytes] = {}
        self.result: bytes | None = None
        self.fetched = 0


class StoreServer:
    """The rendezvous server of one job of ``size`` PEs.

    The socket is bound and listening when the constructor returns (so its address can be
    handed to the PEs before they start); :meth:`start` starts serving in daemon threads.

    ``fail_fast``: when a PE reports a failure, aborts, or drops its connection without saying
    goodbye, every pending and later allgather fails at once with that reason (used when no
    launcher watches the job, as with the ``env`` bootstrap). Without it (under ``vkshmem run``,
    whose launcher ends the job) the others only learn it through their time limit.

    ``on_failure(rank, text)`` and ``on_abort(rank, status)`` are called from a server thread
    before the PE's request is acknowledged.
    """

    def __init__(
        self,
        size: int,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        job_id: str = "",
        fail_fast: bool = False,
        on_failure: Callable[[int, str], None] | None = None,
        on_abort: Callable[[int, int], None] | None = None,
        family: socket.AddressFamily | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"job size must be >= 1, got {size}")
        self.size = size
        self.job_id = job_id
        self.fail_fast = fail_fast
        self.on_failure = on_failure
        self.on_abort = on_abort
        self.failures: list[tuple[int, str]] = []
        self.aborts: list[tuple[int, int]] = []
        if family is None:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(max(128, 2 * size))
            host, port = self._listener.getsockname()[:2]
            self._address: tuple[str, int] = (str(host), int(port))
        except BaseException:
            self._listener.close()
            raise
        self._cond = threading.Condition()
        self._connected: set[int] = set()  # member ranks connected now
        self._seen: set[int] = set()  # member ranks that ever said hello
        self._gone: dict[int, str] = {}  # rank -> why it will not take part any more
        self._bye: set[int] = set()  # ranks that closed their bootstrap cleanly
        self._next: dict[int, int] = {}  # rank -> its next round
        self._rounds: dict[int, _Round] = {}
        self._poison: str | None = None
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor: threading.Thread | None = None

    # -- public ---------------------------------------------------------------------------
    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the server listens (or listened) on."""
        return self._address

    def start(self) -> StoreServer:
        """Start accepting connections (daemon threads). Returns ``self``."""
        if self._acceptor is None:
            self._acceptor = threading.Thread(target=self._accept_loop,
                                              name="vkshmem-store-accept", daemon=True)
            self._acceptor.start()
        return self

    def wait_members_gone(self, timeout: float | None) -> bool:
        """Wait until every PE that ever connected has left; False if ``timeout`` ran out.

        PEs that never connected are not waited for, and nobody is waited for once a
        ``fail_fast`` store knows the job failed.
        """
        deadline = deadline_in(timeout)
        with self._cond:
            while self._connected and not self._closed and self._poison is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)
            return True

    def close(self) -> None:
        """Stop serving and close every socket. Safe to call twice."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            conns = list(self._conns)
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._acceptor is not None and self._acceptor is not threading.current_thread():
            self._acceptor.join(2.0)
        for t in list(self._threads):
            if t is not threading.current_thread():
                t.join(2.0)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving --------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as sel:
            try:
                sel.register(self._listener, selectors.EVENT_READ)
            except (ValueError, OSError):
                return
            while not self._closed:
                try:
                    if not sel.select(0.2):
                        continue
                    conn, _ = self._listener.accept()
                except OSError:
                    if self._closed:
                        return
                    time.sleep(0.05)
                    continue
                conn.setblocking(True)
                with contextlib.suppress(OSError):
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with self._cond:
                    if self._closed:
                        conn.close()
                        return
                    self._conns.add(conn)
                    t = threading.Thread(target=self._serve, args=(conn,),
                                         name="vkshmem-store-conn", daemon=True)
                    self._threads = [x for x in self._threads if x.is_alive()]
                    self._threads.append(t)
                t.start()

    def _serve(self, conn: socket.socket) -> None:
        rank = -1
        role = Role.CONTROL
        said_bye = False
        try:
            try:
                kind, payload = recv_frame(conn, deadline_in(HELLO_TIMEOUT))
            except (OSError, EOFError, TimeoutError, ValueError, struct.error):
                return
            if kind != Msg.HELLO or len(payload) < HELLO.size:
                return  # not one of ours: drop it silently
            magic, role_v, rank, size = HELLO.unpack_from(payload)
            job_id = payload[HELLO.size:].decode("utf-8", "replace")
            problem = self._hello(magic, role_v, rank, size, job_id)
            if problem:
                send_frame(conn, Msg.ERROR, problem.encode())
                rank = -1
                return
            role = Role(role_v)
            send_frame(conn, Msg.OK)
            while True:
                try:
                    kind, payload = recv_frame(conn, None)
                except (OSError, EOFError, ValueError, struct.error):
                    return
                if kind == Msg.BYE:
                    said_bye = True
                    return
                answer = self._handle(rank, kind, payload)
                send_frame(conn, *answer)
        except OSError:
            return
        finally:
            with self._cond:
                self._conns.discard(conn)
                if role == Role.MEMBER and rank >= 0:
                    self._connected.discard(rank)
                    if said_bye:
                        self._bye.add(rank)
                    if rank not in self._gone:
                        self._gone[rank] = (
                            "it closed its bootstrap (finalized)" if said_bye else
                            "its connection to the bootstrap store closed without a goodbye "
                            "(did it exit or crash?)")
                        if not said_bye and self.fail_fast and self._poison is None:
                            self._poison = f"PE {rank} left the job: {self._gone[rank]}"
                    self._cond.notify_all()
            with contextlib.suppress(OSError):
                conn.close()

    def _hello(self, magic: bytes, role: int, rank: int, size: int, job_id: str) -> str | None:
        if magic != MAGIC:
            return "protocol mismatch: this store speaks another vkshmem store protocol version"
        if role not in (Role.MEMBER, Role.CONTROL):
            return f"unknown connection role {role}"
        if size != self.size:
            return (f"PE {rank} thinks the job has {size} PEs, the store was started for "
                    f"{self.size}")
        if not 0 <= rank < self.size:
            return f"rank {rank} is out of range for a job of {self.size} PEs"
        if job_id != self.job_id:
            return (f"job id mismatch: PE {rank} belongs to job {job_id!r}, this store serves "
                    f"job {self.job_id!r} (a stale environment from another job?)")
        if role == Role.MEMBER:
            with self._cond:
                if self._closed:
                    return "the store is shutting down"
                if rank in self._seen:
                    return f"PE {rank} is already connected (two processes with the same rank?)"
                self._seen.add(rank)
                self._connected.add(rank)
                self._next[rank] = 0
                self._cond.notify_all()
        return None

    def _handle(self, rank: int, kind: int, payload: bytes) -> tuple[Msg, bytes]:
        if kind == Msg.ALLGATHER:
            if len(payload) < ROUND.size:
                return Msg.ERROR, b"malformed allgather request"
            round_no, limit_ms = ROUND.unpack_from(payload)
            return self._allgather(rank, round_no, limit_ms / 1000.0,
                                   payload[ROUND.size:])
        if kind == Msg.FAILURE:
            text = payload.decode("utf-8", "replace")
            with self._cond:
                self.failures.append((rank, text))
                if self.fail_fast and self._poison is None:
                    self._poison = f"PE {rank} failed: {text}"
                self._cond.notify_all()
            if self.on_failure is not None:
                with contextlib.suppress(Exception):
                    self.on_failure(rank, text)
            return Msg.OK, b""
        if kind == Msg.ABORT:
            if len(payload) != I32.size:
                return Msg.ERROR, b"malformed abort request"
            (status,) = I32.unpack(payload)
            with self._cond:
                self.aborts.append((rank, status))
                if self.fail_fast and self._poison is None:
                    self._poison = f"PE {rank} called global_exit({status})"
                self._cond.notify_all()
            if self.on_abort is not None:
                with contextlib.suppress(Exception):
                    self.on_abort(rank, status)
            return Msg.OK, b""
        return Msg.ERROR, f"unknown request kind {kind}".encode()

    def _allgather(self, rank: int, round_no: int, limit: float,
                   blob: bytes) -> tuple[Msg, bytes]:
        with self._cond:
            expected = self._next.get(rank)
            if expected is None:
                return Msg.ERROR, b"allgather on a control connection"
            if round_no != expected:
                return Msg.ERROR, (f"PE {rank} sent allgather round {round_no}, expected "
                                   f"{expected}").encode()
            self._next[rank] = round_no + 1
            rnd = self._rounds.setdefault(round_no, _Round())
            rnd.blobs[rank] = blob
            if len(rnd.blobs) == self.size:
                rnd.result = pack_blobs(rnd.blobs[r] for r in range(self.size))
                rnd.blobs.clear()
                self._cond.notify_all()
            deadline = None if limit <= 0 else time.monotonic() + limit
            while rnd.result is None:
                problem = self._stuck(rnd)
                if problem is not None:
                    return Msg.ERROR, (f"allgather round {round_no} cannot complete: "
                                       f"{problem}").encode()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return Msg.ERROR, self._timeout_text(round_no, rnd, limit).encode()
                self._cond.wait(remaining)
            result = rnd.result
            rnd.fetched += 1
            if rnd.fetched >= self.size:
                self._rounds.pop(round_no, None)
        return Msg.RESULT, result

    def _stuck(self, rnd: _Round) -> str | None:
        """Why a pending round can never complete, or None (caller holds the lock)."""
        if self._closed:
            return "the bootstrap store is shutting down"
        if self._poison is not None:
            return self._poison
        for r, why in sorted(self._gone.items()):
            if r not in rnd.blobs and (self.fail_fast or r in self._bye):
                return f"PE {r} will not take part: {why}"
        return None

    def _timeout_text(self, round_no: int, rnd: _Round, limit: float) -> str:
        missing = sorted(set(range(self.size)) - set(rnd.blobs))
        notes = []
        never = [r for r in missing if r not in self._seen]
        if never:
            notes.append(f"never connected: {rank_list(never)}")
        left = [r for r in missing if r in self._gone]
        if left:
            notes.append("left: " + "; ".join(f"PE {r}: {self._gone[r]}" for r in left))
        detail = f" ({'; '.join(notes)})" if notes else ""
        return (f"allgather round {round_no} timed out after {format_seconds(limit)} waiting "
                f"for PEs {rank_list(missing)}{detail}; {len(rnd.blobs)} of {self.size} PEs "
                f"arrived. {TIMEOUT_VAR} sets this limit: raise it if they are only slow, "
                f"otherwise find out why they stopped (every PE must make the same collective "
                f"calls in the same order)")
