"""Node-local exchange of file descriptors (memfd heaps, later GPU memory fds) over Unix sockets.

Each PE listens on an abstract Unix socket named after the job and its PE and hands its fds to
every same-node peer with ``SCM_RIGHTS``. Abstract sockets leave nothing on disk and belong to
the network namespace, so PEs in different namespaces (test "hosts") never see each other.
Collective over the PEs of the node (and called by every PE of the job).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence

from .errors import BootstrapError

__all__ = ["exchange_fds"]


def _name(token: str, pe: int) -> bytes:
    return f"\0vkshmem.{token}.{pe}".encode()


def exchange_fds(
    token: str, my_pe: int, peers: Sequence[int], fds: Sequence[int],
    barrier: Callable[[], None], timeout: float,
) -> dict[int, list[int]]:
    """Send ``fds`` to each PE in ``peers`` and receive theirs; returns ``{pe: [fds]}``.

    ``barrier`` must be a job-wide barrier (every PE calls this function, with or without peers).
    """
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(_name(token, my_pe))
    server.listen(max(1, len(peers)))
    server.settimeout(timeout)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            for _ in peers:
                conn, _addr = server.accept()
                with conn:
                    socket.send_fds(conn, [b"f"], list(fds))
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    thread = threading.Thread(target=serve, name="vkshmem-fdshare", daemon=True)
    thread.start()
    received: dict[int, list[int]] = {}
    try:
        barrier()  # every listener is up
        for pe in peers:
            received[pe] = _fetch(token, pe, len(fds), timeout)
        thread.join(timeout)
        if errors or thread.is_alive():
            raise BootstrapError(f"PE {my_pe} could not hand its memory fds to its same-node "
                                 f"peers: {errors[0] if errors else 'timed out'}")
        barrier()  # every peer has its fds: the sockets can go
    finally:
        server.close()
    return received


def _fetch(token: str, pe: int, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        while True:
            try:
                sock.connect(_name(token, pe))
                break
            except (ConnectionRefusedError, FileNotFoundError):
                if time.monotonic() > deadline:
                    raise BootstrapError(f"same-node PE {pe} did not offer its memory fds "
                                         "(VKSHMEM_BOOTSTRAP_TIMEOUT)") from None
                time.sleep(0.01)
        _msg, fds, _flags, _addr = socket.recv_fds(sock, 16, count)
    if len(fds) != count:
        raise BootstrapError(f"PE {pe} sent {len(fds)} fds, expected {count}")
    return fds
