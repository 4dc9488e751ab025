"""Failure detection: the liveness channel between the PEs of a job.

When a PE dies (SIGKILL, out of memory, a crash, an uncaught exception), every other PE's
blocking call (barrier, wait_until, lock, collective, and RMA or AMOs addressed to the dead PE)
raises :class:`~vkshmem.core.errors.PeerFailedError` naming it and why, instead of waiting for
ever. It works the same under every bootstrap (``vkshmem run``, ``env``, ``mpirun``), because it
needs nothing from the launcher:

* At start-up (collective, after the first exchange) PE 0 opens a small TCP *hub*
  (:mod:`vkshmem.core.liveness.hub`) on loopback when every PE shares its host, else on the
  address its bootstrap reports, and every other PE connects to it through a
  challenge-response with a random key that travelled over the bootstrap (no secret on the
  wire). A connection is held until ``finalize``, which says goodbye on it.
* A PE whose process ends without that goodbye is noticed by the hub at once (the kernel
  closes its socket), a PE that fails with an exception reports why first; the hub tells every
  other PE, and a PE that loses the hub itself (PE 0 died) knows PE 0 failed. TCP keepalive,
  tuned to ``VKSHMEM_FAILURE_TIMEOUT``, bounds how long a silent host (power loss, a cut
  network) takes to be noticed; keepalive runs in the kernel, so a PE busy in long native code
  is never taken for dead.
* What a PE learnt sits in :attr:`Liveness.words` (a word per PE plus a "first failed PE + 1"
  word) that the waits read: the Python waits every time they wake, the compiled waits of
  :mod:`vkshmem.core.fast` once per millisecond slice, the compiled RMA/AMO paths on each call
  (one load, then they let the Python path raise). Nothing is checked while no PE failed.

``VKSHMEM_FAILURE_TIMEOUT=0`` turns the channel off (no hub, no thread).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Sequence

from .._native import ffi
from ..bootstrap.base import Bootstrap
from ..errors import BootstrapError, PeerFailedError, TransportError
from .hub import HUB_DROPPED, SILENT, Frames, Hub, Kind, keepalive

__all__ = ["Liveness", "open_liveness"]

#: how long a transport error may wait for the hub's verdict on its peer
_CONFIRM = 2.0
#: the open channels of this process (a forked child drops its copies of their sockets)
_OPEN: weakref.WeakSet[Liveness] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A child forked by a PE must not hold the PE's liveness sockets open: the PE's death
    would then go unnoticed while the child lives."""
    for lv in list(_OPEN):
        lv._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)



def _listening(host: str, port: int) -> bool:
    """Whether something still accepts connections at host:port (a closed hub refuses)."""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True

class Liveness:
    """What this PE knows of the others' liveness, and its connection to the hub.

    ``words``: ``words[0]`` is 0 while no PE is known to have failed, else the first failed
    PE + 1; ``words[1 + pe]`` is 1 once ``pe`` is known to have failed. ``any`` mirrors
    ``words[0] != 0`` for Python readers.
    """

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.words = ffi.new("uint64_t[]", size + 1)
        self.address = int(ffi.cast("uintptr_t", self.words))
        self.any = False
        self.failures: dict[int, str] = {}
        self._lock = threading.Condition()
        self._hub: Hub | None = None
        self._sock: socket.socket | None = None
        self._frames: Frames | None = None
        self._thread: threading.Thread | None = None
        self._closing = False  # a clean end: EOF from the hub is no failure
        self._reported = False
        self._timeout_hint = _CONFIRM  # VKSHMEM_FAILURE_TIMEOUT, once started

    # -- what is known ------------------------------------------------------------------------
    def mark(self, pe: int, reason: str) -> None:
        """Record that ``pe`` failed (from any thread; the first reason of a PE is kept)."""
        with self._lock:
            if pe in self.failures or pe == self.rank or not 0 <= pe < self.size:
                return
            self.failures[pe] = reason
            self.words[1 + pe] = 1
            if not self.words[0]:
                self.words[0] = pe + 1
            self.any = True
            self._lock.notify_all()

    def first(self) -> tuple[int, str]:
        """The first failed PE and its reason (only when ``any``)."""
        pe = int(self.words[0]) - 1
        return pe, self.failures.get(pe, "failed")

    def error(self, what: str = "", pe: int | None = None) -> PeerFailedError:
        """The error of a call (``what``) that cannot complete: names ``pe`` if it failed,
        else the first PE that did."""
        if pe is None or pe not in self.failures:
            pe, reason = self.first()
        else:
            reason = self.failures[pe]
        return PeerFailedError(pe, reason, what)

    def check(self, pe: int, what: str = "") -> None:
        """Raise PeerFailedError if ``pe`` is known to have failed (cheap while none did)."""
        if self.any and pe in self.failures:
            raise self.error(what, pe)

    def translate(self, exc: BaseException, pe: int | None = None) -> BaseException:
        """``exc`` (a transport's error) as a PeerFailedError when it happened because a PE
        failed: one is known to have failed, or the hub confirms that ``pe`` did (asked only
        on this error path, for at most a few seconds). Otherwise ``exc`` itself."""
        if not isinstance(exc, TransportError) or isinstance(exc, PeerFailedError):
            return exc
        if not self.any and pe is not None and pe != self.rank:
            self.confirm(pe, min(_CONFIRM, self._timeout_hint))
        if not self.any:
            return exc
        err = self.error(str(exc).split(":")[0], pe)
        err.__cause__ = exc
        return err

    # -- start ------------------------------------------------------------------------------
    def _start(self, boot: Bootstrap, node_ids: Sequence[str], timeout: float,
               connect_timeout: float) -> None:
        """Collective: PE 0 opens the hub, the others connect to it."""
        self._timeout_hint = timeout
        blob = b""
        if self.rank == 0:
            one_host = len(set(node_ids)) == 1
            host = "127.0.0.1" if one_host else boot.host_address()
            key = secrets.token_bytes(32)
            self._hub = Hub(self.size, host, key, self.mark, timeout)
            _OPEN.add(self)
            h, port = self._hub.address
            blob = json.dumps({"host": h, "port": port, "key": key.hex()}).encode()
        try:
            blobs = boot.allgather(blob)
        except BaseException:
            self.close(clean=False)
            raise
        if self.rank == 0:
            assert self._hub is not None
            self._hub.start()
            return
        info = json.loads(blobs[0])
        self._connect(info["host"], int(info["port"]), bytes.fromhex(info["key"]), timeout,
                      connect_timeout)

    def _connect(self, host: str, port: int, key: bytes, timeout: float,
                 connect_timeout: float) -> None:
        limit = connect_timeout if connect_timeout > 0 else 60.0
        try:
            sock = socket.create_connection((host, port), timeout=limit)
        except ConnectionRefusedError:  # the hub was listening at the all-gather: PE 0 ended
            raise self._hub_gone(host, port, "refused the connection") from None
        except OSError as exc:
            raise BootstrapError(f"PE {self.rank}: cannot reach PE 0's liveness hub at "
                                 f"{host}:{port}: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive(sock, timeout)
            frames = Frames(sock)
            deadline = time.monotonic() + limit
            kind, nonce = frames.recv(deadline)
            if kind != Kind.CHALLENGE:
                raise BootstrapError("unexpected first message")
            mac = hmac.new(key, nonce + self.rank.to_bytes(4, "big"), hashlib.sha256).digest()
            frames.send(Kind.HELLO, self.rank.to_bytes(4, "big") + mac)
            kind, _ = frames.recv(deadline)
            if kind != Kind.WELCOME:
                raise BootstrapError("refused")
            sock.settimeout(None)
        except (ConnectionError, EOFError) as exc:
            sock.close()
            if not _listening(host, port):  # PE 0 ended while this PE connected
                raise self._hub_gone(host, port, f"closed the connection ({exc})") from None
            raise BootstrapError(f"PE {self.rank}: the liveness hub at {host}:{port} did not "
                                 f"accept this PE: {exc}") from None
        except (OSError, ValueError, BootstrapError) as exc:
            sock.close()
            raise BootstrapError(f"PE {self.rank}: the liveness hub at {host}:{port} did not "
                                 f"accept this PE: {exc}") from None
        self._sock, self._frames = sock, frames
        _OPEN.add(self)
        self._thread = threading.Thread(target=self._listen, name="vkshmem-liveness",
                                        daemon=True)
        self._thread.start()

    def _hub_gone(self, host: str, port: int, how: str) -> PeerFailedError:
        """PE 0's hub, which was up when its address was all-gathered, went away during this
        PE's handshake: PE 0 ended during start-up (the launcher then names PE 0's own error,
        not this PE's view of it)."""
        return PeerFailedError(0, f"its liveness hub at {host}:{port} {how} during start-up",
                               f"PE {self.rank} joining failure detection")

    def _listen(self) -> None:
        """The monitor thread of a PE other than 0: news from the hub."""
        frames = self._frames
        assert frames is not None
        why = HUB_DROPPED
        try:
            while True:
                kind, payload = frames.recv(None)
                if kind == Kind.FAILED:
                    pe = int.from_bytes(payload[:4], "big")
                    self.mark(pe, payload[4:].decode("utf-8", "replace"))
                elif kind == Kind.CLOSING:
                    self._closing = True
        except OSError as exc:
            if isinstance(exc, TimeoutError) or exc.errno == errno.ETIMEDOUT:
                why = SILENT
        except (EOFError, ValueError):
            pass
        if not self._closing:
            self.mark(0, why)

    # -- this PE's own news -------------------------------------------------------------------
    def report(self, text: str, linger: float = 0.0) -> None:
        """Not collective: this PE is failing because of ``text``; tell the others (best
        effort, never raises). ``linger``: then wait that long, for a bootstrap whose failure
        report ends every PE at once (``mpi``), so the others can raise first."""
        if self._reported:
            return
        self._reported = True
        with contextlib.suppress(Exception):
            if self._hub is not None:
                self._hub.fail(self.rank, text)
            elif self._frames is not None:
                self._frames.send(Kind.FAIL, text.encode("utf-8", "replace")[:2000])
        if linger > 0 and self.size > 1:
            time.sleep(linger)

    def confirm(self, pe: int, limit: float) -> bool:
        """Whether ``pe`` has failed, waiting up to ``limit`` seconds for the news (a transport
        may see a peer's connection reset a moment before its liveness connection closes):
        the hub looks at ``pe``'s connection now (asked with a query), and tells every PE if
        it is gone. True once ``pe`` is known to have failed."""
        deadline = time.monotonic() + limit
        if self._hub is not None:
            while not self._hub.probe(pe):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
            return True
        if self._frames is None:
            return False
        with contextlib.suppress(OSError):
            self._frames.send(Kind.QUERY, pe.to_bytes(4, "big"))
        with self._lock:
            while pe not in self.failures:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    # -- end ----------------------------------------------------------------------------------
    def _forget(self) -> None:
        """In a forked child: close this process's copies of the sockets, tell nobody."""
        self._closing = True
        hub, self._hub = self._hub, None
        if hub is not None:
            hub.forget()
        sock, self._sock, self._frames = self._sock, None, None
        if sock is not None:
            sock.close()

    def close(self, clean: bool) -> None:
        """End the channel. ``clean`` (a finalize every PE makes): say goodbye; PE 0 waits
        briefly for the others' goodbyes before closing the hub. Safe to call twice."""
        self._closing = True
        hub, self._hub = self._hub, None
        if hub is not None:
            hub.close(wait=2.0 if clean and not self.any else 0.0, clean=clean)
        sock, self._sock = self._sock, None
        if sock is not None:
            if clean and not self._reported and self._frames is not None:
                with contextlib.suppress(OSError):
                    self._frames.send(Kind.BYE, b"")
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(2.0)
            sock.close()


def open_liveness(boot: Bootstrap, node_ids: Sequence[str], timeout: float,
                  connect_timeout: float) -> Liveness:
    """Collective: the liveness channel of a job (inert, never reporting a failure, with one
    PE or when ``timeout`` is 0: ``VKSHMEM_FAILURE_TIMEOUT=0``). ``connect_timeout``: the
    bootstrap timeout."""
    lv = Liveness(boot.rank, boot.size)
    if boot.size > 1 and timeout > 0:
        lv._start(boot, node_ids, timeout, connect_timeout)
    return lv

