"""The liveness hub that PE 0 hosts, and the wire format of the liveness channel (see
:mod:`vkshmem.core.liveness.channel` for the design).

Frames are a header ``!BH`` (kind, payload length, at most :data:`MAX_PAYLOAD`) and the
payload. The hub greets a connection with ``CHALLENGE`` (16 random bytes); the PE answers
``HELLO`` (its rank, then HMAC-SHA256 over the challenge and its rank, keyed with the job's
liveness key); the hub answers ``WELCOME`` or closes the connection. Then: ``FAIL`` (text: this
PE is failing), ``BYE`` (a clean finalize), ``QUERY`` (a PE: look at its connection now) from
a PE; ``FAILED`` (PE, reason) and ``CLOSING`` (PE 0 finalizes) from the hub. A connection
that has not said hello within :data:`HELLO_LIMIT` seconds, a malformed frame and a failed
check all end the connection; at most ``2 * size + 8`` connections are served at once.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import secrets
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from enum import IntEnum

__all__ = ["DROPPED", "HUB_DROPPED", "MAX_PAYLOAD", "Frames", "Hub", "Kind", "keepalive"]

HEADER = struct.Struct("!BH")
MAX_PAYLOAD = 4096
HELLO_LIMIT = 10.0
DROPPED = ("its process ended without finalizing (killed by a signal, out of memory, crashed "
           "or exited; its liveness connection closed)")
HUB_DROPPED = ("its process ended without finalizing (killed by a signal, out of memory, "
               "crashed or exited; the liveness hub it hosts closed)")
SILENT = ("no sign of life from its host for VKSHMEM_FAILURE_TIMEOUT seconds (host down or "
          "network cut)")


class Kind(IntEnum):
    """Frame kinds of the liveness channel."""

    CHALLENGE = 1
    HELLO = 2
    WELCOME = 3
    FAIL = 4
    BYE = 5
    FAILED = 6
    QUERY = 7
    CLOSING = 9


def keepalive(sock: socket.socket, timeout: float) -> None:
    """TCP keepalive so that a silent peer host is noticed within about ``timeout`` s."""
    opts = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", max(1, int(timeout / 2))),
                        ("TCP_KEEPINTVL", max(1, int(timeout / 6))), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", max(1000, int(timeout * 1000)))):
        if hasattr(socket, name):
            opts.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in opts:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, opt, value)


class Frames:
    """Framing on one socket: blocking :meth:`recv`, or :meth:`feed` of received bytes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self._send_lock = threading.Lock()

    def send(self, kind: Kind, payload: bytes) -> None:
        """Send one frame (payloads longer than MAX_PAYLOAD are cut)."""
        payload = payload[:MAX_PAYLOAD]
        with self._send_lock:
            self.sock.sendall(HEADER.pack(int(kind), len(payload)) + payload)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add received bytes; the complete frames they end. ValueError: malformed."""
        self.buf += data
        out = []
        while len(self.buf) >= HEADER.size:
            kind, n = HEADER.unpack_from(self.buf)
            if n > MAX_PAYLOAD or kind not in Kind._value2member_map_:
                raise ValueError("malformed liveness frame")
            if len(self.buf) < HEADER.size + n:
                break
            out.append((kind, bytes(self.buf[HEADER.size:HEADER.size + n])))
            del self.buf[:HEADER.size + n]
        return out

    def recv(self, deadline: float | None) -> tuple[int, bytes]:
        """The next frame, by ``deadline`` (``time.monotonic``; None: no limit)."""
        while True:
            got = self.feed(b"")
            if got:
                kind, payload = got[0]
                self.buf[:0] = b"".join(HEADER.pack(k, len(p)) + p for k, p in got[1:])
                return kind, payload
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no answer in time")
                self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("connection closed")
            self.buf += data


class _Peer:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = Frames(sock)
        self.nonce = secrets.token_bytes(16)
        self.since = time.monotonic()
        self.rank = -1
        self.bye = False


class Hub:
    """PE 0's end of the liveness channel: one connection per other PE.

    ``on_failed(pe, reason)`` is called (from the hub's thread, or from the caller of
    :meth:`fail`) once per failed PE other than 0."""

    def __init__(self, size: int, host: str, key: bytes,
                 on_failed: Callable[[int, str], None], timeout: float) -> None:
        self.size = size
        self.key = key
        self.on_failed = on_failed
        self.timeout = timeout
        self.failed: dict[int, str] = {}
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.bind((host, 0))
            self._listener.listen(2 * size + 8)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._lock = threading.Condition(threading.RLock())
        self._peers: dict[socket.socket, _Peer] = {}
        self._by_rank: dict[int, _Peer] = {}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="vkshmem-liveness-hub",
                                        daemon=True)
        self._thread.start()

    # -- news -------------------------------------------------------------------------------
    def fail(self, rank: int, reason: str) -> None:
        """PE ``rank`` failed: tell every other connected PE (and ``on_failed``)."""
        with self._lock:
            if rank in self.failed or self._closed:
                return
            self.failed[rank] = reason
            payload = rank.to_bytes(4, "big") + reason.encode("utf-8", "replace")
            for peer in list(self._by_rank.values()):
                if peer.rank != rank:
                    with contextlib.suppress(OSError):
                        peer.frames.send(Kind.FAILED, payload)
            self._lock.notify_all()
        if rank != 0:
            with contextlib.suppress(Exception):
                self.on_failed(rank, reason)

    def probe(self, pe: int) -> bool:
        """Whether ``pe`` has failed, looking at its connection now (an end of file that
        the hub's thread has not read yet counts)."""
        with self._lock:
            peer = self._by_rank.get(pe)
            if pe not in self.failed and peer is not None:
                try:
                    readable = select.select([peer.sock], [], [], 0)[0]
                    if readable and peer.sock.recv(1, socket.MSG_PEEK) == b"":
                        self._drop(peer, DROPPED)
                except (BlockingIOError, TimeoutError):
                    pass
                except OSError:
                    self._drop(peer, DROPPED)
            return pe in self.failed

    # -- serving ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            try:
                events = self._sel.select(1.0)
            except OSError:
                return
            with self._lock:
                if self._closed:
                    return
                for key, _ in events:
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        peer = self._peers.get(key.fileobj)  # type: ignore[call-overload]
                        if peer is not None:
                            self._read(peer)
                now = time.monotonic()
                for peer in [p for p in self._peers.values() if p.rank < 0]:
                    if now - peer.since > HELLO_LIMIT:
                        self._drop(peer, "")

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        if len(self._peers) >= 2 * self.size + 8:
            sock.close()
            return
        sock.settimeout(1.0)  # sends are tiny; a reader too slow to take them is dropped
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        keepalive(sock, self.timeout)
        peer = _Peer(sock)
        self._peers[sock] = peer
        self._sel.register(sock, selectors.EVENT_READ, None)
        try:
            peer.frames.send(Kind.CHALLENGE, peer.nonce)
        except OSError:
            self._drop(peer, "")

    def _read(self, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(65536)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(peer, SILENT if exc.errno == errno.ETIMEDOUT else DROPPED)
            return
        if not data:
            self._drop(peer, DROPPED)
            return
        try:
            for kind, payload in peer.frames.feed(data):
                self._handle(peer, kind, payload)
        except (ValueError, OSError):
            self._drop(peer, DROPPED)

    def _handle(self, peer: _Peer, kind: int, payload: bytes) -> None:
        if peer.rank < 0:
            if kind != Kind.HELLO or len(payload) != 36:
                raise ValueError("expected a hello")
            rank = int.from_bytes(payload[:4], "big")
            want = hmac.new(self.key, peer.nonce + payload[:4], hashlib.sha256).digest()
            if (not hmac.compare_digest(want, payload[4:]) or not 0 < rank < self.size
                    or rank in self._by_rank or rank in self.failed):
                raise ValueError("hello refused")
            peer.rank = rank
            self._by_rank[rank] = peer
            peer.frames.send(Kind.WELCOME, b"")
            for pe, reason in self.failed.items():  # news it missed while connecting
                peer.frames.send(Kind.FAILED, pe.to_bytes(4, "big") + reason.encode())
        elif kind == Kind.FAIL:
            self.fail(peer.rank, payload.decode("utf-8", "replace"))
            peer.bye = True  # its end is now expected
        elif kind == Kind.BYE:
            peer.bye = True
            self._lock.notify_all()
        elif kind == Kind.QUERY and len(payload) == 4:
            self.probe(int.from_bytes(payload, "big"))  # a failure found goes to everyone
        else:
            raise ValueError("unexpected frame")

    def _drop(self, peer: _Peer, reason: str) -> None:
        """End a connection; a member's end without a goodbye is its failure."""
        self._peers.pop(peer.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(peer.sock)
        with contextlib.suppress(OSError):
            peer.sock.close()
        if peer.rank >= 0 and self._by_rank.get(peer.rank) is peer:
            del self._by_rank[peer.rank]
            if not peer.bye and reason:
                self.fail(peer.rank, reason)
            self._lock.notify_all()

    # -- end --------------------------------------------------------------------------------
    def forget(self) -> None:
        """In a forked child (no hub thread there): close the child's copies of every socket
        without a word to anyone."""
        self._closed = True
        for s in [*self._peers, self._listener, self._wake_r, self._wake_w]:
            with contextlib.suppress(OSError):
                s.close()
        with contextlib.suppress(OSError):
            self._sel.close()

    def close(self, wait: float, clean: bool) -> None:
        """Stop serving: first wait up to ``wait`` seconds for every PE's goodbye, then, if
        ``clean`` (PE 0 finalizes), tell those still connected that the hub closes cleanly
        (else they take its end for PE 0's failure). Safe to call twice."""
        deadline = time.monotonic() + wait
        with self._lock:
            while (any(not p.bye for p in self._by_rank.values())
                   and (left := deadline - time.monotonic()) > 0):
                self._lock.wait(left)
            if self._closed:
                return
            self._closed = True
            for peer in list(self._peers.values()) if clean else []:
                with contextlib.suppress(OSError):
                    peer.frames.send(Kind.CLOSING, b"")
        with contextlib.suppress(OSError):
            self._wake_w.send(b"!")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        with self._lock:
            for peer in list(self._peers.values()):
                with contextlib.suppress(OSError):
                    peer.sock.close()
            self._peers.clear()
            self._by_rank.clear()
        self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
