"""Helpers of the tests that attack a listener (tests/test_*_security.py): read what it sends
until it closes, and this process's resident memory."""

from __future__ import annotations

import contextlib
import resource
import socket


def read_all(sock: socket.socket) -> bytes:
    """Whatever the peer sends until it closes the connection (or an error ends it)."""
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def rss_kib() -> int:
    """This process's resident set size in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
