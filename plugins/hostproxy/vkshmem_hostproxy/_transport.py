"""The hostproxy transport: TCP to a native proxy thread in every PE.

Each open transport starts a server thread written in C (``csrc/hp_server.c``) that listens on a
TCP port and serves peers' requests on this PE's registered segments without this PE calling
into Python. The Python side (this module) is the client: one TCP connection per target PE,
opened on first use, carrying requests that the target's server applies strictly in order.

Ordering and completion, as the core's contract asks:

* ``put``/``put_nbi`` send header + payload and return; the source is reusable on return (the
  bytes are in the kernel), so the non-blocking form is the blocking one.
* ``get`` and fetching AMOs wait for their reply; non-fetching AMOs do not.
* ``fence`` is a no-op: every target has one ordered stream (a TCP connection) served in order by
  one thread, so operations to a PE are applied in issue order.
* ``quiet`` sends FLUSH on every connection with un-acknowledged puts/AMOs and waits for the
  acks; a FLUSH is answered after every earlier request on its connection was applied. Any
  reply (get, fetching AMO) also proves that everything before it on that connection is done.

Every wait is bounded by the rail option ``timeout`` (seconds without progress, default 60); a
peer that dies or closes its connection raises :class:`TransportError` naming it.

Admission: a server serves a connection only after it proved that it knows the job's secret
(``TransportContext.secret``, see :mod:`vkshmem.core.auth`) and proves the same back, by a
challenge-response with HMAC-SHA256 (``csrc/hp_server.h`` describes the exchange); the client
checks the server's proof before sending anything else. The server drops a connection that
does not authenticate within 10 s (or ``timeout``, if shorter), keeps at most 64 authenticating
at a time and at most ``1024 + 8 * n_pes`` open, and drops a connection whose begun request
makes no progress within ``timeout``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from vkshmem.core.auth import derive_key, verify
from vkshmem.core.errors import ConfigError, InvalidArgumentError, TransportError
from vkshmem.core.transport import (
    AmoOp,
    PeerInfo,
    SegmentInfo,
    Transport,
    TransportContext,
    TransportSpec,
)

from ._server import ffi, lib

__all__ = ["DEFAULT_TIMEOUT", "OPTIONS", "SPEC", "HostProxyTransport"]

NAME = "hostproxy"
#: Rail options this transport understands.
OPTIONS = ("addr", "port", "timeout", "spin")
#: Seconds a wait may go without progress before the peer is declared dead.
DEFAULT_TIMEOUT = 60.0

_REQ = struct.Struct("<BBBxIQQQ")
_REP = struct.Struct("<iIQ")
_RKEY = struct.Struct("<IQ")
if _REQ.size != lib.HP_REQ_SIZE or _REP.size != lib.HP_REP_SIZE:  # pragma: no cover
    raise ImportError("vkshmem_hostproxy: Python and C disagree on the wire format")

_REQ_SIZE = _REQ.size
_REP_SIZE = _REP.size
_OP_PUT = lib.HP_OP_PUT
_OP_GET = lib.HP_OP_GET
_OP_AMO = lib.HP_OP_AMO
_OP_AMO_FETCH = lib.HP_OP_AMO_FETCH
_WAITALL = socket.MSG_WAITALL
_NOSIGNAL = socket.MSG_NOSIGNAL  # a dead peer must raise EPIPE, never kill us with SIGPIPE
_MASKS = {4: 0xFFFF_FFFF, 8: 0xFFFF_FFFF_FFFF_FFFF}
_FLUSH = _REQ.pack(lib.HP_OP_FLUSH, 0, 0, 0, 0, 0, 0)
_CLOSE = _REQ.pack(lib.HP_OP_CLOSE, 0, 0, 0, 0, 0, 0)
_AUTH = _REQ.pack(lib.HP_OP_AUTH, 0, 0, 0, 0, 0, 0)
_NONCE = lib.HP_NONCE
_MAC = lib.HP_MAC
_SERVER_LABEL = b"vkshmem hostproxy server v2"
_CLIENT_LABEL = b"vkshmem hostproxy client v2"
_OP_NAMES = {
    lib.HP_OP_HELLO: "HELLO", lib.HP_OP_PUT: "PUT", lib.HP_OP_GET: "GET",
    lib.HP_OP_AMO: "AMO", lib.HP_OP_AMO_FETCH: "AMO_FETCH", lib.HP_OP_FLUSH: "FLUSH",
    lib.HP_OP_CLOSE: "CLOSE", lib.HP_OP_AUTH: "AUTH",
}
_STATUS = {
    lib.HP_EPROTO: "protocol error",
    lib.HP_ESEG: "segment not registered",
    lib.HP_EBOUNDS: "outside the registered segment",
    lib.HP_EALIGN: "misaligned AMO",
    lib.HP_EAMO: "unsupported AMO op or width",
    lib.HP_EHELLO: "bad HELLO (protocol version mismatch?)",
    lib.HP_EAUTH: "authentication failed: this PE and that one were given different job "
                  "secrets, or that server belongs to another job",
}


def hp_mac(key: bytes, label: bytes, nc: bytes, ns: bytes, client_pe: int,
           server_pe: int) -> bytes:
    """The MAC of the hostproxy handshake (the C server computes the same, see
    ``csrc/hp_server.h``)."""
    return hmac.new(key, label + nc + ns + struct.pack("<II", client_pe, server_pe),
                    hashlib.sha256).digest()


class _Conn:
    """One client connection to a target PE's server (all use under ``lock``)."""

    __slots__ = (
        "broken", "dirty", "lock", "pe", "recv_into", "recvmsg_into", "rep", "sendall",
        "sendmsg", "sizes", "sock", "where",
    )

    def __init__(self, sock: socket.socket, pe: int, where: str, sizes: dict[int, int]) -> None:
        self.sock = sock
        self.pe = pe
        self.where = where
        self.sizes = sizes
        self.lock = threading.Lock()
        self.dirty = False  # puts/AMOs sent since the last reply
        self.broken = ""  # why the connection is unusable, once it is
        self.rep = bytearray(_REP_SIZE)
        self.sendall = sock.sendall
        self.sendmsg = sock.sendmsg
        self.recv_into = sock.recv_into
        self.recvmsg_into = sock.recvmsg_into

    def error(self) -> TransportError:
        return TransportError(NAME, f"connection to {self.where} is unusable: {self.broken}")

    def drop(self, why: str) -> None:
        """Mark the connection unusable and close its socket."""
        if not self.broken:
            self.broken = why
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _option_error(context: TransportContext, message: str) -> ConfigError:
    return ConfigError(f"VKSHMEM_RAIL{context.rail}", f"hostproxy: {message}")


def _parse_options(context: TransportContext) -> tuple[str, int, float, int]:
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
    return host, port, timeout, spin


def _listen(host: str, port: int, backlog: int) -> socket.socket:
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


def _destroy_server(handle: Any) -> None:
    lib.hp_destroy(handle)


class HostProxyTransport(Transport):
    """A hostproxy transport on one rail of one PE (see the module docstring)."""

    spec: TransportSpec

    def __init__(self, context: TransportContext) -> None:
        self.context = context
        bind_host, port, self._timeout, spin_us = _parse_options(context)
        sec = int(self._timeout)
        self._timeval = struct.pack("ll", sec, int((self._timeout - sec) * 1e6))
        sock = _listen(bind_host, port, max(128, context.n_pes))
        bound = sock.getsockname()
        self._port: int = bound[1]
        wildcard = bound[0] in ("0.0.0.0", "::", "")
        self._host: str = (context.host_address or socket.gethostname()) if wildcard \
            else bound[0]
        self._key = derive_key(context.secret, "hostproxy")
        err = ffi.new("char[]", 256)
        request_ms = max(1, min(int(self._timeout * 1000), 2**32 - 1))
        srv = lib.hp_create(sock.fileno(), context.my_pe, context.n_pes, self._key,
                            context.amo_function, spin_us, request_ms,
                            1024 + 8 * context.n_pes, err, 256)
        if srv == ffi.NULL:
            sock.close()
            raise TransportError(NAME, ffi.string(err).decode(errors="replace"))
        sock.detach()  # the server owns the listening socket now
        self._srv: Any = srv
        self._finalizer: weakref.finalize | None = weakref.finalize(self, _destroy_server, srv)
        self._conns: dict[int, _Conn] = {}
        self._opened: list[_Conn] = []
        self._targets: dict[int, tuple[str, int, dict[int, int]]] = {}
        self._connect_lock = threading.Lock()
        self._closed = False

    # -- set-up ---------------------------------------------------------------------------

    @property
    def listen_address(self) -> tuple[str, int]:
        """The (host, port) peers connect to."""
        return self._host, self._port

    def address(self) -> bytes:
        """This PE's server as a JSON blob ``{"host": ..., "port": ...}``."""
        return json.dumps({"host": self._host, "port": self._port}).encode()

    def register(self, segment: SegmentInfo) -> bytes:
        """Let the server serve ``segment``; the rkey is its id and size.

        The memory must stay mapped until :meth:`close` (the server thread touches it).
        """
        if self._closed:
            raise TransportError(NAME, "register() after close()")
        if segment.kind != "host":
            raise TransportError(NAME, f"cannot register memory of kind {segment.kind!r}; "
                                 "hostproxy serves host memory only")
        if not 0 <= segment.seg_id < lib.HP_MAX_SEGS:
            raise TransportError(NAME, f"segment id {segment.seg_id} is out of range "
                                 f"(0..{lib.HP_MAX_SEGS - 1})")
        rc = lib.hp_register(self._srv, segment.seg_id, segment.address, segment.size)
        if rc == -2:
            raise TransportError(NAME, f"segment id {segment.seg_id} is already registered "
                                 "with other memory")
        return _RKEY.pack(segment.seg_id, segment.size)

    def connect(self, peers: Mapping[int, PeerInfo]) -> None:
        """Record every peer's server address and segment sizes; connections open lazily.

        May be called again (e.g. after new segments were registered): sizes are updated.
        """
        for pe, info in peers.items():
            if info.address is None:
                continue
            try:
                blob = json.loads(info.address)
                host, port = str(blob["host"]), int(blob["port"])
                sizes = dict(_RKEY.unpack(key) for key in info.rkeys.values())
            except (ValueError, KeyError, TypeError, struct.error) as exc:
                raise TransportError(NAME, f"PE {pe} published an unreadable hostproxy "
                                     f"address or key: {exc}") from None
            with self._connect_lock:
                self._targets[pe] = (host, port, sizes)
                conn = self._conns.get(pe)
                if conn is not None:
                    conn.sizes.update(sizes)

    def _open(self, pe: int) -> _Conn:
        """Open the connection to ``pe`` (once, thread-safely) and say HELLO."""
        with self._connect_lock:
            conn = self._conns.get(pe)
            if conn is not None:
                return conn
            if self._closed:
                raise TransportError(NAME, "the transport is closed")
            target = self._targets.get(pe)
            if target is None:
                raise TransportError(NAME, f"PE {pe} is not reachable through hostproxy on rail "
                                     f"{self.context.rail} (it published no address)")
            host, port, sizes = target
            where = f"PE {pe} at {host}:{port}"
            try:
                sock = socket.create_connection((host, port), timeout=self._timeout)
            except OSError as exc:
                raise TransportError(NAME, f"cannot connect to {where}: {exc}",
                                     status=exc.errno) from None
            conn = _Conn(sock, pe, where, dict(sizes))
            try:
                sock.settimeout(None)  # blocking; the kernel enforces the timeouts below
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, self._timeval)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, self._timeval)
                self._authenticate(conn, pe)
            except BaseException:
                conn.drop("connection set-up failed")
                raise
            self._conns[pe] = conn
            self._opened.append(conn)
            return conn

    def _authenticate(self, conn: _Conn, pe: int) -> None:
        """The handshake: HELLO with our nonce; check the server's proof; prove ours."""
        me = self.context.my_pe
        nc = secrets.token_bytes(_NONCE)
        hello = _REQ.pack(lib.HP_OP_HELLO, 0, 0, me, lib.HP_MAGIC, lib.HP_VERSION, 0)
        try:
            conn.sendall(hello + nc, _NOSIGNAL)
        except OSError as exc:
            raise self._broken(conn, "saying hello", exc, True) from None
        value = self._read_reply(conn, "saying hello")
        if value != pe:
            raise TransportError(NAME, f"{conn.where} answered as PE {value}: addresses were "
                                 "mixed up")
        challenge = bytearray(_NONCE + _MAC)
        self._recv_rest(conn, memoryview(challenge), 0, "saying hello")
        ns, proof = bytes(challenge[:_NONCE]), bytes(challenge[_NONCE:])
        if not verify(hp_mac(self._key, _SERVER_LABEL, nc, ns, me, pe), proof):
            raise TransportError(NAME, f"{conn.where} could not prove that it knows this job's "
                                 "secret (another job's server at that address, or the PEs "
                                 "were given different secrets)")
        try:
            conn.sendall(_AUTH + hp_mac(self._key, _CLIENT_LABEL, nc, ns, me, pe), _NOSIGNAL)
        except OSError as exc:
            raise self._broken(conn, "authenticating", exc, True) from None
        self._read_reply(conn, "authenticating")

    # -- errors ---------------------------------------------------------------------------

    def _describe(self, exc: BaseException | None) -> str:
        if isinstance(exc, BlockingIOError | TimeoutError):
            return (f"no progress for {self._timeout:g} s (the peer may be dead or stuck; the "
                    "rail option timeout= sets this limit)")
        if exc is None or isinstance(exc, ConnectionError):
            return "the peer closed the connection (did it exit or fail?)"
        return str(exc)

    def _diagnose(self, conn: _Conn) -> str:
        """After a send failed: did the server leave an error reply saying why?"""
        try:
            data = conn.sock.recv(_REP_SIZE, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except OSError:
            return ""
        if len(data) == _REP_SIZE:
            status, op, value = _REP.unpack(data)
            if status < 0:
                return self._rejection(status, op, value)
        return ""

    @staticmethod
    def _rejection(status: int, op: int, value: int) -> str:
        return (f"it rejected a request ({_STATUS.get(status, f'status {status}')}; "
                f"op {_OP_NAMES.get(op, op)}, offset {value}) and dropped the connection")

    def _broken(self, conn: _Conn, doing: str, exc: BaseException | None,
                sending: bool = False) -> TransportError:
        """Mark ``conn`` dead; the error to raise. After a failed send, look for the reason
        the server may have left (an error reply) before describing ``exc``."""
        detail = (sending and self._diagnose(conn)) or self._describe(exc)
        msg = f"{conn.where} failed while {doing}: {detail}"
        conn.drop(msg)
        return TransportError(NAME, msg, status=getattr(exc, "errno", None))

    def _rejected(self, conn: _Conn, status: int, op: int, value: int) -> TransportError:
        msg = f"{conn.where}: {self._rejection(status, op, value)}"
        conn.drop(msg)
        return TransportError(NAME, msg, status=status)

    def _range_error(self, conn: _Conn, seg: int, offset: int, n: int) -> InvalidArgumentError:
        size = conn.sizes.get(seg)
        if size is None:
            return InvalidArgumentError(f"hostproxy: {conn.where} has no segment {seg} "
                                        "registered")
        return InvalidArgumentError(f"hostproxy: {n} bytes at offset {offset} are outside "
                                    f"segment {seg} of {conn.where} ({size} bytes)")

    # -- receiving ------------------------------------------------------------------------

    def _recv_rest(self, conn: _Conn, view: memoryview, have: int, doing: str) -> None:
        """Fill ``view[have:]`` (a byte view), raising if the peer goes away."""
        total = len(view)
        while have < total:
            try:
                got = conn.recv_into(view[have:], total - have, _WAITALL)
            except OSError as exc:
                raise self._broken(conn, doing, exc) from None
            if got == 0:
                raise self._broken(conn, doing, None)
            have += got

    def _check_reply(self, conn: _Conn, have: int, doing: str) -> int:
        """Complete the 16-byte reply in ``conn.rep``; raise on an error status; the value."""
        if have < _REP_SIZE:
            self._recv_rest(conn, memoryview(conn.rep), have, doing)
        status, op, value = _REP.unpack(conn.rep)
        if status:
            raise self._rejected(conn, status, op, value)
        return value

    def _read_reply(self, conn: _Conn, doing: str) -> int:
        try:
            got = conn.recv_into(conn.rep, _REP_SIZE, _WAITALL)
        except OSError as exc:
            raise self._broken(conn, doing, exc) from None
        if got == 0:
            raise self._broken(conn, doing, None)
        return self._check_reply(conn, got, doing)

    # -- data path ------------------------------------------------------------------------

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Send the bytes; return once they are handed to the kernel (``src`` reusable)."""
        conn = self._conns.get(pe) or self._open(pe)
        n = src.nbytes
        if offset < 0 or offset + n > conn.sizes.get(seg, -1):
            raise self._range_error(conn, seg, offset, n)
        hdr = _REQ.pack(_OP_PUT, 0, 0, seg, offset, n, 0)
        with conn.lock:
            if conn.broken:
                raise conn.error()
            conn.dirty = True
            try:
                sent = conn.sendmsg((hdr, src), (), _NOSIGNAL)
                if sent != _REQ_SIZE + n:
                    if sent < _REQ_SIZE:
                        conn.sendall(hdr[sent:], _NOSIGNAL)
                        sent = _REQ_SIZE
                    conn.sendall(src.cast("B")[sent - _REQ_SIZE:], _NOSIGNAL)
            except OSError as exc:
                raise self._broken(conn, "sending a put", exc, True) from None
            except BaseException:
                self._interrupted(conn)
                raise

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Request the bytes and receive them straight into ``dst``."""
        conn = self._conns.get(pe) or self._open(pe)
        n = dst.nbytes
        if offset < 0 or offset + n > conn.sizes.get(seg, -1):
            raise self._range_error(conn, seg, offset, n)
        hdr = _REQ.pack(_OP_GET, 0, 0, seg, offset, n, 0)
        with conn.lock:
            if conn.broken:
                raise conn.error()
            try:
                try:
                    conn.sendall(hdr, _NOSIGNAL)
                except OSError as exc:
                    raise self._broken(conn, "sending a get", exc, True) from None
                try:
                    got = conn.recvmsg_into((conn.rep, dst), 0, _WAITALL)[0]
                except OSError as exc:
                    raise self._broken(conn, "getting", exc) from None
                if got != _REP_SIZE + n:
                    if got == 0:
                        raise self._broken(conn, "getting", None)
                    self._check_reply(conn, got, "getting")
                    self._recv_rest(conn, dst.cast("B"), max(got - _REP_SIZE, 0), "getting")
            except BaseException:
                self._interrupted(conn)
                raise
            conn.dirty = False  # the reply proves every earlier request was applied

    def amo(
        self, pe: int, seg: int, offset: int, op: AmoOp, width: int,
        operand: int, compare: int, fetch: bool,
    ) -> int:
        """Apply the AMO at the target (with the core's ``vk_amo``); fetching waits."""
        conn = self._conns.get(pe) or self._open(pe)
        mask = _MASKS.get(width)
        if mask is None:
            raise InvalidArgumentError(f"hostproxy: AMO width {width} (4 or 8 bytes only)")
        if offset < 0 or offset + width > conn.sizes.get(seg, -1):
            raise self._range_error(conn, seg, offset, width)
        if offset % width:
            raise InvalidArgumentError(f"hostproxy: AMO at offset {offset} is not aligned to "
                                       f"its width {width}")
        hdr = _REQ.pack(_OP_AMO_FETCH if fetch else _OP_AMO, op, width, seg, offset,
                        operand & mask, compare & mask)
        with conn.lock:
            if conn.broken:
                raise conn.error()
            try:
                if not fetch:
                    conn.dirty = True
                    try:
                        conn.sendall(hdr, _NOSIGNAL)
                    except OSError as exc:
                        raise self._broken(conn, "sending an AMO", exc, True) from None
                    return 0
                try:
                    conn.sendall(hdr, _NOSIGNAL)
                except OSError as exc:
                    raise self._broken(conn, "sending an AMO", exc, True) from None
                try:
                    got = conn.recv_into(conn.rep, _REP_SIZE, _WAITALL)
                except OSError as exc:
                    raise self._broken(conn, "fetching an AMO", exc) from None
                if got == 0:
                    raise self._broken(conn, "fetching an AMO", None)
                value = self._check_reply(conn, got, "fetching an AMO")
            except BaseException:
                self._interrupted(conn)
                raise
            conn.dirty = False
            return value

    def _interrupted(self, conn: _Conn) -> None:
        """A request on ``conn`` was cut short (Ctrl-C, an exception from a signal handler):
        its stream is out of step with the server, so retire it; the next request to that PE
        opens a fresh connection. Requests sent in full before it are still applied in order."""
        if conn.broken:
            return
        conn.drop("a request on it was interrupted")
        with self._connect_lock:
            if self._conns.get(conn.pe) is conn:
                del self._conns[conn.pe]
            if conn in self._opened:
                self._opened.remove(conn)

    def create_context(self) -> HostProxyTransport:
        """An endpoint for a new context: the same server and peers, its own connections, so
        its quiet flushes (and its fence orders) only its own streams."""
        if self._closed:
            raise TransportError(NAME, "create_context() after close()")
        ep = object.__new__(HostProxyTransport)
        ep.__dict__.update(self.__dict__)
        ep._conns = {}
        ep._opened = []
        ep._connect_lock = threading.Lock()
        ep._closed = False
        ep._finalizer = None  # the server belongs to the parent transport
        return ep

    def fence(self) -> None:
        """Nothing to do: each target is one TCP stream served in order by one thread."""

    def quiet(self) -> None:
        """FLUSH every connection with un-acknowledged puts/AMOs, then wait for every ack."""
        pending = [c for c in self._opened if c.dirty]
        if not pending:
            return
        held: list[_Conn] = []
        flushed: list[_Conn] = []
        errors: list[TransportError] = []
        try:
            for conn in pending:  # list order: concurrent quiets lock in the same order
                conn.lock.acquire()
                held.append(conn)
                if conn.broken:
                    errors.append(conn.error())
                elif conn.dirty:
                    try:
                        conn.sendall(_FLUSH, _NOSIGNAL)
                        flushed.append(conn)
                    except OSError as exc:
                        errors.append(self._broken(conn, "sending a flush", exc, True))
            for i, conn in enumerate(flushed):
                try:
                    self._read_reply(conn, "waiting for a flush")
                    conn.dirty = False
                except TransportError as exc:
                    errors.append(exc)
                except BaseException:
                    for late in flushed[i:]:  # their flush replies will never be read
                        self._interrupted(late)
                    raise
        finally:
            for conn in held:
                conn.lock.release()
        if errors:
            raise errors[0]

    # -- introspection and shutdown --------------------------------------------------------

    def server_stats(self) -> dict[str, Any]:
        """The server's counters and its last recorded error (for diagnostics and tests)."""
        if self._closed:
            return {"closed": True}
        out = ffi.new("uint64_t[6]")
        lib.hp_stats(self._srv, out)
        buf = ffi.new("char[]", lib.HP_ERRLEN)
        lib.hp_last_error(self._srv, buf, lib.HP_ERRLEN)
        return {"accepted": out[0], "open": out[1], "requests": out[2], "errors": out[3],
                "refused": out[4], "stalled": out[5],
                "last_error": ffi.string(buf).decode(errors="replace")}

    def close(self) -> None:
        """Close every connection, stop and join the server thread; safe to call twice."""
        with self._connect_lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._opened)
            self._opened.clear()
            self._conns.clear()
        for conn in conns:
            locked = conn.lock.acquire(timeout=1.0)
            try:
                if locked and not conn.broken:
                    try:
                        conn.sock.send(_CLOSE, socket.MSG_DONTWAIT | _NOSIGNAL)
                    except OSError:
                        pass
                conn.drop("the transport was closed")
            finally:
                if locked:
                    conn.lock.release()
        if self._finalizer is not None:  # a context endpoint does not own the server
            self._finalizer()
        self._srv = None


HostProxyTransport.spec = SPEC = TransportSpec(
    name=NAME,
    factory=HostProxyTransport,
    priority=10,
    memory_kinds=frozenset({"host"}),
    reach=frozenset({"intra", "inter"}),
    amo_ops=frozenset(AmoOp),
    amo_widths=frozenset({4, 8}),
    native_fence=True,
    put_signal=False,
    description="TCP to a native proxy thread in each PE; works anywhere, no RDMA needed",
)
