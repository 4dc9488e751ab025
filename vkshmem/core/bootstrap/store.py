"""A small TCP rendezvous service (the "store") that the ``local`` and ``env`` bootstraps use.

One :class:`StoreServer` serves one job of ``size`` PEs; every PE holds one
:class:`StoreClient` connection to it. The server is hosted by the launcher (``vkshmem run``,
bootstrap ``local``) or by rank 0 (bootstrap ``env``).

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

Wire format
-----------
Every message is a frame: a header ``!BQ`` (message kind, payload length) and the payload. No
pickle: payloads are raw bytes, UTF-8 text or ``struct``-packed integers. A connection starts
with ``HELLO`` (magic, role, rank, size, job id); the server answers ``OK`` or ``ERROR``. Each
request gets exactly one answer: ``OK``, ``RESULT`` (a list of blobs: count, then length +
bytes for each) or ``ERROR`` (UTF-8 text, raised as :class:`BootstrapError` by the client).

Every blocking wait has a time limit (the bootstrap timeout, ``VKSHMEM_BOOTSTRAP_TIMEOUT``;
``0`` means no limit). The server enforces the limit of an allgather itself, so the error can
say which PEs are missing.
"""

from __future__ import annotations

import contextlib
import errno
import math
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from enum import IntEnum

from ..errors import BootstrapError

__all__ = [
    "TIMEOUT_VAR",
    "StoreClient",
    "StoreServer",
    "format_seconds",
    "pack_blobs",
    "unpack_blobs",
]

TIMEOUT_VAR = "VKSHMEM_BOOTSTRAP_TIMEOUT"
MAGIC = b"VKS\x01"
_HEADER = struct.Struct("!BQ")
_HELLO = struct.Struct("!4sBII")  # magic, role, rank, size; the job id follows
_ROUND = struct.Struct("!QI")  # round number, time limit in ms (0: none); the blob follows
_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")
#: Largest frame a peer may send (guards against a stray client speaking another protocol).
MAX_FRAME = 1 << 36
#: How long a new connection may take to say hello.
_HELLO_TIMEOUT = 10.0
#: Extra time a client waits for the server's answer beyond the limit the server enforces.
_GRACE = 5.0
#: Time limit of a failure report or abort request (best effort, must not hang a dying PE).
_CONTROL_TIMEOUT = 5.0


class Msg(IntEnum):
    """Message kinds."""

    HELLO = 1
    ALLGATHER = 2
    FAILURE = 3
    ABORT = 4
    BYE = 5
    OK = 16
    RESULT = 17
    ERROR = 18


class Role(IntEnum):
    """What a connection is for: a PE's member connection, or a one-shot control message."""

    MEMBER = 0
    CONTROL = 1


def format_seconds(seconds: float) -> str:
    """``60`` -> ``'60 s'``, ``0.25`` -> ``'0.25 s'``."""
    return f"{seconds:g} s"


def pack_blobs(blobs: Iterable[bytes]) -> bytes:
    """Encode a list of blobs: a count, then each blob's length and bytes."""
    items = list(blobs)
    parts = [_U32.pack(len(items))]
    for blob in items:
        parts.append(struct.pack("!Q", len(blob)))
        parts.append(bytes(blob))
    return b"".join(parts)


def unpack_blobs(data: bytes) -> list[bytes]:
    """Decode what :func:`pack_blobs` produced."""
    view = memoryview(data)
    (count,) = _U32.unpack_from(view, 0)
    pos = _U32.size
    out: list[bytes] = []
    for _ in range(count):
        (length,) = struct.unpack_from("!Q", view, pos)
        pos += 8
        if pos + length > len(view):
            raise ValueError("truncated blob list")
        out.append(bytes(view[pos:pos + length]))
        pos += length
    if pos != len(view):
        raise ValueError("trailing bytes after blob list")
    return out


def _send(sock: socket.socket, kind: Msg, payload: bytes = b"") -> None:
    header = _HEADER.pack(int(kind), len(payload))
    if len(payload) < 65536:
        sock.sendall(header + payload)
    else:  # avoid copying a large blob
        sock.sendall(header)
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
        else:
            sock.settimeout(None)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("connection closed" + (" mid-message" if buf else ""))
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, deadline: float | None) -> tuple[int, bytes]:
    kind, length = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes is too large (not a vkshmem store peer?)")
    return kind, _recv_exact(sock, length, deadline) if length else b""


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _limit(timeout: float) -> float | None:
    """The bootstrap timeout as a limit: ``0`` (or less, or inf) means none."""
    return None if timeout <= 0 or math.isinf(timeout) else float(timeout)


def _sentence(text: str) -> str:
    """`` text.`` (with a full stop unless it ends with punctuation), or ``''``."""
    text = text.strip()
    if not text:
        return ""
    return f" {text}" if text[-1] in ".?!" else f" {text}."


def _ranks(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


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
        deadline = _deadline(timeout)
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
                kind, payload = _recv(conn, _deadline(_HELLO_TIMEOUT))
            except (OSError, EOFError, TimeoutError, ValueError, struct.error):
                return
            if kind != Msg.HELLO or len(payload) < _HELLO.size:
                return  # not one of ours: drop it silently
            magic, role_v, rank, size = _HELLO.unpack_from(payload)
            job_id = payload[_HELLO.size:].decode("utf-8", "replace")
            problem = self._hello(magic, role_v, rank, size, job_id)
            if problem:
                _send(conn, Msg.ERROR, problem.encode())
                rank = -1
                return
            role = Role(role_v)
            _send(conn, Msg.OK)
            while True:
                try:
                    kind, payload = _recv(conn, None)
                except (OSError, EOFError, ValueError, struct.error):
                    return
                if kind == Msg.BYE:
                    said_bye = True
                    return
                answer = self._handle(rank, kind, payload)
                _send(conn, *answer)
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
            if len(payload) < _ROUND.size:
                return Msg.ERROR, b"malformed allgather request"
            round_no, limit_ms = _ROUND.unpack_from(payload)
            return self._allgather(rank, round_no, limit_ms / 1000.0,
                                   payload[_ROUND.size:])
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
            if len(payload) != _I32.size:
                return Msg.ERROR, b"malformed abort request"
            (status,) = _I32.unpack(payload)
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
            notes.append(f"never connected: {_ranks(never)}")
        left = [r for r in missing if r in self._gone]
        if left:
            notes.append("left: " + "; ".join(f"PE {r}: {self._gone[r]}" for r in left))
        detail = f" ({'; '.join(notes)})" if notes else ""
        return (f"allgather round {round_no} timed out after {format_seconds(limit)} waiting "
                f"for PEs {_ranks(missing)}{detail}; {len(rnd.blobs)} of {self.size} PEs "
                f"arrived. {TIMEOUT_VAR} sets this limit: raise it if they are only slow, "
                f"otherwise find out why they stopped (every PE must make the same collective "
                f"calls in the same order)")


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------

_RETRY_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT,
                 errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN}


class StoreClient:
    """One PE's connection to a :class:`StoreServer`.

    ``source`` names the variables that set ``host``/``port`` and ``hint`` says who should be
    serving; both go into error messages. ``timeout`` is the bootstrap timeout
    (``VKSHMEM_BOOTSTRAP_TIMEOUT``; 0 = no limit). Connecting retries while the connection is
    refused (the server may not be up yet) until the timeout.
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        size: int,
        *,
        timeout: float,
        job_id: str = "",
        source: str = "VKSHMEM_LAUNCHER",
        hint: str = "",
        role: Role = Role.MEMBER,
    ) -> None:
        self.host = host
        self.port = port
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.job_id = job_id
        self.source = source
        self.hint = hint
        self._limit = _limit(timeout)
        self._lock = threading.Lock()
        self._round = 0
        self._sock: socket.socket | None = self._connect(role, self._limit)

    @property
    def where(self) -> str:
        """``host:port`` as a human reads it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    # -- connection -----------------------------------------------------------------------
    def _connect(self, role: Role, limit: float | None) -> socket.socket:
        deadline = _deadline(limit)
        delay = 0.02
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            try:
                sock = socket.create_connection(
                    (self.host, self.port),
                    timeout=5.0 if remaining is None else max(0.05, min(5.0, remaining)))
            except socket.gaierror as exc:
                raise BootstrapError(
                    f"cannot resolve the bootstrap store's host {self.host!r} (set by "
                    f"{self.source}): {exc}") from None
            except OSError as exc:
                retry = isinstance(exc, TimeoutError) or exc.errno in _RETRY_ERRNOS
                remaining = None if deadline is None else deadline - time.monotonic()
                if retry and (remaining is None or remaining > 0):
                    time.sleep(delay if remaining is None else min(delay, remaining))
                    delay = min(delay * 2, 0.5)
                    continue
                waited = (f" for {format_seconds(limit)}" if retry and limit is not None
                          else "")
                hint = _sentence(self.hint)
                raise BootstrapError(
                    f"PE {self.rank}: could not connect to the bootstrap store at {self.where} "
                    f"(set by {self.source}){waited}: {exc.strerror or exc}.{hint} "
                    f"{TIMEOUT_VAR} sets how long to wait.") from None
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = _HELLO.pack(MAGIC, int(role), self.rank, self.size)
                _send(sock, Msg.HELLO, hello + self.job_id.encode())
                hello_limit = _HELLO_TIMEOUT if limit is None else max(limit, 1.0)
                kind, payload = self._recv_on(sock, _deadline(hello_limit), "its hello")
            except BaseException:
                sock.close()
                raise
            if kind == Msg.OK:
                return sock
            sock.close()
            raise BootstrapError(f"PE {self.rank}: the bootstrap store at {self.where} (set by "
                                 f"{self.source}) refused it: "
                                 f"{payload.decode('utf-8', 'replace')}")

    def _recv_on(self, sock: socket.socket, deadline: float | None,
                 what: str) -> tuple[int, bytes]:
        try:
            kind, payload = _recv(sock, deadline)
        except TimeoutError:
            raise BootstrapError(
                f"PE {self.rank}: no answer from the bootstrap store at {self.where} (set by "
                f"{self.source}) to {what} in time; is something else listening there? "
                f"{TIMEOUT_VAR} sets how long to wait.") from None
        except (EOFError, OSError, ValueError, struct.error) as exc:
            hint = _sentence(self.hint)
            raise BootstrapError(
                f"PE {self.rank}: lost the connection to the bootstrap store at {self.where} "
                f"while waiting for {what}: {exc}.{hint}") from None
        if kind == Msg.ERROR:
            raise BootstrapError(f"PE {self.rank}: bootstrap store at {self.where}: "
                                 f"{payload.decode('utf-8', 'replace')}")
        return kind, payload

    def local_address(self) -> str:
        """The local IP address of this client's connection to the store (``getsockname``)."""
        sock = self._require()
        return str(sock.getsockname()[0])

    def _require(self) -> socket.socket:
        if self._sock is None:
            raise BootstrapError(f"PE {self.rank}: the bootstrap connection is closed")
        return self._sock

    # -- collectives ----------------------------------------------------------------------
    def allgather(self, blob: bytes) -> list[bytes]:
        """Collective: contribute ``blob``; get every PE's blob, indexed by rank."""
        with self._lock:
            sock = self._require()
            round_no = self._round
            self._round += 1
            limit_ms = 0 if self._limit is None else max(1, min(int(self._limit * 1000),
                                                                2**32 - 1))
            try:
                sock.settimeout(None if self._limit is None else self._limit + _GRACE)
                _send(sock, Msg.ALLGATHER, _ROUND.pack(round_no, limit_ms) + bytes(blob))
            except OSError as exc:
                raise BootstrapError(
                    f"PE {self.rank}: lost the connection to the bootstrap store at "
                    f"{self.where}: {exc}") from None
            deadline = None if self._limit is None else time.monotonic() + self._limit + _GRACE
            kind, payload = self._recv_on(sock, deadline, f"allgather round {round_no}")
            if kind != Msg.RESULT:
                raise BootstrapError(f"PE {self.rank}: unexpected answer {kind} from the "
                                     f"bootstrap store at {self.where}")
        blobs = unpack_blobs(payload)
        if len(blobs) != self.size:
            raise BootstrapError(f"PE {self.rank}: allgather returned {len(blobs)} blobs for a "
                                 f"job of {self.size} PEs")
        return blobs

    def barrier(self) -> None:
        """Collective: return when every PE has called it."""
        self.allgather(b"")

    # -- control messages -----------------------------------------------------------------
    def _control(self, kind: Msg, payload: bytes) -> None:
        limit = _CONTROL_TIMEOUT if self._limit is None else min(self._limit, _CONTROL_TIMEOUT)
        sock = self._connect(Role.CONTROL, limit)
        try:
            sock.settimeout(limit)
            _send(sock, kind, payload)
            self._recv_on(sock, _deadline(limit), kind.name.lower())
            with contextlib.suppress(OSError):
                _send(sock, Msg.BYE)
        finally:
            sock.close()

    def report_failure(self, text: str) -> None:
        """Not collective: tell the server this PE is failing and why (on a new connection,
        so it works even while another thread waits in an allgather)."""
        self._control(Msg.FAILURE, text.encode("utf-8", "replace"))

    def abort(self, status: int) -> None:
        """Not collective: ask for the whole job to end with ``status``."""
        status = max(-(2**31), min(int(status), 2**31 - 1))
        self._control(Msg.ABORT, _I32.pack(status))

    def close(self) -> None:
        """Say goodbye and close the connection. Safe to call twice."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            _send(sock, Msg.BYE)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
