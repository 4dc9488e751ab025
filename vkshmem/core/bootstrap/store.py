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

This module holds the server's sockets, threads and authentication (:class:`StoreServer`).
What the server knows of the job and how it answers a request (members, allgather rounds,
failures, aborts) is :mod:`vkshmem.core.bootstrap.storestate`'s; the wire format and its limits
are :mod:`vkshmem.core.bootstrap.wire`'s.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

from ..auth import derive_key, new_nonce, verify
from .client import StoreClient
from .storestate import StoreState
from .wire import (
    AUTH_FAILED,
    CONTROL_TIMEOUT,
    FRAME_TIMEOUT,
    HELLO,
    HELLO_TIMEOUT,
    MAGIC,
    MAX_HELLO,
    MAX_JOB_ID,
    MAX_REQUEST,
    TIMEOUT_VAR,
    U32,
    Msg,
    Role,
    client_proof,
    deadline_in,
    format_seconds,
    pack_blobs,
    recv_frame,
    send_frame,
    server_proof,
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

#: Connections that have not proved the secret yet; beyond this many, the oldest is dropped.
MAX_PENDING = 32

_MISMATCH = ("protocol mismatch: this store speaks another vkshmem store protocol version "
             "(the launcher and the PEs must run the same vkshmem)")

# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class StoreServer(StoreState):
    """The rendezvous server of one job of ``size`` PEs.

    The socket is bound and listening when the constructor returns (so its address can be
    handed to the PEs before they start); :meth:`start` starts serving in daemon threads.

    ``fail_fast``: when a PE reports a failure, aborts, or drops its connection without saying
    goodbye, every pending and later allgather fails at once with that reason (used when no
    launcher watches the job, as with the ``env`` bootstrap). Without it (under ``vkshmem run``,
    whose launcher ends the job) the others only learn it through their time limit.

    ``on_failure(rank, text)`` and ``on_abort(rank, status)`` are called from a server thread
    before the PE's request is acknowledged. A PE that drops its connection without a goodbye
    and then tries to join again is refused, and that counts as its failure report.

    Re-initialisation (OpenSHMEM 1.6): a PE that said goodbye (finalized) may connect again
    from the same process, as the next *generation*; rounds are numbered per generation (see
    :mod:`vkshmem.core.bootstrap.members` for who may join and who is refused).

    ``secret``: the job's secret (:mod:`vkshmem.core.auth`); a connection is served only once it
    proved it knows it (``b""``: no secret, anyone who can connect is served). At most
    :data:`MAX_PENDING` connections may be proving it at a time (the oldest is dropped for a
    new one), and at most ``2 * size + MAX_PENDING + 16`` connections are open at a time (one
    thread each): a flood of idle connections cannot exhaust the server.
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
        secret: bytes = b"",
    ) -> None:
        super().__init__(size, fail_fast=fail_fast, on_failure=on_failure, on_abort=on_abort)
        self.job_id = job_id
        self._key = derive_key(secret, "store")
        self.max_conns = 2 * size + MAX_PENDING + 16
        #: connections dropped: for too many pending, too many open, failed authentication
        self.dropped = {"pending": 0, "open": 0, "auth": 0}
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
        self._conns: set[socket.socket] = set()
        self._pending: dict[socket.socket, None] = {}  # in arrival order
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

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

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
                    self._threads = [x for x in self._threads if x.is_alive()]
                    if len(self._threads) >= self.max_conns:
                        self.dropped["open"] += 1
                        conn.close()
                        continue
                    self._conns.add(conn)
                    self._pending[conn] = None
                    if len(self._pending) > MAX_PENDING:
                        oldest = next(iter(self._pending))
                        del self._pending[oldest]
                        self.dropped["pending"] += 1
                        with contextlib.suppress(OSError):
                            oldest.shutdown(socket.SHUT_RDWR)  # its thread then ends
                    t = threading.Thread(target=self._serve, args=(conn,),
                                         name="vkshmem-store-conn", daemon=True)
                    self._threads.append(t)
                t.start()

    def _serve(self, conn: socket.socket) -> None:
        """One connection: its hello, then requests until a goodbye or the end of the
        connection. The socket is closed only after a member's leaving is recorded, so a client
        that waits for that (``StoreClient.close``) may connect again at once."""
        rank = -1
        generation = -1  # of a member connection
        said_bye = False
        try:
            try:
                payload = self._authenticate(conn)
            except (OSError, EOFError, TimeoutError, ValueError, struct.error):
                return
            if payload is None:
                return
            magic, role, rank, size, pid, token, _nonce = HELLO.unpack_from(payload)
            job_id = payload[HELLO.size:].decode("utf-8", "replace")
            got = self._hello(magic, role, rank, size, job_id, token, pid)
            if isinstance(got, str):
                send_frame(conn, Msg.ERROR, got.encode())
                return
            generation = got
            send_frame(conn, Msg.OK, U32.pack(max(generation, 0)))
            # A control connection makes one request; a member's may idle between collectives.
            deadline = deadline_in(2 * CONTROL_TIMEOUT) if generation < 0 else None
            while True:
                try:
                    kind, payload = recv_frame(conn, deadline, MAX_REQUEST, FRAME_TIMEOUT)
                except (OSError, EOFError, TimeoutError, ValueError, struct.error):
                    return
                if kind == Msg.BYE:
                    said_bye = True
                    return
                answer = self._handle(rank, generation, kind, payload)
                send_frame(conn, *answer)
        except OSError:
            return
        finally:
            with self._cond:
                self._conns.discard(conn)
                self._pending.pop(conn, None)
                if generation >= 0:
                    why = self._members.leave(rank, said_bye)
                    if not said_bye and self.fail_fast and self._poison is None:
                        self._poison = f"PE {rank} left the job: {why}"
                    self._cond.notify_all()
            with contextlib.suppress(OSError):
                conn.close()

    def _authenticate(self, conn: socket.socket) -> bytes | None:
        """The hello of a connection that proved it knows the job's secret (challenge-response,
        see :mod:`vkshmem.core.bootstrap.wire`), or None when it did not (it was told so, or,
        when it does not speak this protocol at all, dropped silently)."""
        deadline = deadline_in(HELLO_TIMEOUT)
        kind, hello = recv_frame(conn, deadline, MAX_HELLO, FRAME_TIMEOUT)
        if kind != Msg.HELLO or len(hello) < HELLO.size or hello[:4] != MAGIC:
            if kind == Msg.HELLO and hello[:3] == MAGIC[:3]:  # another version's hello
                send_frame(conn, Msg.ERROR, _MISMATCH.encode())
            return None  # not one of ours
        nonce = new_nonce()
        send_frame(conn, Msg.CHALLENGE, nonce + server_proof(self._key, hello, nonce))
        kind, answer = recv_frame(conn, deadline, MAX_HELLO, FRAME_TIMEOUT)
        if kind != Msg.AUTH or not verify(client_proof(self._key, hello, nonce), answer):
            with self._cond:
                self.dropped["auth"] += 1
            send_frame(conn, Msg.ERROR, AUTH_FAILED.encode())
            return None
        with self._cond:
            self._pending.pop(conn, None)
        return hello

    def _hello(self, magic: bytes, role: int, rank: int, size: int, job_id: str,
               token: bytes, pid: int) -> int | str:
        """Check a hello: the connection's generation (-1: a control connection), or why it
        is refused."""
        if magic != MAGIC:
            return _MISMATCH
        if role not in (Role.MEMBER, Role.CONTROL):
            return f"unknown connection role {role}"
        # Refusals say what the hello claimed, never what the store expected.
        if size != self.size:
            return (f"PE {rank} thinks the job has {size} PEs, which is not the size of the "
                    f"job this store serves (do all PEs see the same job size?)")
        if not 0 <= rank < size:
            return f"rank {rank} is out of range for a job of {size} PEs"
        if len(job_id) > MAX_JOB_ID or job_id != self.job_id:
            return (f"job id mismatch: PE {rank} belongs to job {job_id[:64]!r}, which is not "
                    f"the job this store serves (a stale environment from another job?)")
        if role != Role.MEMBER:
            return -1
        with self._cond:
            if self._closed:
                return "the store is shutting down"
            got = self._members.admit(rank, token, pid)
            if isinstance(got, int):
                self._next[rank] = 0
                self._cond.notify_all()
                return got
        if got.failure:
            self._failed(rank, got.text)
        return got.text
