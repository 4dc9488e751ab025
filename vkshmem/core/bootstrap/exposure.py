"""Where the ``env`` bootstrap's store listens, and whether the job may run without a secret.

Rank 0's store binds the address ``MASTER_ADDR`` resolves to, never the wildcard unless
``VKSHMEM_BOOTSTRAP_BIND`` asks for it; a store reachable beyond loopback needs the job's secret
(:mod:`vkshmem.core.auth`), and a loopback-only job without one runs with a warning.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Mapping

from ..auth import FILE_VAR, SECRET_VAR, load_secret
from ..errors import BootstrapError

__all__ = ["BIND_VAR", "env_bind", "env_secret"]

BIND_VAR = "VKSHMEM_BOOTSTRAP_BIND"

log = logging.getLogger("vkshmem")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def env_bind(environ: Mapping[str, str], host: str, host_source: str,
             port: int) -> tuple[str, str]:
    """The address rank 0's store listens on, and where it came from: ``VKSHMEM_BOOTSTRAP_BIND``
    if set, else the address the store's host name resolves to (never the wildcard unless
    asked for)."""
    text = environ.get(BIND_VAR, "").strip()
    if text:
        return text, BIND_VAR
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BootstrapError(f"bootstrap 'env': cannot resolve {host!r} ({host_source}): "
                             f"{exc}") from None
    return str(infos[0][4][0]), f"the address of {host_source}"


def env_secret(environ: Mapping[str, str], address: str) -> bytes:
    """The job's secret; required unless the store is on loopback only (``address``: where
    rank 0 binds it, or where the others reach it)."""
    found = load_secret(environ)
    if found is not None:
        return found[0]
    try:
        resolved = socket.getaddrinfo(address, None)[0][4][0]
    except (socket.gaierror, IndexError):
        resolved = address
    if not _is_loopback(str(resolved)):
        raise BootstrapError(
            f"bootstrap 'env': the store listens on {address}, beyond loopback, so the job "
            f"needs a secret that every PE knows: set {SECRET_VAR} (at least 16 random "
            f"characters, the same for every PE) or {FILE_VAR} (a file only you can read)")
    log.warning("bootstrap 'env': no job secret (%s/%s): any local user can join this "
                "loopback job", SECRET_VAR, FILE_VAR)
    return b""
