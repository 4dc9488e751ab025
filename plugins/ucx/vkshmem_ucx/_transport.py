"""The ucx transport: UCP one-sided operations, driven by a native progress thread.

Mapping of the core's contract onto UCP (``csrc/vku*.c`` do the work, one cffi call per
operation, with the GIL released):

* ``register`` → ``ucp_mem_map`` of the segment's existing memory, or (rail option ``heap=``)
  memory UCX allocates in place of the core's memfd mapping, and ``ucp_rkey_pack``; the key
  blob is ``<IIQQ`` (segment id, flags, base address, size) + packed rkey. A ``cuda_va``
  segment (CUDA device memory) is mapped with ``UCS_MEMORY_TYPE_CUDA`` (flag 1 in its key):
  UCX then puts and gets it with its CUDA transports, or with active messages and a memory-type
  copy (cuda_copy) on the target; it carries no AMOs on it (see :meth:`UcxTransport.carries`).
* Where UCX maps a peer's segment here (``ucp_rkey_ptr``, its shared memory on a heap it
  allocated), put/get/AMOs are memcpy and the core's CPU atomics on that mapping
  (``direct=on``).
* ``address`` → the UCP worker address; ``connect`` stores peers' addresses and keys;
  endpoints (``ucp_ep_create``) and rkeys (``ucp_ep_rkey_unpack``) are made on first use.
* ``put``/``get`` → ``ucp_put_nbx``/``ucp_get_nbx``; the blocking forms wait for local
  completion (source reusable) or for the data; ``put_nbi``/``get_nbi`` are completed by
  ``quiet`` (their buffers are kept referenced until then).
* ``amo`` → ``ucp_atomic_op_nbx``: ADD/AND/OR/XOR, SWAP, CSWAP natively, every one waiting
  for its reply (UCX 1.22's flush was seen not to wait for posted software atomics over
  posix,cma,self, so non-fetching AMOs are fetching ones whose result is dropped); FETCH is a
  fetching ADD of 0, SET a SWAP. AND/OR/XOR found broken by the start-up self-test (UCX
  1.13.1's self transport) are emulated by compare-and-swap.
* ``fence`` → ``ucp_worker_fence``; ``quiet`` → ``ucp_worker_flush_nbx`` plus completion of
  every tracked non-blocking request.
* A get or fetching AMO to a PE with un-flushed writes from this context flushes that endpoint
  first, so it observes them (as on the shm path and hostproxy).
* ``create_context`` → a new UCP worker of the same UCP context: its quiet flushes only its
  own operations; ``close`` on it destroys only that worker.

A progress thread per transport (C, no GIL) serves peers' traffic that needs this PE while its
Python code computes or sleeps. See ``README.md``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from vkshmem.plugin import (
    AmoOp,
    InvalidArgumentError,
    NativeTransport,
    TransportContext,
    TransportError,
    TransportSpec,
)

from . import NAME, SPEC
from ._access import TRUST_VAR
from ._library import build_info, check_library, ucx_version
from ._library import status as _status
from ._options import DEFAULT_TIMEOUT, Options, parse_options
from ._segments import Segments
from ._ucx import ffi, lib

__all__ = ["DEFAULT_TIMEOUT", "UcxTransport", "build_info", "check_library", "ucx_version"]

log = logging.getLogger("vkshmem.ucx")

_M64 = (1 << 64) - 1
_UCS_ERR_UNREACHABLE = -6  # ucs/type/status.h
#: why a peer on another host may be unreachable by default, and what to do
UNREACHABLE_HINT = (
    "tcp is left out by default: it checks no remote key, so anyone who reaches its port could "
    "write into a PE's memory. Between hosts use a verbs NIC (tls=rc,ud,dc) or the "
    "authenticated hostproxy transport (VKSHMEM_TRANSPORTS=hostproxy), or, on a network only "
    f"the job's hosts reach, set {TRUST_VAR}=1")
_BITWISE = (AmoOp.AND, AmoOp.OR, AmoOp.XOR)

if any(getattr(lib, f"VK_{op.name}") != op.value for op in AmoOp):  # pragma: no cover
    raise ImportError("vkshmem_ucx: the native AMO op codes disagree with vkshmem's AmoOp")

_from_buffer = ffi.from_buffer
_new = ffi.new
_put = lib.vku_put
_get = lib.vku_get
_amo = lib.vku_amo
_CLOSED, _BOUNDS = lib.VK_ST_CLOSED, lib.VK_ST_BOUNDS


def _destroy_ctx(ctx: Any) -> None:
    lib.vku_ctx_destroy(ctx)


def _destroy_worker(worker: Any) -> None:
    lib.vku_worker_destroy(worker, 1)


class _Shared:
    """What a transport and its context endpoints share: the UCP context (and its progress
    thread), the peers' blobs, and the endpoints still open."""

    def __init__(self, context: TransportContext, options: Options) -> None:
        self.context = context
        self.options = options
        self.ctx: Any = None
        #: pe -> (worker address, seg id -> (base, size, key flags, packed rkey))
        self.peers: dict[int, tuple[bytes, dict[int, tuple[int, int, int, bytes]]]] = {}
        self.children: weakref.WeakSet[UcxTransport] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.emulated: tuple[str, ...] = ()
        #: this PE's registered segments, seg id -> (address, size): AMOs to itself
        self.local: dict[int, tuple[int, int]] = {}
        #: segment ids of device memory (cuda_va), here or on any peer: no AMOs on them
        self.device: set[int] = set()
        #: the segments UCX allocated in place (rail option heap=)
        self.allocated: set[int] = set()
        self.connected = False
        self.cpu_amo = ffi.cast("uint64_t (*)(uintptr_t, int, int, uint64_t, uint64_t)",
                                context.amo_function)


class UcxTransport(Segments, NativeTransport):
    """A ucx transport on one rail of one PE (or one context endpoint of it)."""

    spec: TransportSpec = SPEC
    name = NAME

    def __init__(self, context: TransportContext) -> None:
        self._w: Any = None
        self._closed = False
        self.native_init()  # buffers of non-blocking operations, until quiet
        self._root: UcxTransport | None = None  # set on context endpoints
        self._worker_finalizer: weakref.finalize | None = None
        self._ctx_finalizer: weakref.finalize | None = None
        opts = parse_options(context)
        self._shared = sh = _Shared(context, opts)
        names = [ffi.new("char[]", k.encode()) for k in opts.ucx]
        values = [ffi.new("char[]", v.encode()) for v in opts.ucx.values()]
        err = ffi.new("char[]", lib.VKU_ERRLEN)
        ctx = lib.vku_ctx_create(ffi.new("char *[]", names), ffi.new("char *[]", values),
                                 len(names), opts.spin_us, opts.wait_spin_us, opts.timeout,
                                 int(opts.err_peer), err, lib.VKU_ERRLEN)
        if ctx == ffi.NULL:
            settings = " ".join(f"UCX_{k}={v}" for k, v in opts.ucx.items())
            raise TransportError(NAME, f"cannot open UCX ({ffi.string(err).decode()}) with "
                                 f"{settings or 'no rail settings'}")
        sh.ctx = ctx
        self._ctx_finalizer = self.own(_destroy_ctx, ctx)
        lib.vku_set_liveness(ctx, getattr(context, "liveness_words", 0))
        lib.vku_set_direct(ctx, context.amo_function, int(opts.direct))
        try:
            self._selftest(opts.selftest)
            self._open_worker()
        except BaseException:
            self.close()
            raise

    # -- set-up ---------------------------------------------------------------------------

    def _open_worker(self) -> None:
        sh = self._shared
        err = ffi.new("char[]", lib.VKU_ERRLEN)
        w = lib.vku_worker_create(sh.ctx, sh.context.n_pes, err, lib.VKU_ERRLEN)
        if w == ffi.NULL:
            raise TransportError(NAME, f"cannot create a UCP worker: {ffi.string(err).decode()}")
        self._w = w
        self.set_held_flag(lib.vku_held_flag(w))

    def _selftest(self, mode: str) -> None:
        """Detect (and work around) UCX releases whose AND/OR/XOR write wrong values."""
        version = ucx_version()
        if mode == "off" or (mode == "auto" and version >= (1, 14, 0)):
            return
        bad = ffi.new("uint32_t *")
        err = ffi.new("char[]", lib.VKU_ERRLEN)
        rc = lib.vku_selftest(self._shared.ctx, bad, err, lib.VKU_ERRLEN)
        if rc:
            raise TransportError(NAME, "the start-up atomics self-test could not run: "
                                 f"{ffi.string(err).decode()}", status=_status(rc))
        mask = bad[0]
        if not mask:
            log.info("ucx %d.%d.%d: atomics self-test passed", *version)
            return
        names = [("fetch_" if fetch else "") + op.name.lower()
                 for fetch in (True, False) for op in _BITWISE
                 if mask & (1 << (op + (0 if fetch else lib.VKU_EMU_NONFETCH)))]
        lib.vku_set_emulation(self._shared.ctx, mask)
        self._shared.emulated = tuple(names)
        level = logging.WARNING if self._shared.context.my_pe == 0 else logging.INFO
        log.log(level, "ucx %d.%d.%d writes wrong values for %s (a known bug of UCX < 1.14); "
                "these atomics are emulated with compare-and-swap on this rail (rail option "
                "selftest=off skips the check)", *version, ", ".join(names))

    def address(self) -> bytes:
        """This PE's UCP worker address."""
        w = self._live()
        buf = ffi.new("char[]", lib.VKU_RKEY_MAX)
        size = ffi.new("size_t *", lib.VKU_RKEY_MAX)
        rc = lib.vku_worker_address(w, buf, size)
        if rc:
            raise TransportError(NAME, "cannot query the worker address", status=_status(rc))
        return bytes(ffi.buffer(buf, size[0]))

    # -- errors ---------------------------------------------------------------------------

    def _live(self) -> Any:
        w = self._w
        if w is None:
            raise TransportError(NAME, "the transport is closed")
        return w

    @property
    def native_timeout(self) -> float:  # type: ignore[override]
        return self._shared.options.timeout

    def status_text(self, rc: int) -> str:
        return _status(rc)  # vku_status_string: the VK_ST_* codes and UCX's ucs_status_t

    def unreachable(self, pe: int) -> str:
        return (f"PE {pe} is not reachable through ucx on rail {self._shared.context.rail} "
                "(it published no address)")

    def segment_size(self, pe: int, seg: int) -> int | None:
        segs = self._shared.peers.get(pe, (b"", {}))[1]
        return segs[seg][1] if seg in segs else None

    def status_error(self, rc: int, doing: str, pe: int = -1, seg: int = -1, offset: int = 0,
                     nbytes: int = 0) -> BaseException:
        """:meth:`NativeTransport.status_error`, with why UCX may not reach a PE."""
        if rc == _UCS_ERR_UNREACHABLE and not self._shared.options.trusted \
                and doing not in ("quiet", "fence"):
            where = self.where(doing, pe, seg, offset, nbytes)
            return TransportError(
                NAME, f"{where}: UCX has no transport to that PE ({UNREACHABLE_HINT})",
                status=_status(rc))
        return super().status_error(rc, doing, pe, seg, offset, nbytes)

    # -- data path ------------------------------------------------------------------------

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """``ucp_put_nbx``; returns once ``src`` is reusable (local completion)."""
        w = self._w
        if w is None or offset < 0:
            raise self.status_error(_CLOSED if w is None else _BOUNDS, "put to", pe,
                                    seg, offset, src.nbytes)
        buf = _from_buffer(src)
        rc = _put(w, pe, seg, offset, buf, len(buf), 0)
        if rc:
            if rc == lib.VK_ST_TIMEDOUT:
                self.bury(buf)  # UCX may still read it
            raise self.status_error(rc, "put to", pe, seg, offset, len(buf))

    def put_nbi(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Start a put; ``src`` is kept referenced (and must stay unchanged) until quiet."""
        w = self._w
        if w is None or offset < 0:
            raise self.status_error(_CLOSED if w is None else _BOUNDS, "put to", pe,
                                    seg, offset, src.nbytes)
        buf = _from_buffer(src)
        rc = _put(w, pe, seg, offset, buf, len(buf), 1)
        if rc:
            raise self.status_error(rc, "put to", pe, seg, offset, len(buf))
        self.hold(buf)  # the core's quiet in C must call quiet() to release it

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """``ucp_get_nbx``; returns with ``dst`` filled."""
        w = self._w
        if w is None or offset < 0:
            raise self.status_error(_CLOSED if w is None else _BOUNDS, "get from", pe,
                                    seg, offset, dst.nbytes)
        buf = _from_buffer(dst, require_writable=True)
        rc = _get(w, pe, seg, offset, buf, len(buf), 0)
        if rc:
            if rc == lib.VK_ST_TIMEDOUT:
                self.bury(buf)  # UCX may still write into it
            raise self.status_error(rc, "get from", pe, seg, offset, len(buf))

    def get_nbi(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Start a get; ``dst`` is kept referenced and filled by quiet."""
        w = self._w
        if w is None or offset < 0:
            raise self.status_error(_CLOSED if w is None else _BOUNDS, "get from", pe,
                                    seg, offset, dst.nbytes)
        buf = _from_buffer(dst, require_writable=True)
        rc = _get(w, pe, seg, offset, buf, len(buf), 1)
        if rc:
            raise self.status_error(rc, "get from", pe, seg, offset, len(buf))
        self.hold(buf)  # the core's quiet in C must call quiet() to release it

    def amo(
        self, pe: int, seg: int, offset: int, op: AmoOp, width: int,
        operand: int, compare: int, fetch: bool,
    ) -> int:
        """``ucp_atomic_op_nbx`` (see the module docstring for how each op maps)."""
        w = self._w
        if w is None or offset < 0:
            raise self.status_error(_CLOSED if w is None else _BOUNDS, "AMO on", pe,
                                    seg, offset, width)
        sh = self._shared
        if seg in sh.device:
            raise InvalidArgumentError(f"ucx: segment {seg} is CUDA device memory, on which "
                                       "the ucx transport carries no AMOs (the core sends them "
                                       "through the memory domain's proxy)")
        local = sh.local.get(seg) if pe == sh.context.my_pe else None
        if local is not None and width in (4, 8) and not offset % width \
                and offset + width <= local[1]:
            # This PE's own word: the core's CPU atomic, atomic with the peers' (UCX's self
            # transport was seen to lose an add under contention, about 1 run in 30)
            code = AmoOp.SWAP if op == AmoOp.SET else op  # a fetching SET returns the old word
            old = sh.cpu_amo(local[0] + offset, int(code), width, operand & _M64,
                             compare & _M64)
            return int(old) if fetch else 0
        out = _new("uint64_t *")
        rc = _amo(w, pe, seg, offset, op, width, operand & _M64, compare & _M64, fetch, out)
        if rc:
            raise self.status_error(rc, "AMO on", pe, seg, offset, width)
        return out[0] if fetch else 0

    def native_ops(self) -> int:
        """vku_put/vku_get/vku_amo/vku_quiet/vku_fence of this endpoint's worker, for the
        core's compiled hot path (the same calls as :meth:`put`/:meth:`get`/:meth:`amo`/
        :meth:`quiet`/:meth:`fence`, without Python; its quiet defers to :meth:`quiet` while
        buffers of non-blocking operations issued from Python are held)."""
        w = self._w
        if w is None:
            return 0
        ops = self.__dict__.get("_ops")
        if ops is None:
            ops = self._ops = _new("struct vk_native_ops *")
            lib.vku_native_ops(w, ops)
        return int(ffi.cast("uintptr_t", ops))

    def fence(self) -> None:
        """``ucp_worker_fence``: operations issued before reach each PE before later ones."""
        rc = lib.vku_fence(self._live())
        if rc:
            raise self.status_error(rc, "fence")

    def quiet(self) -> None:
        """Flush the worker: every operation issued so far is complete at its target (and
        every non-blocking get has filled its buffer)."""
        w = self._live()
        held = self.release_held()  # only operations issued before this point
        rc = lib.vku_quiet(w)
        if rc:
            self.bury(*held)  # UCX may still read or write them
            raise self.status_error(rc, "quiet")

    # -- contexts, introspection, shutdown ------------------------------------------------

    def create_context(self) -> UcxTransport:
        """A new UCP worker of this transport's UCP context, connected to the same peers; its
        quiet flushes only its own operations. ``close()`` on it destroys only that worker."""
        self._live()
        sh = self._shared
        ep = object.__new__(UcxTransport)
        ep._w = None
        ep._closed = False
        ep.native_init()
        ep._shared = sh
        ep._root = self  # keeps the UCP context alive as long as this endpoint
        ep._ctx_finalizer = None  # the UCP context belongs to the transport
        ep._worker_finalizer = None
        ep._open_worker()
        ep._worker_finalizer = ep.own(_destroy_worker, ep._w)
        try:
            with sh.lock:
                peers = dict(sh.peers)
            for pe, (address, segs) in peers.items():
                ep._feed(ep._w, pe, address, segs)
        except BaseException:
            ep.close()
            raise
        sh.children.add(ep)
        return ep

    @property
    def emulated_atomics(self) -> tuple[str, ...]:
        """The atomics this rail emulates with compare-and-swap (after the self-test)."""
        return self._shared.emulated

    def stats(self) -> dict[str, Any]:
        """Progress-thread counters, the UCX version and what it was built against."""
        out = ffi.new("uint64_t[5]")
        if self._shared.ctx is not None:
            lib.vku_stats(self._shared.ctx, out)
        return {"wakeups": out[0], "idle_wakeups": out[1], "busy_rounds": out[2],
                "caller_sleeps": out[3], "caller_sleep_timeouts": out[4],
                "ucx_version": ".".join(map(str, ucx_version())), "built_with": build_info(),
                "emulated": self._shared.emulated,
                "ucx_allocated_segments": sorted(self._shared.allocated),
                "settings": {f"UCX_{k}": v for k, v in self._shared.options.ucx.items()}}

    def close(self, _force: bool = False) -> None:
        """Destroy this endpoint's worker (closing its endpoints) and, for the transport
        itself, every context endpoint, the progress thread, the memory registrations and the
        UCP context. Safe to call twice.

        A context closed on its own flushes its endpoints (its peers are alive); the transport
        closes at the end of the job, after the runtime's last quiet and barrier, so it and
        the contexts it closes drop their endpoints without a flush (a flush to a peer that
        already closed makes UCX log errors)."""
        if self._closed:
            return
        self._closed = True
        force = _force
        if self._ctx_finalizer is not None:  # the transport: its contexts go first
            force = True
            for child in list(self._shared.children):
                child.close(_force=True)
        w, self._w = self._w, None
        if self._worker_finalizer is not None:
            self._worker_finalizer.detach()
            self._worker_finalizer = None
        if w is not None:
            lib.vku_worker_destroy(w, 1 if force else 0)
        self.drop_held()  # the worker (and its held flag) is gone
        if self._ctx_finalizer is not None:
            self._ctx_finalizer()
            self._ctx_finalizer = None
            self._shared.ctx = None
