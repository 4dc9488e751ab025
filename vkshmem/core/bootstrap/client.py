"""One PE's connection to the bootstrap store (:class:`StoreClient`; the server is
:class:`vkshmem.core.bootstrap.store.StoreServer`).

Its hello names this process (pid and a random token, new in each forked child), so that the
store lets only the process that finalized a rank join again as that rank (re-initialisation,
OpenSHMEM 1.6; see :mod:`vkshmem.core.bootstrap.members`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import struct
import threading
import time

from ..auth import FD_VAR, FILE_VAR, MAC_SIZE, NONCE_SIZE, SECRET_VAR, derive_key, new_nonce, verify
from ..errors import BootstrapError
from .wire import (
    CONTROL_TIMEOUT,
    GRACE,
    HELLO,
    HELLO_TIMEOUT,
    I32,
    MAGIC,
    MAX_ANSWER,
    MAX_BLOB,
    MAX_HELLO,
    ROUND,
    TIMEOUT_VAR,
    U32,
    Msg,
    Role,
    client_proof,
    deadline_in,
    format_seconds,
    recv_frame,
    send_frame,
    sentence,
    server_proof,
    time_limit,
    unpack_blobs,
)

__all__ = ["StoreClient"]


_token = secrets.token_bytes(8)  # the "8s" of HELLO


def _new_token() -> None:
    global _token
    _token = secrets.token_bytes(len(_token))


os.register_at_fork(after_in_child=_new_token)

_RETRY_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT,
                 errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN}


class StoreClient:
    """One PE's connection to a :class:`StoreServer`.

    ``source`` names the variables that set ``host``/``port`` and ``hint`` says who should be
    serving; both go into error messages. ``timeout`` is the bootstrap timeout
    (``VKSHMEM_BOOTSTRAP_TIMEOUT``; 0 = no limit). Connecting retries while the connection is
    refused (the server may not be up yet) until the timeout. ``generation`` is the one the
    store gave this member connection: 0, then 1, 2, ... for each re-initialisation.
    ``secret`` is the job's secret (:mod:`vkshmem.core.auth`): the client proves it knows it,
    and connects only to a store that proves the same.
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
        secret: bytes = b"",
    ) -> None:
        self.host = host
        self.port = port
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.job_id = job_id
        self.source = source
        self.hint = hint
        self._limit = time_limit(timeout)
        self._key = derive_key(secret, "store")
        self._lock = threading.Lock()
        self._round = 0
        self.generation = 0
        self._sock: socket.socket | None = self._connect(role, self._limit)

    @property
    def where(self) -> str:
        """``host:port`` as a human reads it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    # -- connection -----------------------------------------------------------------------
    def _connect(self, role: Role, limit: float | None,
                 refused_is_final: bool = False) -> socket.socket:
        """Connect and authenticate as ``role``, retrying while the store is not up yet.
        ``refused_is_final``: a refused connection is not retried (the store answered before,
        so a refusal now means it is gone: rank 0 of an ``env`` job died)."""
        deadline = deadline_in(limit)
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
                if refused_is_final and exc.errno == errno.ECONNREFUSED:
                    retry = False
                remaining = None if deadline is None else deadline - time.monotonic()
                if retry and (remaining is None or remaining > 0):
                    time.sleep(delay if remaining is None else min(delay, remaining))
                    delay = min(delay * 2, 0.5)
                    continue
                waited = (f" for {format_seconds(limit)}" if retry and limit is not None
                          else "")
                hint = sentence(self.hint)
                raise BootstrapError(
                    f"PE {self.rank}: could not connect to the bootstrap store at {self.where} "
                    f"(set by {self.source}){waited}: {exc.strerror or exc}.{hint} "
                    f"{TIMEOUT_VAR} sets how long to wait.") from None
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello_limit = HELLO_TIMEOUT if limit is None else max(limit, 1.0)
                kind, payload = self._handshake(sock, role, deadline_in(hello_limit))
            except BaseException:
                sock.close()
                raise
            if kind == Msg.OK:
                if role == Role.MEMBER and len(payload) == U32.size:
                    (self.generation,) = U32.unpack(payload)
                return sock
            sock.close()
            raise BootstrapError(f"PE {self.rank}: the bootstrap store at {self.where} (set by "
                                 f"{self.source}) refused it: "
                                 f"{payload.decode('utf-8', 'replace')}")

    def _handshake(self, sock: socket.socket, role: Role,
                   deadline: float | None) -> tuple[int, bytes]:
        """Say hello, check the store's proof that it knows the secret, prove it back; the
        store's answer to the hello."""
        hello = HELLO.pack(MAGIC, int(role), self.rank, self.size, os.getpid() & 0xFFFFFFFF,
                           _token, new_nonce()) + self.job_id.encode()[:MAX_HELLO - HELLO.size]
        send_frame(sock, Msg.HELLO, hello)
        kind, payload = self._recv_on(sock, deadline, "its hello", MAX_ANSWER)
        if kind != Msg.CHALLENGE or len(payload) != NONCE_SIZE + MAC_SIZE:
            raise BootstrapError(f"PE {self.rank}: unexpected answer {kind} from the bootstrap "
                                 f"store at {self.where} (set by {self.source}) to its hello")
        nonce, proof = payload[:NONCE_SIZE], payload[NONCE_SIZE:]
        if not verify(server_proof(self._key, hello, nonce), proof):
            raise BootstrapError(
                f"PE {self.rank}: the bootstrap store at {self.where} (set by {self.source}) "
                f"could not prove that it knows this job's secret: it serves another job, or "
                f"the PEs were given different secrets ({SECRET_VAR}, {FILE_VAR}; under "
                f"'vkshmem run', {FD_VAR})")
        send_frame(sock, Msg.AUTH, client_proof(self._key, hello, nonce))
        return self._recv_on(sock, deadline, "its hello", MAX_ANSWER)

    def _recv_on(self, sock: socket.socket, deadline: float | None,
                 what: str, limit: int) -> tuple[int, bytes]:
        try:
            kind, payload = recv_frame(sock, deadline, limit)
        except TimeoutError:
            raise BootstrapError(
                f"PE {self.rank}: no answer from the bootstrap store at {self.where} (set by "
                f"{self.source}) to {what} in time; is something else listening there? "
                f"{TIMEOUT_VAR} sets how long to wait.") from None
        except (EOFError, OSError, ValueError, struct.error) as exc:
            hint = sentence(self.hint)
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
        if len(blob) > MAX_BLOB:
            raise BootstrapError(f"PE {self.rank}: a bootstrap allgather blob of {len(blob)} "
                                 f"bytes is larger than the store's limit of {MAX_BLOB}")
        with self._lock:
            sock = self._require()
            round_no = self._round
            self._round += 1
            limit_ms = 0 if self._limit is None else max(1, min(int(self._limit * 1000),
                                                                2**32 - 1))
            try:
                sock.settimeout(None if self._limit is None else self._limit + GRACE)
                send_frame(sock, Msg.ALLGATHER, ROUND.pack(round_no, limit_ms) + bytes(blob))
            except OSError as exc:
                raise BootstrapError(
                    f"PE {self.rank}: lost the connection to the bootstrap store at "
                    f"{self.where}: {exc}") from None
            deadline = None if self._limit is None else time.monotonic() + self._limit + GRACE
            kind, payload = self._recv_on(sock, deadline, f"allgather round {round_no}",
                                          U32.size + self.size * (8 + MAX_BLOB))
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
        limit = CONTROL_TIMEOUT if self._limit is None else min(self._limit, CONTROL_TIMEOUT)
        sock = self._connect(Role.CONTROL, limit, refused_is_final=True)
        try:
            sock.settimeout(limit)
            send_frame(sock, kind, payload)
            self._recv_on(sock, deadline_in(limit), kind.name.lower(), MAX_ANSWER)
            with contextlib.suppress(OSError):
                send_frame(sock, Msg.BYE)
        finally:
            sock.close()

    def report_failure(self, text: str) -> None:
        """Not collective: tell the server this PE is failing and why (on a new connection,
        so it works even while another thread waits in an allgather)."""
        self._control(Msg.FAILURE, text.encode("utf-8", "replace"))

    def abort(self, status: int) -> None:
        """Not collective: ask for the whole job to end with ``status``."""
        status = max(-(2**31), min(int(status), 2**31 - 1))
        self._control(Msg.ABORT, I32.pack(status))

    def close(self) -> None:
        """Say goodbye and close the connection. Safe to call twice.

        Waits (a few seconds at most) for the server to close its side, which it does once it
        has recorded the goodbye: this process may then connect again at once, as the next
        generation (``shmem.init`` after the last ``shmem.finalize``)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        limit = CONTROL_TIMEOUT if self._limit is None else min(self._limit, CONTROL_TIMEOUT)
        deadline = time.monotonic() + limit
        try:
            send_frame(sock, Msg.BYE)
            sock.shutdown(socket.SHUT_WR)
            while (remaining := deadline - time.monotonic()) > 0:
                sock.settimeout(remaining)
                if not sock.recv(4096):
                    break
        except OSError:  # the server is gone, or the wait ran out: nothing more to do
            pass
        finally:
            sock.close()
