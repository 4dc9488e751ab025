"""The wire format of the bootstrap store (:mod:`vkshmem.core.bootstrap.store`).

Every message is a frame: a header ``!BQ`` (message kind, payload length) and the payload. No
pickle: payloads are raw bytes, UTF-8 text or ``struct``-packed integers. A connection starts
with ``HELLO`` (magic, role, rank, size, the process's pid and random token, a random nonce,
job id); the server answers ``CHALLENGE`` (its nonce and its MAC over the hello and that nonce,
proving it knows the job's secret), the client ``AUTH`` (its MAC over the same, see
:mod:`vkshmem.core.auth`), and only then does the server look at what the hello claims and
answer ``OK`` (with the connection's generation, see :mod:`vkshmem.core.bootstrap.members`) or
``ERROR``. A refusal never quotes what the store expected. A member connection ends with
``BYE``, after which the server closes it once it has recorded the goodbye. Each request gets
exactly one answer: ``OK``, ``RESULT`` (a list of blobs: count, then length + bytes for each) or
``ERROR`` (UTF-8 text, raised as :class:`BootstrapError` by the client).

Frames are limited to what the protocol needs (:data:`MAX_HELLO` before authentication,
:data:`MAX_BLOB` per allgather contribution), and once a frame has begun, the rest of it must
arrive within :data:`FRAME_TIMEOUT`. Every blocking wait has a time limit (the bootstrap
timeout, ``VKSHMEM_BOOTSTRAP_TIMEOUT``; ``0`` means no limit). The server enforces the limit
of an allgather itself, so the error can say which PEs are missing.
"""

from __future__ import annotations

import math
import socket
import struct
import time
from collections.abc import Iterable
from enum import IntEnum

from ..auth import FD_VAR, FILE_VAR, SECRET_VAR, mac

__all__ = [
    "AUTH_FAILED", "CONTROL_TIMEOUT", "FRAME_TIMEOUT", "GRACE", "HEADER", "HELLO",
    "HELLO_TIMEOUT", "I32", "MAGIC", "MAX_ANSWER", "MAX_BLOB", "MAX_HELLO", "MAX_JOB_ID",
    "MAX_REQUEST",
    "ROUND", "TIMEOUT_VAR", "U32", "Msg", "Role", "client_proof", "deadline_in",
    "format_seconds", "pack_blobs", "rank_list", "recv_frame", "send_frame", "sentence",
    "server_proof", "time_limit", "unpack_blobs",
]

TIMEOUT_VAR = "VKSHMEM_BOOTSTRAP_TIMEOUT"
#: Version 3: a challenge-response over the job's secret follows the hello.
MAGIC = b"VKS\x03"
HEADER = struct.Struct("!BQ")
#: magic, role, rank, size, pid, process token, nonce; the job id follows
HELLO = struct.Struct("!4sBIII8s16s")
ROUND = struct.Struct("!QI")  # round number, time limit in ms (0: none); the blob follows
U32 = struct.Struct("!I")
I32 = struct.Struct("!i")
#: Longest job id in a hello (bytes).
MAX_JOB_ID = 256
#: Largest frame before a connection is authenticated (a hello, a challenge, an answer).
MAX_HELLO = HELLO.size + MAX_JOB_ID
#: Largest answer a client accepts to its hello or a control request (the store's text).
MAX_ANSWER = 1 << 16
#: Largest blob one PE contributes to an allgather (start-up blobs are JSON of a few KiB).
MAX_BLOB = 1 << 20
#: Largest request frame of an authenticated connection.
MAX_REQUEST = ROUND.size + MAX_BLOB
#: How long a new connection may take to say hello and prove it knows the job's secret.
HELLO_TIMEOUT = 10.0
#: Once a frame has begun, how long the rest of it may take to arrive.
FRAME_TIMEOUT = 30.0
#: Extra time a client waits for the server's answer beyond the limit the server enforces.
GRACE = 5.0
#: Time limit of a failure report or abort request (best effort, must not hang a dying PE).
CONTROL_TIMEOUT = 5.0


class Msg(IntEnum):
    """Message kinds."""

    HELLO = 1
    ALLGATHER = 2
    FAILURE = 3
    ABORT = 4
    BYE = 5
    CHALLENGE = 6
    AUTH = 7
    OK = 16
    RESULT = 17
    ERROR = 18


#: What a connection that failed to prove the secret is told (nothing of what was expected).
AUTH_FAILED = (f"authentication failed: this connection did not prove that it knows the job's "
               f"secret (every PE of a job needs the same {SECRET_VAR} or {FILE_VAR}; under "
               f"'vkshmem run' the launcher passes it as {FD_VAR})")


def server_proof(key: bytes, hello: bytes, nonce: bytes) -> bytes:
    """The store's answer to a hello: its MAC over the hello (with the client's nonce) and the
    store's own ``nonce``."""
    return mac(key, b"vkshmem store server v3", hello, nonce)


def client_proof(key: bytes, hello: bytes, nonce: bytes) -> bytes:
    """The client's answer to the store's ``nonce`` (another label: no reflection)."""
    return mac(key, b"vkshmem store client v3", hello, nonce)


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
    parts = [U32.pack(len(items))]
    for blob in items:
        parts.append(struct.pack("!Q", len(blob)))
        parts.append(bytes(blob))
    return b"".join(parts)


def unpack_blobs(data: bytes) -> list[bytes]:
    """Decode what :func:`pack_blobs` produced."""
    view = memoryview(data)
    (count,) = U32.unpack_from(view, 0)
    pos = U32.size
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


def send_frame(sock: socket.socket, kind: Msg, payload: bytes = b"") -> None:
    """Send one frame: the header, then the payload."""
    header = HEADER.pack(int(kind), len(payload))
    if len(payload) < 65536:
        sock.sendall(header + payload)
    else:  # avoid copying a large blob
        sock.sendall(header)
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None,
                partial: float | None = None) -> bytes:
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
        if not buf and partial is not None:  # the rest must follow soon
            rest = time.monotonic() + partial
            deadline = rest if deadline is None else min(deadline, rest)
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, deadline: float | None, limit: int,
               partial: float | None = FRAME_TIMEOUT) -> tuple[int, bytes]:
    """Receive one frame by ``deadline`` (``time.monotonic``; None: no limit): (kind, payload).

    A frame longer than ``limit`` bytes is refused (``ValueError``) before it is read; once a
    frame has begun, the rest must arrive within ``partial`` seconds (``TimeoutError``)."""
    kind, length = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline, partial))
    if length > limit:
        raise ValueError(f"frame of {length} bytes is larger than the {limit} this protocol "
                         f"step allows (not a vkshmem store peer?)")
    if partial is not None:
        rest = time.monotonic() + partial
        deadline = rest if deadline is None else min(deadline, rest)
    return kind, _recv_exact(sock, length, deadline) if length else b""


def deadline_in(timeout: float | None) -> float | None:
    """The ``time.monotonic`` deadline ``timeout`` seconds from now (None: no limit)."""
    return None if timeout is None else time.monotonic() + timeout


def time_limit(timeout: float) -> float | None:
    """The bootstrap timeout as a limit: ``0`` (or less, or inf) means none."""
    return None if timeout <= 0 or math.isinf(timeout) else float(timeout)


def sentence(text: str) -> str:
    """`` text.`` (with a full stop unless it ends with punctuation), or ``''``."""
    text = text.strip()
    if not text:
        return ""
    return f" {text}" if text[-1] in ".?!" else f" {text}."


def rank_list(ranks: Iterable[int]) -> str:
    """``[3, 1]`` -> ``'1, 3'``."""
    return ", ".join(str(r) for r in sorted(ranks))
