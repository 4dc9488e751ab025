"""The hostproxy rail options (``VKSHMEM_RAIL<n>=hostproxy:key=value:...``) and the listening
socket they describe."""

from __future__ import annotations

import socket
from typing import NamedTuple

from vkshmem.plugin import ConfigError, TransportContext, TransportError

__all__ = ["DEFAULT_TIMEOUT", "NAME", "OPTIONS", "Options", "listen", "parse_options"]

NAME = "hostproxy"
#: Rail options this transport understands.
OPTIONS = ("addr", "port", "timeout", "spin")
#: Seconds a wait may go without progress before the peer is declared dead.
DEFAULT_TIMEOUT = 60.0


class Options(NamedTuple):
    """A rail's options: where to listen, the timeout (s), the server's spin (µs)."""

    host: str
    port: int
    timeout: float
    spin_us: int


def _option_error(context: TransportContext, message: str) -> ConfigError:
    return ConfigError(f"VKSHMEM_RAIL{context.rail}", f"hostproxy: {message}")


def parse_options(context: TransportContext) -> Options:
    """The rail's options, validated (a :class:`ConfigError` naming the rail otherwise)."""
    opts = dict(context.options)
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise _option_error(context, f"unknown option(s) {', '.join(unknown)} "
                            f"(known: {', '.join(OPTIONS)})")
    host = opts.get("addr") or context.host_address
    try:
        port = int(opts.get("port", "0"))
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise _option_error(context, f"port={opts['port']!r} is not a port number") from None
    try:
        timeout = float(opts.get("timeout", DEFAULT_TIMEOUT))
        if not timeout > 0:
            raise ValueError
    except ValueError:
        raise _option_error(context, f"timeout={opts['timeout']!r} is not a positive number "
                            "of seconds") from None
    try:
        spin = int(opts.get("spin", "0"))
        if not 0 <= spin <= 10_000_000:
            raise ValueError
    except ValueError:
        raise _option_error(context, f"spin={opts['spin']!r} is not a number of microseconds "
                            "(0 to 10000000)") from None
    return Options(host, port, timeout, spin)


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A socket listening on ``host:port`` (the first address of it that binds)."""
    last: OSError | None = None
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise TransportError(NAME, f"cannot resolve listen address {host!r}: {exc}") from None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(backlog)
            return sock
        except OSError as exc:
            last = exc
            sock.close()
    raise TransportError(NAME, f"cannot listen on {host}:{port}: {last}",
                         status=getattr(last, "errno", None))
