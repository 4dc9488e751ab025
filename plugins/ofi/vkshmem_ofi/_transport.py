"""The ofi transport: libfabric RDM one-sided operations, driven by a native progress thread.

Mapping of the core's contract onto libfabric (``csrc/vko*.c`` does the work, one cffi call
per operation, with the GIL released):

* ``register`` → ``fi_mr_reg`` of the segment's existing memory (nothing is allocated), with
  the MR modes the provider asked for (``FI_MR_VIRT_ADDR``, ``FI_MR_PROV_KEY``); the key
  requested is random (``getrandom``, as many bytes as the domain's ``mr_key_size``), the
  provider's own where it grants ``FI_MR_PROV_KEY``; the key blob is ``<IQQQ`` (segment id,
  remote address of its first byte, size, key), which reaches peers only through the
  bootstrap. GPU memory whose domain exports a dma-buf (``SegmentInfo.dmabuf_fd``, or a
  ``"dmabuf"`` segment's fd) → ``fi_mr_regattr`` with ``FI_MR_DMABUF``, where the headers
  built against have it (1.20+).
* Opening: a provider that binds network addresses (tcp, sockets, udp, verbs) gets the
  context's ``host_address`` as its source (``FI_SOURCE``): it listens on that address only.
* ``address`` → ``fi_getname`` of the endpoint; ``connect`` inserts peers in the AV.
* ``put``/``get`` → ``fi_writemsg`` (``FI_DELIVERY_COMPLETE``) / ``fi_readmsg``; puts up to
  256 bytes are copied, so a blocking put returns at once; larger ones wait for completion.
* ``amo`` → ``fi_atomicmsg``/``fi_fetch_atomicmsg``/``fi_compare_atomicmsg`` (FETCH is
  ``FI_ATOMIC_READ``, SET/SWAP ``FI_ATOMIC_WRITE``). Ops that ``fi_*atomicvalid`` does not
  list, or that the rail option ``emulate=`` names, run as compare-and-swap loops. On ``shm``
  non-fetching AMOs are ``fi_inject_atomic`` and quiet flushes them with a fetching read.
  A PE's AMOs on its own words use the core's CPU atomic (libfabric's providers apply AMOs
  with the same CPU atomics at the target, so both are atomic with each other).
* ``fence`` = completion of the outstanding writes (no provider here orders put-then-AMO);
  ``quiet`` = completion of everything this endpoint issued.
* ``create_context`` → a context on the transport's own endpoint and CQ with its own counts
  of outstanding operations (each request names the context it counts in): its quiet and
  fence wait only for its own operations, and creating it opens nothing. With the rail option
  ``contexts=own``, a new endpoint on the same domain, AV and CQ instead (tcp;ofi_rxm: tens of
  MB of buffers and a connection to each peer on first use, 50-200 ms each).
"""

from __future__ import annotations

import logging
import os
import struct
import weakref
from collections.abc import Mapping
from typing import Any

from vkshmem.plugin import (
    AmoOp,
    PeerInfo,
    SegmentInfo,
    TransportContext,
    TransportError,
    TransportSpec,
    job_shm_name,
)

from . import NAME, SPEC
from ._datapath import DataPath, Shared, status
from ._ofi import ffi, lib
from ._options import KNOWN, amo_bit, parse_options

__all__ = ["OfiTransport", "libfabric_version"]

log = logging.getLogger("vkshmem.ofi")

_KEY = struct.Struct("<IQQQ")
_FI_MR_PROV_KEY = 1 << 6  # rdma/fabric.h

if any(getattr(lib, f"VK_{op.name}") != op.value for op in AmoOp):  # pragma: no cover
    raise ImportError("vkshmem_ofi: the native AMO op codes disagree with vkshmem's AmoOp")


def _version(v: int) -> str:
    return f"{v >> 16}.{v & 0xffff}"


def libfabric_version() -> str:
    """The libfabric loaded (``fi_version``) and the headers built against."""
    built = ffi.string(lib.vko_built_with()).decode()
    return (f"{_version(lib.vko_version())} (built against {built}, headers "
            f"{_version(lib.vko_build_version())})")


def _close_ctx(ctx: Any) -> None:
    lib.vko_close(ctx)



class OfiTransport(DataPath):
    """An ofi transport on one rail of one PE (or one context endpoint of it)."""

    spec: TransportSpec = SPEC

    def __init__(self, context: TransportContext) -> None:
        self._e: Any = None
        self._closed = False
        self.native_init()  # buffers of non-blocking operations, until quiet
        self._root: OfiTransport | None = None
        self._ctx_finalizer: weakref.finalize | None = None
        opts = parse_options(context)
        self._shared = sh = Shared(context, opts)
        err = ffi.new("char[]", lib.VKO_ERRLEN)
        ctx = lib.vko_open(opts.provider.encode(), (context.host_address or "").encode(),
                           context.n_pes, opts.poll_us,
                           opts.idle_poll_us, opts.busy_us, opts.spin_us, opts.timeout, err,
                           lib.VKO_ERRLEN)
        if ctx == ffi.NULL:
            raise TransportError(NAME, f"cannot open provider {opts.provider!r} (from "
                                 f"{opts.provider_from}): {ffi.string(err).decode()}; "
                                 f"`fi_info -l` lists the providers; known to work: "
                                 f"{', '.join(KNOWN)}")
        sh.ctx = ctx
        lib.vko_set_self(ctx, context.my_pe, getattr(context, "liveness_words", 0))
        lib.vko_set_context_endpoints(ctx, int(opts.contexts == "own"))
        self._ctx_finalizer = self.own(_close_ctx, ctx)
        try:
            sh.provider = ffi.string(lib.vko_provider(ctx)).decode()
            self._check_keys()
            self._open_endpoint()
            self._setup_amos()
        except BaseException:
            self.close()
            raise

    # -- set-up ---------------------------------------------------------------------------

    def _open_endpoint(self) -> None:
        err = ffi.new("char[]", lib.VKO_ERRLEN)
        e = lib.vko_ep_open(self._shared.ctx, job_shm_name(self._shared.context.my_pe).encode(),
                            err, lib.VKO_ERRLEN)
        if e == ffi.NULL:
            raise TransportError(NAME, f"cannot open an endpoint on {self._shared.provider}: "
                                 f"{ffi.string(err).decode()}")
        self._e = e
        self.set_held_flag(lib.vko_held_flag(e))

    def _check_keys(self) -> None:
        """Say so where the provider's memory keys hold fewer than 64 random bits: keys are
        what stops a stranger who reaches the endpoint from reading or writing the heap."""
        info = ffi.new("uint64_t[6]")
        lib.vko_info(self._shared.ctx, info)
        size = lib.vko_mr_key_size(self._shared.ctx)
        if size < 8 and not info[0] & _FI_MR_PROV_KEY and self._shared.context.my_pe == 0:
            log.warning("ofi %s: its memory keys are %d bytes, so vkshmem's keys are %d random "
                        "bits (not 64): a stranger reaching its endpoints has a 1 in 2**%d "
                        "chance per guess", self._shared.provider, size, 8 * size, 8 * size)

    def _setup_amos(self) -> None:
        sh, opts = self._shared, self._shared.options
        valid = lib.vko_amo_valid(sh.ctx)
        cas = all(valid & amo_bit(AmoOp.CSWAP, w, True) for w in (4, 8))
        wanted = [(op, w, f) for op in AmoOp for w in (4, 8) for f in (False, True)
                  if op != AmoOp.CSWAP and (f or not op.fetching_only)]
        missing = [(op, w, f) for op, w, f in wanted if not valid & amo_bit(op, w, f)]
        if not cas:
            raise TransportError(NAME, f"provider {sh.provider!r} has no 32- and 64-bit "
                                 "compare-and-swap, so its missing atomics cannot be emulated; "
                                 f"choose another provider (rail option provider= or "
                                 f"VKSHMEM_OFI_PROVIDER; known to work: {', '.join(KNOWN)})")
        lib.vko_set_emulation(sh.ctx, opts.emulate)
        emulated = {(op, w, f) for op, w, f in wanted if opts.emulate & amo_bit(op, w, f)}
        emulated |= set(missing)
        sh.emulated = tuple(sorted({("fetch_" if f and not op.fetching_only else "")
                                    + op.name.lower() + f"/{8 * w}" for op, w, f in emulated}))
        if missing:
            log.info("ofi %s: no native %s; emulated with compare-and-swap", sh.provider,
                     ", ".join(sh.emulated))
        inject = opts.inject_amo == "on" or (opts.inject_amo == "auto" and
                                             sh.provider.split(";")[0] == "shm")
        lib.vko_set_inject_amo(sh.ctx, int(inject))
        lib.vko_set_fence_quiet(sh.ctx, int(opts.fence == "quiet"))

    def address(self) -> bytes:
        """This PE's endpoint name (``fi_getname``)."""
        e = self._live()
        buf = ffi.new("char[]", lib.VKO_ADDR_MAX)
        size = ffi.new("size_t *", lib.VKO_ADDR_MAX)
        rc = lib.vko_ep_name(e, buf, size)
        if rc:
            raise TransportError(NAME, "cannot read the endpoint name", status=status(rc))
        return bytes(ffi.buffer(buf, size[0]))

    def carries(self, kind: str, dmabuf: bool = False) -> frozenset[str]:
        """The spec's operations, but no GPU memory where this build has no dma-buf
        registration path (libfabric < 1.20 headers): such a segment is not registered here
        and takes another route (the domain proxy), without an error."""
        if kind != "host" and not lib.vko_has_dmabuf():
            return frozenset()
        return super().carries(kind, dmabuf)

    def register(self, segment: SegmentInfo) -> bytes:
        """``fi_mr_reg`` the segment's memory (mapped by the core, not by us) and return its key
        blob. The memory must stay mapped until :meth:`close`."""
        self._live()
        # host memory registers as itself; other kinds through a dma-buf fd of the memory
        # (the segment's own where its kind is "dmabuf", else the one its domain exports)
        fd = -1 if segment.kind == "host" else (
            segment.dmabuf_fd if segment.dmabuf_fd >= 0 else
            segment.fd if segment.kind == "dmabuf" else -1)
        if segment.kind != "host" and fd < 0:
            raise TransportError(NAME, f"cannot register memory of kind {segment.kind!r} "
                                 "without a dma-buf fd (the ofi transport registers host "
                                 "memory only, and GPU memory whose domain exports a dma-buf)")
        if fd >= 0 and not lib.vko_has_dmabuf():
            raise TransportError(NAME, f"cannot register dma-buf segment {segment.seg_id}: "
                                 f"this build's libfabric ({libfabric_version()}) has no "
                                 "FI_MR_DMABUF (libfabric 1.20+: rebuild vkshmem-ofi with "
                                 "VKSHMEM_OFI_PREFIX=<its prefix>)")
        if fd >= 0 and "ofi_rxm" in self._shared.provider:
            raise TransportError(NAME, f"the {self._shared.provider} provider cannot register "
                                 f"dma-buf segment {segment.seg_id}: libfabric's rxm layer "
                                 "accepts FI_MR_DMABUF registrations whose RMA then fails "
                                 "(libfabric 2.5 over tcp: canceled); its traffic takes another "
                                 "route; VKSHMEM_OFI_PROVIDER (or the rail option provider=) "
                                 "chooses a provider that registers dma-bufs itself")
        if not 0 <= segment.seg_id < lib.VKO_MAX_SEGS:
            raise TransportError(NAME, f"segment id {segment.seg_id} is out of range "
                                 f"(0..{lib.VKO_MAX_SEGS - 1})")
        key = ffi.new("uint64_t *")
        base = ffi.new("uint64_t *")
        rc = lib.vko_mr_reg(self._shared.ctx, segment.address, segment.size, fd, key, base)
        if rc and fd >= 0:
            raise TransportError(NAME, f"the {self._shared.provider} provider refused dma-buf "
                                 f"segment {segment.seg_id} ({segment.size} bytes, fd {fd}; "
                                 "fi_mr_regattr with FI_MR_DMABUF): its traffic takes another "
                                 "route; VKSHMEM_OFI_PROVIDER (or the rail option provider=) "
                                 "chooses a provider that registers dma-bufs",
                                 status=status(rc))
        if rc:
            raise TransportError(NAME, f"cannot register segment {segment.seg_id} "
                                 f"({segment.size} bytes at {segment.address:#x}) with "
                                 f"{self._shared.provider}", status=status(rc))
        if segment.kind == "host":
            self._shared.local[segment.seg_id] = (segment.address, segment.size)
        return _KEY.pack(segment.seg_id, base[0], segment.size, key[0])

    def connect(self, peers: Mapping[int, PeerInfo]) -> None:
        """Insert every peer's endpoint name in the AV and record its segment keys. May be
        called again (e.g. after new segments were registered)."""
        sh = self._shared
        self._live()
        for pe, info in peers.items():
            if not self.reaches(info):
                continue
            assert info.address is not None
            rc = lib.vko_peer_set(sh.ctx, pe, info.address, len(info.address))
            if rc:
                raise TransportError(NAME, f"PE {pe}: unusable endpoint name",
                                     status=status(rc))
            sizes = {}
            for seg_id, blob in info.rkeys.items():
                if len(blob) != _KEY.size:
                    raise TransportError(NAME, f"PE {pe} published an unreadable key for "
                                         f"segment {seg_id}")
                sid, base, size, key = _KEY.unpack(blob)
                if sid != seg_id:
                    raise TransportError(NAME, f"PE {pe}'s key for segment {seg_id} names "
                                         f"segment {sid}")
                rc = lib.vko_peer_seg(sh.ctx, pe, sid, base, size, key)
                if rc:
                    raise TransportError(NAME, f"PE {pe}: unusable key for segment {sid}",
                                         status=status(rc))
                sizes[sid] = size
            with sh.lock:
                sh.peers.setdefault(pe, {}).update(sizes)
        # the busy window spins unless this node has more PEs than CPUs (then it yields)
        node = 1 + sum(1 for pe, info in peers.items()
                       if info.same_node and pe != sh.context.my_pe)
        sh.busy_yield = node > (os.cpu_count() or 1)
        lib.vko_set_busy_yield(sh.ctx, int(sh.busy_yield))

    def reaches(self, peer: PeerInfo) -> bool:
        """Peers that published an address (on ``shm``, only those on this node)."""
        if peer.address is None:
            return False
        return peer.same_node or self._shared.provider.split(";")[0] != "shm"
