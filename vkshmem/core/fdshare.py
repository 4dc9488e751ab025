"""Node-local exchange of file descriptors (memfd heaps, later GPU memory fds) over Unix sockets.

Each PE listens on an abstract Unix socket named after the job and its PE and hands its fds to
every same-node peer with ``SCM_RIGHTS``. Abstract sockets leave nothing on disk and belong to
the network namespace, so PEs in different namespaces (test "hosts") never see each other.
Collective over the PEs of the node (and called by every PE of the job).

Abstract socket names are listed in ``/proc/net/unix``, so anyone on the host may connect:
each side checks its peer's credentials (``SO_PEERCRED``). A PE hands its fds only to a
connection from the process of one of its peers (their pids came through the authenticated
bootstrap), each at most once, and accepts fds only from the process of the PE it asked;
any other connection is closed at once and does not count. A flood of connections cannot hold
the exchange past its time limit.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from .errors import BootstrapError

__all__ = ["exchange_fds"]


_UCRED = struct.Struct("3i")  # pid, uid, gid


def _name(token: str, pe: int) -> bytes:
    return f"\0vkshmem.{token}.{pe}".encode()


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket, or None when it is not a
    process of this user (or the kernel cannot say)."""
    try:
        pid, uid, _gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return pid if uid == os.getuid() and pid > 0 else None


def exchange_fds(
    token: str, my_pe: int, peers: Mapping[int, int], fds: Sequence[int],
    barrier: Callable[[], None], timeout: float,
) -> dict[int, list[int]]:
    """Send ``fds`` to each PE in ``peers`` (``{pe: its pid}``) and receive theirs; returns
    ``{pe: [fds]}``. Only the processes in ``peers`` get the fds (``SO_PEERCRED``).

    ``barrier`` must be a job-wide barrier (every PE calls this function, with or without peers).
    """
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(_name(token, my_pe))
    server.listen(max(8, len(peers)))
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
        barrier()  # every listener is up
        for pe, pid in peers.items():
            received[pe] = _fetch(token, pe, pid, len(fds), timeout)
        thread.join(timeout if timeout > 0 else None)
        if errors or thread.is_alive():
            raise BootstrapError(f"PE {my_pe} could not hand its memory fds to its same-node "
                                 f"peers: {errors[0] if errors else 'timed out'}")
        barrier()  # every peer has its fds: the sockets can go
    finally:
        server.close()
    return received


def _fetch(token: str, pe: int, pid: int, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout if timeout > 0 else float("inf")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout if timeout > 0 else None)
        while True:
            try:
                sock.connect(_name(token, pe))
                break
            except (ConnectionRefusedError, FileNotFoundError, BlockingIOError):
                # not listening yet, or its backlog is full (strangers may flood it): retry
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
