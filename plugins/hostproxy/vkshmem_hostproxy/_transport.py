"""The hostproxy transport: TCP to a native proxy thread in every PE.

Each open transport starts a server thread written in C (``csrc/hp_server.c``) that listens on a
TCP port and serves peers' requests on this PE's registered segments without this PE calling
into Python. Each endpoint (the transport, and each context's) has a client written in C
(``csrc/hp_client.c``, see :mod:`._client`): one TCP connection per target PE, opened on first
use, carrying requests that the target's server applies strictly in order (requests to this
PE itself are applied in place, complete on return, as the core's own CPU atomics on this PE's
words are). The core's compiled
hot path calls that client directly (:meth:`HostProxyTransport.native_ops`); the Python methods
here call the same client.

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
peer that dies or closes its connection raises :class:`TransportError` naming it. Ctrl-C (any
exception from a signal handler) during a wait retires that request's connection (its stream is
out of step with the server); the next request to that PE opens a fresh one.

Admission: a server serves a connection only after it proved that it knows the job's secret
(``TransportContext.secret``, see :func:`vkshmem.plugin.derive_key`) and proves the same back, by a
challenge-response with HMAC-SHA256 (``csrc/hp_server.h`` describes the exchange); the client
checks the server's proof before sending anything else. The server drops a connection that
does not authenticate within 10 s (or ``timeout``, if shorter), keeps at most 64 authenticating
at a time and at most ``1024 + 8 * n_pes`` open, and drops a connection whose begun request
makes no progress within ``timeout``.
"""

from __future__ import annotations

import json
import socket
import struct
import weakref
from collections.abc import Mapping
from typing import Any

from vkshmem.plugin import (
    AmoOp,
    NativeTransport,
    PeerInfo,
    SegmentInfo,
    TransportContext,
    TransportError,
    TransportSpec,
    derive_key,
)

from ._client import Client
from ._options import DEFAULT_TIMEOUT, NAME, OPTIONS, listen, parse_options
from ._server import ffi, lib

__all__ = ["DEFAULT_TIMEOUT", "OPTIONS", "SPEC", "HostProxyTransport"]

_RKEY = struct.Struct("<IQ")


def _destroy_server(handle: Any) -> None:
    lib.hp_destroy(handle)


class HostProxyTransport(NativeTransport):
    """A hostproxy transport on one rail of one PE (see the module docstring)."""

    spec: TransportSpec
    name = NAME

    def __init__(self, context: TransportContext) -> None:
        self.native_init()  # nothing is held: every call completes or copies (see put)
        self.context = context
        opts = parse_options(context)
        self._timeout = self.native_timeout = opts.timeout
        sock = listen(opts.host, opts.port, max(128, context.n_pes))
        bound = sock.getsockname()
        self._port: int = bound[1]
        wildcard = bound[0] in ("0.0.0.0", "::", "")
        self._host: str = (context.host_address or socket.gethostname()) if wildcard \
            else bound[0]
        self._key = derive_key(context.secret, "hostproxy")
        err = ffi.new("char[]", 256)
        request_ms = max(1, min(int(self._timeout * 1000), 2**32 - 1))
        srv = lib.hp_create(sock.fileno(), context.my_pe, context.n_pes, self._key,
                            context.amo_function, opts.spin_us, request_ms,
                            1024 + 8 * context.n_pes, err, 256)
        if srv == ffi.NULL:
            sock.close()
            raise TransportError(NAME, ffi.string(err).decode(errors="replace"))
        sock.detach()  # the server owns the listening socket now
        self._srv: Any = srv
        self._finalizer: weakref.finalize | None = self.own(_destroy_server, srv)
        self._targets: dict[int, tuple[str, int, dict[int, int]]] = {}
        self._locals: dict[int, tuple[int, int]] = {}  # this PE's segments: address, size
        self._client = self._new_client()
        # every endpoint's client (this one's and its contexts') learns new peers and segments
        self._clients: weakref.WeakSet[Client] = weakref.WeakSet([self._client])
        self._closed = False

    def _new_client(self) -> Client:
        """A client of this PE with every known peer and this PE's segments."""
        ctx = self.context
        client = Client(ctx.my_pe, ctx.n_pes, ctx.rail, self._key, self._timeout,
                        ctx.amo_function)
        for seg, (address, size) in self._locals.items():
            client.set_local(seg, address, size)
        for pe, (host, port, sizes) in self._targets.items():
            client.set_target(pe, host, port, sizes)
        return client

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
        if rc == lib.VK_ST_BUSY:
            raise TransportError(NAME, f"segment id {segment.seg_id} is already registered "
                                 "with other memory")
        self._locals[segment.seg_id] = (segment.address, segment.size)
        for client in self._clients:
            client.set_local(segment.seg_id, segment.address, segment.size)
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
            known = self._targets.get(pe)
            if known is not None and known[:2] == (host, port):
                sizes = {**known[2], **sizes}
            self._targets[pe] = (host, port, sizes)
            for client in self._clients:
                client.set_target(pe, host, port, sizes)

    # -- data path (the C client; the core's compiled path calls it through native_ops) ----

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Send the bytes; return once they are handed to the kernel (``src`` reusable)."""
        self._client.put(pe, seg, offset, src)

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Request the bytes and receive them straight into ``dst``."""
        self._client.get(pe, seg, offset, dst)

    def amo(
        self, pe: int, seg: int, offset: int, op: AmoOp, width: int,
        operand: int, compare: int, fetch: bool,
    ) -> int:
        """Apply the AMO at the target (with the core's ``vk_amo``); fetching waits."""
        return self._client.amo(pe, seg, offset, int(op), width, operand, compare, fetch)

    def fence(self) -> None:
        """Nothing to do: each target is one TCP stream served in order by one thread."""

    def quiet(self) -> None:
        """FLUSH every connection with un-acknowledged puts/AMOs, then wait for every ack."""
        self._client.quiet()

    def native_ops(self) -> int:
        """The C client's put/get/AMO/quiet/fence for the core's compiled hot path (the same
        functions :meth:`put`/:meth:`get`/:meth:`amo`/:meth:`quiet` call), or 0 once closed."""
        return 0 if self._closed else self._client.native_ops()

    def native_error(self, status: int, doing: str, pe: int, seg: int, offset: int,
                     nbytes: int, buffer: object) -> BaseException:
        """The exception :meth:`put`/:meth:`get`/:meth:`amo`/:meth:`quiet` raise for
        ``status`` (from the calling thread's last failure)."""
        return self._client.error(status)

    def create_context(self) -> HostProxyTransport:
        """An endpoint for a new context: the same server and peers, its own client (its own
        connections), so its quiet flushes (and its fence orders) only its own streams."""
        if self._closed:
            raise TransportError(NAME, "create_context() after close()")
        ep = object.__new__(HostProxyTransport)
        ep.__dict__.update(self.__dict__)
        ep._client = ep._new_client()  # the peers and segments known so far, and later ones
        self._clients.add(ep._client)
        ep._finalizer = None  # the server belongs to the parent transport
        return ep

    # -- introspection and shutdown --------------------------------------------------------

    def client_stats(self) -> dict[str, int]:
        """This endpoint's client: requests through the core's compiled path (``native``),
        through the Python methods (``python``), connections opened (``opened``)."""
        return self._client.stats()

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
        if self._closed:
            return
        self._closed = True
        self._client.close()
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
