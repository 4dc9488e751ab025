"""Helpers of the tests that attack a listener (tests/test_*_security.py): read what it sends
until it closes, this process's resident memory, and for intruders run as another user: a
network namespace of the test's own, its listening ports, a process's sockets."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


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


@contextlib.contextmanager
def private_netns(prefix: str) -> Iterator[str]:
    """A network namespace of the caller's own with only ``lo``, up; deleted on exit. Skips
    the test where namespaces cannot be made (not root, no iproute2)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True,
                       timeout=30)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create a network namespace here: {exc}")
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True,
                       capture_output=True, timeout=30)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def listeners(ns: str) -> dict[int, set[int]]:
    """Listening TCP ports in namespace ``ns`` (state 0A) -> their sockets' inodes."""
    ports: dict[int, set[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        r = subprocess.run(["ip", "netns", "exec", ns, "cat", table], capture_output=True,
                           text=True, timeout=30)
        for line in r.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":
                port = int(fields[1].rsplit(":", 1)[1], 16)
                ports.setdefault(port, set()).add(int(fields[9]))
    return ports


def socket_inodes(pid: int) -> set[int]:
    """Inodes of process ``pid``'s sockets."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir() if fd_dir.exists() else ():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes
