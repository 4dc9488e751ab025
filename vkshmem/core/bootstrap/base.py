"""The bootstrap contract: how the PEs of a job find each other and exchange start-up blobs.

A bootstrap plugin registers :class:`BootstrapSpec` records (see ``hookspecs``). The core asks
each spec's ``detect(environ)`` when ``VKSHMEM_BOOTSTRAP=auto`` (highest priority first) and
calls ``factory(environ, timeout)`` for the chosen one. Every exchange is collective: all PEs
call it in the same order. :func:`guess_host_address` and :func:`flush_stdio` are helpers for
implementations.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Bootstrap", "BootstrapSpec", "flush_stdio", "guess_host_address"]


class Bootstrap(ABC):
    """An open bootstrap: rank, size, and collective blob exchange."""

    name: str
    rank: int
    size: int
    #: The job's secret (:mod:`vkshmem.core.auth`): every listener of the job admits only
    #: connections that prove they know it. ``b""``: none (loopback-only ``env`` jobs).
    secret: bytes = b""

    @abstractmethod
    def allgather(self, blob: bytes) -> list[bytes]:
        """Collective: every PE contributes ``blob``; all get the list indexed by rank."""

    def barrier(self) -> None:
        """Collective: return when every PE has called it."""
        self.allgather(b"")

    def host_address(self) -> str:
        """An address of this host that the other PEs can reach (for socket transports)."""
        return "127.0.0.1"

    def report_failure(self, message: str) -> None:  # noqa: B027 - optional
        """Tell the job's launcher that this PE is failing and why (best effort)."""

    def abort(self, status: int) -> None:
        """End the whole job with ``status`` (``global_exit``). Default: end this process."""
        import os

        os._exit(status)

    @abstractmethod
    def close(self) -> None:
        """Release sockets/communicators; safe to call twice."""


@dataclass(frozen=True)
class BootstrapSpec:
    """A bootstrap a plugin offers.

    ``detect(environ)`` returns True when this bootstrap should be used under ``auto``;
    the highest ``priority`` among the detected ones wins.
    """

    name: str
    factory: Callable[[Mapping[str, str], float], Bootstrap]
    detect: Callable[[Mapping[str, str]], bool]
    priority: int = 0
    description: str = ""


# -- helpers for bootstrap implementations ---------------------------------------------------

def guess_host_address() -> str:
    """An address of this host that other hosts can probably reach (no packet is sent)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects the outgoing interface
        addr = str(s.getsockname()[0])
        if addr and not addr.startswith("0."):
            return addr
    with contextlib.suppress(OSError):
        return socket.gethostbyname(socket.gethostname())
    return "127.0.0.1"


def flush_stdio() -> None:
    """Flush stdout and stderr (before a bootstrap ends the process); never raises."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
