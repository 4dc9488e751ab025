"""The ofi transport's data path, contexts, statistics and shutdown (a mixin of
:class:`~vkshmem_ofi._transport.OfiTransport`; see its module docstring for the mapping)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from vkshmem.plugin import (
    AmoOp,
    NativeTransport,
    TransportContext,
    TransportError,
)

from . import NAME
from ._ofi import ffi, lib
from ._options import Options

__all__ = ["DataPath", "Shared", "status"]

_M64 = (1 << 64) - 1
_from_buffer = ffi.from_buffer
_new = ffi.new
_put = lib.vko_put
_get = lib.vko_get
_amo = lib.vko_amo


def status(rc: int) -> str:
    """The name of native return code ``rc`` (libfabric's ``fi_strerror`` or ours)."""
    return ffi.string(lib.vko_strerror(rc)).decode(errors="replace")


class Shared:
    """What a transport and its context endpoints share: the fabric (and progress thread),
    the peers' segment sizes (for messages) and this PE's own segments (for its AMOs)."""

    def __init__(self, context: TransportContext, options: Options) -> None:
        self.context = context
        self.options = options
        self.ctx: Any = None
        self.provider = ""
        self.peers: dict[int, dict[int, int]] = {}  # pe -> seg -> size
        self.local: dict[int, tuple[int, int]] = {}  # seg -> (address, size) of this PE
        self.children: weakref.WeakSet[Any] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.emulated: tuple[str, ...] = ()
        self.busy_yield = True  # the progress thread's busy window yields (set by connect)
        self.cpu_amo = ffi.cast("uint64_t (*)(uintptr_t, int, int, uint64_t, uint64_t)",
                                context.amo_function)


class DataPath(NativeTransport):
    """put/get/AMO/fence/quiet, contexts and close, over the native endpoint ``self._e``
    (held buffers: the native quiet defers to Python's while any are, ``vko_held_flag``)."""

    name = NAME
    _e: Any
    _closed: bool
    _root: Any
    _ctx_finalizer: weakref.finalize | None
    _shared: Shared

    # -- errors ---------------------------------------------------------------------------

    def _live(self) -> Any:
        e = self._e
        if e is None:
            raise TransportError(NAME, "the transport is closed")
        return e

    @property
    def native_timeout(self) -> float:  # type: ignore[override]
        return self._shared.options.timeout

    def status_text(self, rc: int) -> str:
        return status(rc)

    def where(self, doing: str, pe: int, seg: int, offset: int, nbytes: int) -> str:
        return (f"{doing} PE {pe} (segment {seg}, offset {offset}, {nbytes} bytes) over "
                f"{self._shared.provider}")

    def unreachable(self, pe: int) -> str:
        sh = self._shared
        return f"PE {pe} is not reachable through ofi ({sh.provider}) on rail {sh.context.rail}"

    def segment_size(self, pe: int, seg: int) -> int | None:
        return self._shared.peers.get(pe, {}).get(seg)

    def error_detail(self, rc: int) -> str:
        """libfabric's last error message, and the provider (for quiet and fence)."""
        sh = self._shared
        return ffi.string(lib.vko_last_error(sh.ctx)).decode(errors="replace") if sh.ctx else ""

    def _check(self, offset: int, what: str, pe: int, seg: int, n: int) -> Any:
        e = self._e
        if e is None or offset < 0:
            raise self.status_error(lib.VK_ST_CLOSED if e is None else lib.VK_ST_BOUNDS, what,
                                    pe, seg, offset, n)
        return e

    # -- data path ------------------------------------------------------------------------

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """``fi_writemsg``; returns once ``src`` is reusable."""
        e = self._check(offset, "put to", pe, seg, src.nbytes)
        buf = _from_buffer(src)
        rc = _put(e, pe, seg, offset, buf, len(buf), 0)
        if rc:
            if rc == lib.VK_ST_TIMEDOUT:
                self.bury(buf)  # the provider may still read it
            raise self.status_error(rc, "put to", pe, seg, offset, len(buf))

    def put_nbi(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Start a put; ``src`` is kept referenced (and must stay unchanged) until quiet."""
        e = self._check(offset, "put to", pe, seg, src.nbytes)
        buf = _from_buffer(src)
        rc = _put(e, pe, seg, offset, buf, len(buf), 1)
        if rc:
            raise self.status_error(rc, "put to", pe, seg, offset, len(buf))
        if len(buf) > lib.VKO_BOUNCE:
            self.hold(buf)

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """``fi_readmsg``; returns with ``dst`` filled (after this endpoint's writes)."""
        e = self._check(offset, "get from", pe, seg, dst.nbytes)
        buf = _from_buffer(dst, require_writable=True)
        rc = _get(e, pe, seg, offset, buf, len(buf), 0)
        if rc:
            if rc == lib.VK_ST_TIMEDOUT:
                self.bury(buf)  # the provider may still write into it
            raise self.status_error(rc, "get from", pe, seg, offset, len(buf))

    def get_nbi(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Start a get; ``dst`` is kept referenced and filled by quiet."""
        e = self._check(offset, "get from", pe, seg, dst.nbytes)
        buf = _from_buffer(dst, require_writable=True)
        rc = _get(e, pe, seg, offset, buf, len(buf), 1)
        if rc:
            raise self.status_error(rc, "get from", pe, seg, offset, len(buf))
        self.hold(buf)

    def amo(
        self, pe: int, seg: int, offset: int, op: AmoOp, width: int,
        operand: int, compare: int, fetch: bool,
    ) -> int:
        """A libfabric atomic (or a compare-and-swap loop where the provider lacks the op);
        this PE's own words take the core's CPU atomic."""
        e = self._check(offset, "AMO on", pe, seg, width)
        sh = self._shared
        local = sh.local.get(seg) if pe == sh.context.my_pe else None
        if local is not None and width in (4, 8) and not offset % width \
                and offset + width <= local[1]:
            rc = lib.vko_settle_puts(e)  # ordered after this endpoint's puts, as remotely
            if rc:
                raise self.status_error(rc, "AMO on", pe, seg, offset, width)
            code = AmoOp.SWAP if op == AmoOp.SET else op  # a fetching SET returns the old word
            old = sh.cpu_amo(local[0] + offset, int(code), width, operand & _M64,
                             compare & _M64)
            return int(old) if fetch else 0
        out = _new("uint64_t *")
        rc = _amo(e, pe, seg, offset, op, width, operand & _M64, compare & _M64, fetch, out)
        if rc:
            raise self.status_error(rc, "AMO on", pe, seg, offset, width)
        return int(out[0]) if fetch else 0

    def fence(self) -> None:
        """Order this endpoint's earlier puts and AMOs before its later ones: wait for its
        outstanding AMOs, and for its puts too unless the provider grants write-after-write
        ordering (``stats()["fence"]``; the rail option ``fence=quiet`` always waits)."""
        rc = lib.vko_fence(self._live())
        if rc:
            raise self.status_error(rc, "fence")

    def quiet(self) -> None:
        """Every operation this endpoint issued so far is complete at its target (and every
        non-blocking get has filled its buffer)."""
        e = self._live()
        held = self.release_held()
        rc = lib.vko_quiet(e)
        if rc:
            if rc in (lib.VK_ST_TIMEDOUT, lib.VK_ST_FAILED):
                self.bury(*held)  # the provider may still read or write them
            raise self.status_error(rc, "quiet")

    def completion_error(self, rc: int, doing: str = "quiet") -> TransportError:
        err = super().completion_error(rc, doing)
        if rc in (lib.VK_ST_TIMEDOUT, lib.VK_ST_FAILED, lib.VK_ST_CLOSED):
            return err
        detail = self.error_detail(rc)
        return TransportError(NAME, f"{doing}: an operation failed over {self._shared.provider}"
                              + (f": {detail}" if detail else ""), status=status(rc))

    # -- the core's compiled hot path -----------------------------------------------------

    def native_ops(self) -> int:
        """The address of this endpoint's ``struct vk_native_ops`` (``csrc/vko_native.c``):
        the core's compiled hot path calls vko_put/vko_get/vko_amo/vko_quiet/vko_fence
        through it without Python (``stats()["native_calls"]`` counts them); its quiet
        defers to :meth:`quiet` while buffers of non-blocking operations issued from Python
        are held. 0 once closed, or with the rail option ``native=0``."""
        e = self._e
        if e is None or not self._shared.options.native:
            return 0
        return int(lib.vko_native_ops(e))

    # -- contexts, introspection, shutdown ------------------------------------------------

    def create_context(self) -> Any:
        """A context: its own counts of outstanding operations on this transport's endpoint
        and CQ (rail option ``contexts=own``: a new endpoint on its domain, AV and CQ), a
        parked one where a closed context left one, reaching the same peers; its quiet and
        fence wait only for its own operations. ``close()`` on it waits for them and parks it
        for the next context (libfabric 2.5's shm crashes opening an endpoint after a closed
        one had sent to this PE); the transport's ``close()`` closes them all."""
        self._live()
        sh = self._shared
        ep = object.__new__(type(self))
        ep._e = None
        ep._closed = False
        ep.native_init()
        ep._shared = sh
        ep._root = self  # keeps the fabric alive as long as this endpoint
        ep._ctx_finalizer = None
        ep._open_endpoint()
        sh.children.add(ep)
        return ep

    @property
    def emulated_atomics(self) -> tuple[str, ...]:
        """The atomics this rail runs as compare-and-swap loops (``op/bits``)."""
        return self._shared.emulated

    def stats(self) -> dict[str, Any]:
        """The provider and what it granted, and the completion counters."""
        from ._transport import libfabric_version

        sh = self._shared
        out = ffi.new("uint64_t[8]")
        info = ffi.new("uint64_t[6]")
        if sh.ctx is not None:
            lib.vko_stats(sh.ctx, out)
            lib.vko_info(sh.ctx, info)
        return {"provider": sh.provider, "provider_from": sh.options.provider_from,
                "libfabric": libfabric_version(), "mr_mode": int(info[0]),
                "msg_order": int(info[1]), "inject_size": int(info[2]),
                "max_msg_size": int(info[3]), "progress_waits": bool(info[4]),
                "progress_wait": ("poll", "sread", "fd")[int(info[4])],
                "amo_valid": int(lib.vko_amo_valid(sh.ctx)) if sh.ctx is not None else 0,
                "emulated": sh.emulated, "completions": int(out[0]), "errors": int(out[1]),
                "progress_wakeups": int(out[2]),
                "remote_ops": None if out[3] == 2**64 - 1 else int(out[3]),
                "busy_windows": int(out[4]), "busy_yield": sh.busy_yield,
                "emulated_amos": int(out[5]), "progress_rounds": int(out[6]),
                "progress_parks": int(out[7]),
                "native_calls": int(lib.vko_native_calls(sh.ctx)) if sh.ctx is not None else 0,
                "fence": ("amos" if sh.ctx is not None and lib.vko_puts_ordered(sh.ctx)
                          else "writes")}

    def close(self) -> None:
        """Close this endpoint (after a bounded wait for its operations) and, for the
        transport itself, every context endpoint, the progress thread, the registrations and
        the fabric. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._ctx_finalizer is not None:  # the transport: its contexts go first
            for child in list(self._shared.children):
                child.close()
        e, self._e = self._e, None
        if e is not None:
            lib.vko_ep_close(e)
        self.drop_held()  # the endpoint (and its held flag) is gone
        if self._ctx_finalizer is not None:
            self._ctx_finalizer()
            self._ctx_finalizer = None
            self._shared.ctx = None
