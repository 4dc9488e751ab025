"""vkshmem-hostproxy: the ``hostproxy`` transport (TCP to a native proxy thread per PE).

Registered through the entry point group ``vkshmem.transports``; the core opens it per rail,
e.g. ``VKSHMEM_RAIL0=hostproxy:addr=10.0.0.1:port=0``. See ``README.md`` for the options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vkshmem.plugin import hookimpl

from ._transport import DEFAULT_TIMEOUT, OPTIONS, SPEC, HostProxyTransport

__all__ = ["DEFAULT_TIMEOUT", "OPTIONS", "SPEC", "HostProxyTransport", "register_transports"]


@hookimpl
def register_transports(register: Callable[[Any], None]) -> None:
    """Offer the ``hostproxy`` transport."""
    register(SPEC)
