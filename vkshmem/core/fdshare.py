"""Node-local exchange of file descriptors (memfd heaps, later GPU memory fds) over Unix sockets.

Each PE listens on an abstract Unix socket of a fresh random name (``vkshmem.`` and 128 random
bits, new for every exchange) and hands its fds to every same-node peer with ``SCM_RIGHTS``.
Abstract sockets leave nothing on disk and belong to the network namespace, so PEs in different
namespaces (test "hosts") never see each other. Collective over the PEs of the node (and called
by every PE of the job).

Abstract socket names are listed in ``/proc/net/unix``, so anyone on the host sees a name once
it is bound, and may bind a name it can predict before its PE does. No name is predictable
here: each PE binds its own random name first, and only then are the names exchanged, through
the authenticated bootstrap's all-gather (which replaces a barrier: every listener is up once
it returns). A bind that fails because the name is taken (by chance: never, with 128 bits) is
retried with another name a few times, then the exchange fails with BootstrapError on every PE
(the all-gather tells them which PE could not listen).

Anyone may connect, though: each side checks its peer's credentials (``SO_PEERCRED``). A PE
hands its fds only to a connection from the process of one of its peers (their pids came
through the authenticated bootstrap), each at most once, and accepts fds only from the process
of the PE it asked; any other connection is closed at once and does not count. A flood of
connections cannot hold the exchange past its time limit.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from .errors import BootstrapError

__all__ = ["exchange_fds"]


_UCRED = struct.Struct("3i")  # pid, uid, gid
_PREFIX = b"\0vkshmem."
#: what a PE's name must look like (the all-gathered names are checked against it)
_NAME = re.compile(rb"\0vkshmem\.[0-9a-f]{32}")
#: binds tried (each with a new random name) before giving up
BIND_TRIES = 5


def _new_name() -> bytes:
    """A fresh unguessable abstract socket name."""
    return _PREFIX + secrets.token_hex(16).encode()


def _shown(name: bytes) -> str:
    return "@" + name[1:].decode(errors="replace")


def _listen(my_pe: int, backlog: int) -> tuple[socket.socket | None, bytes | str]:
    """A listening socket of a fresh random name and that name, or None and why not."""
    taken: list[str] = []
    for _ in range(BIND_TRIES):
        name = _new_name()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(name)
            server.listen(backlog)
        except OSError as exc:
            server.close()
            if exc.errno != errno.EADDRINUSE:
                return None, (f"PE {my_pe} cannot listen on an abstract Unix socket for fd "
                              f"passing: {exc.strerror or exc}")
            taken.append(_shown(name))
            continue
        return server, name
    return None, (f"PE {my_pe} could not listen for fd passing: the random socket names it "
                  f"drew ({', '.join(taken)}) were each taken by another process (a clash, "
                  "or someone squatting them)")


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket, or None when it is not a
    process of this user (or the kernel cannot say)."""
    try:
        pid, uid, _gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return pid if uid == os.getuid() and pid > 0 else None


def _check_names(my_pe: int, names: list[bytes], why: str) -> None:
    """Every PE's all-gathered name is well formed, or every PE raises (they see the same
    list); ``why``: this PE's own failure to listen, if any."""
    if why:  # this PE's own failure first
        raise BootstrapError(why)
    for pe, name in enumerate(names):
        if isinstance(name, bytes) and _NAME.fullmatch(name):
            continue
        what = "could not listen for fd passing" if not name else \
            f"sent a malformed fd-passing socket name ({name[:48]!r})"
        raise BootstrapError(f"PE {pe} {what}; PE {my_pe} cannot exchange memory fds with it")


def exchange_fds(
    my_pe: int, peers: Mapping[int, int], fds: Sequence[int],
    allgather: Callable[[bytes], list[bytes]], barrier: Callable[[], None], timeout: float,
) -> dict[int, list[int]]:
    """Send ``fds`` to each PE in ``peers`` (``{pe: its pid}``) and receive theirs; returns
    ``{pe: [fds]}``. Only the processes in ``peers`` get the fds (``SO_PEERCRED``).

    ``allgather`` (bytes -> every PE's bytes, by PE) and ``barrier`` must be the job-wide
    collectives of the authenticated bootstrap (every PE calls this function, with or without
    peers). Raises BootstrapError on every PE when one cannot listen.
    """
    server, got = _listen(my_pe, max(8, len(peers)))
    try:
        names = allgather(got if isinstance(got, bytes) else b"")  # every listener is up
        _check_names(my_pe, names, got if isinstance(got, str) else "")
        if any(not 0 <= pe < len(names) for pe in peers):
            raise BootstrapError(f"PE {my_pe}: the all-gather of fd-passing names has "
                                 f"{len(names)} entries, fewer than its peers {sorted(peers)}")
        if server is None:  # (_check_names raised)
            raise BootstrapError(f"PE {my_pe} could not listen for fd passing")
        return _serve_and_fetch(server, my_pe, peers, fds, names, barrier, timeout)
    finally:
        if server is not None:
            server.close()


def _serve_and_fetch(
    server: socket.socket, my_pe: int, peers: Mapping[int, int], fds: Sequence[int],
    names: list[bytes], barrier: Callable[[], None], timeout: float,
) -> dict[int, list[int]]:
    errors: list[BaseException] = []
    deadline = time.monotonic() + timeout if timeout > 0 else float("inf")
    owed = {pid: pe for pe, pid in peers.items()}  # processes still to be served

    def serve() -> None:
        try:
            while owed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("timed out")
                server.settimeout(None if remaining == float("inf") else remaining)
                conn, _addr = server.accept()
                with conn:
                    pid = peer_pid(conn)
                    if pid is None or pid not in owed:
                        continue  # not a peer, or served already: nothing for it
                    del owed[pid]
                    conn.settimeout(min(max(0.1, deadline - time.monotonic()), 60.0))
                    socket.send_fds(conn, [b"f"], list(fds))
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    thread = threading.Thread(target=serve, name="vkshmem-fdshare", daemon=True)
    thread.start()
    received: dict[int, list[int]] = {}
    try:
        for pe, pid in peers.items():
            received[pe] = _fetch(names[pe], pe, pid, len(fds), timeout)
        thread.join(timeout if timeout > 0 else None)
        if errors or thread.is_alive():
            raise BootstrapError(f"PE {my_pe} could not hand its memory fds to its same-node "
                                 f"peers: {errors[0] if errors else 'timed out'}")
        barrier()  # every peer has its fds: the sockets can go
    except BaseException:
        for got in received.values():
            for fd in got:
                os.close(fd)
        raise
    return received


def _fetch(name: bytes, pe: int, pid: int, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout if timeout > 0 else float("inf")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout if timeout > 0 else None)
        while True:
            try:
                sock.connect(name)
                break
            except (ConnectionRefusedError, FileNotFoundError, BlockingIOError):
                # its backlog is full (strangers may flood it), or it is gone: retry
                if time.monotonic() > deadline:
                    raise BootstrapError(f"same-node PE {pe} did not offer its memory fds "
                                         "(VKSHMEM_BOOTSTRAP_TIMEOUT)") from None
                time.sleep(0.01)
        if peer_pid(sock) != pid:
            raise BootstrapError(f"the socket of same-node PE {pe} is held by another process "
                                 f"than PE {pe} (process {pid}); refusing what it sends")
        _msg, fds, _flags, _addr = socket.recv_fds(sock, 16, count)
    if len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise BootstrapError(f"PE {pe} sent {len(fds)} fds, expected {count}")
    return fds
