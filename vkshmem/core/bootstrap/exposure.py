"""Where the ``env`` bootstrap's store listens, and whether the job may run without a secret.

Rank 0's store binds the address ``MASTER_ADDR`` resolves to, never the wildcard unless
``VKSHMEM_BOOTSTRAP_BIND`` asks for it; a store reachable beyond loopback needs the job's secret
(:mod:`vkshmem.core.auth`), and a loopback-only job without one runs with a warning. Every rank
applies that rule, from where rank 0 binds (the same variables) and where it connects itself, so
that a rank other than 0 fails at once rather than wait the bootstrap timeout for a rank 0 that
refused to start.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Mapping

from ..auth import FD_VAR, FILE_VAR, SECRET_VAR, load_secret
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


def env_secret(environ: Mapping[str, str], bind: str, bind_source: str,
               connect: str | None = None, connect_source: str = "") -> bytes:
    """The job's secret; required unless the store is on loopback only.

    Every rank applies the same rule, so that none waits for a rank 0 that refused to start:
    ``bind`` is where rank 0's store listens (every rank derives it from the same variables,
    :func:`env_bind`), ``connect`` (ranks other than 0) where this rank reaches it; either
    beyond loopback needs the secret (BootstrapError naming the variables)."""
    found = load_secret(environ)
    if found is not None:
        return found[0]
    where = [(bind, f"the store listens on {bind} ({bind_source})")]
    if connect is not None:
        where.append((connect, f"this PE reaches the store at {connect} ({connect_source})"))
    for address, what in where:
        if not _is_loopback(_resolved(address)):
            raise BootstrapError(
                f"bootstrap 'env': {what}, beyond loopback, so the job needs a secret that "
                f"every PE knows: set {SECRET_VAR} (at least 16 random characters, the same "
                f"for every PE), {FILE_VAR} (a file only you can read) or {FD_VAR} (an "
                "inherited fd to read it from)")
    log.warning("bootstrap 'env': no job secret (%s/%s): any local user can join this "
                "loopback job", SECRET_VAR, FILE_VAR)
    return b""


def _resolved(address: str) -> str:
    """The address ``address`` resolves to first (itself when it does not resolve)."""
    try:
        return str(socket.getaddrinfo(address, None)[0][4][0])
    except (socket.gaierror, IndexError, UnicodeError):
        return address
