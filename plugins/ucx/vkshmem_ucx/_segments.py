"""Registering segments and learning peers' keys: the half of
:class:`~vkshmem_ucx._transport.UcxTransport` that deals with memory (a mixin).

A key blob is ``<IIQQ`` (segment id, flags, base address, size) + the packed rkey; flag
:data:`DEVICE` marks device memory (a ``cuda_va`` segment, mapped with
``UCS_MEMORY_TYPE_CUDA``): peers never reach it through a ``ucp_rkey_ptr`` mapping, and no AMO
on it is carried (the core sends those through the memory domain's proxy).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vkshmem.plugin import AMO, PeerInfo, SegmentInfo, TransportError

from . import NAME, SPEC
from ._library import status as _status
from ._options import heap_unshared
from ._ucx import ffi, lib

if TYPE_CHECKING:
    from ._transport import _Shared

__all__ = ["DEVICE", "KEY", "Segments"]

log = logging.getLogger("vkshmem.ucx")

KEY = struct.Struct("<IIQQ")
DEVICE = 1  # key flag: the segment is device memory
_new = ffi.new


class Segments:
    """``register``/``carries``/``connect`` of :class:`~vkshmem_ucx._transport.UcxTransport`
    (which sets ``_shared`` and defines ``_live``)."""

    _shared: _Shared

    if TYPE_CHECKING:
        def _live(self) -> Any: ...

    def register(self, segment: SegmentInfo) -> bytes:
        """``ucp_mem_map`` the segment's memory (already mapped by the core) and return its key
        blob: segment id, base address and size, then the packed rkey. The memory must stay
        mapped until :meth:`close`."""
        self._live()
        if segment.kind not in SPEC.memory_kinds:
            raise TransportError(NAME, f"cannot register memory of kind {segment.kind!r}; "
                                 "the ucx transport registers "
                                 f"{' and '.join(sorted(SPEC.memory_kinds))} memory only")
        cuda = segment.kind == "cuda_va"
        if not 0 <= segment.seg_id < lib.VKU_MAX_SEGS:
            raise TransportError(NAME, f"segment id {segment.seg_id} is out of range "
                                 f"(0..{lib.VKU_MAX_SEGS - 1})")
        sh = self._shared
        buf = ffi.new("char[]", lib.VKU_RKEY_MAX)
        size = ffi.new("size_t *", lib.VKU_RKEY_MAX)
        heap = sh.options.heap
        in_place = heap == "ucx" or (heap == "auto" and sh.context.rail == 0
                                     and heap_unshared(sh.context))
        alloc = _new("int *", int(segment.fd >= 0 and not cuda and not sh.connected
                                  and in_place))
        rc = lib.vku_mem_map(sh.ctx, segment.address, segment.size, segment.fd, int(cuda),
                             alloc, buf, size)
        if rc:
            hint = " (a UCX with CUDA support and its cuda_copy transport in UCX_TLS are " \
                "needed for CUDA memory)" if cuda else ""
            raise TransportError(NAME, f"cannot register {segment.kind} segment "
                                 f"{segment.seg_id} ({segment.size} bytes at "
                                 f"{segment.address:#x}){hint}", status=_status(rc))
        if alloc[0]:
            sh.allocated.add(segment.seg_id)
            log.debug("ucx: segment %d (%d bytes) allocated by UCX in place", segment.seg_id,
                      segment.size)
        if cuda:
            sh.device.add(segment.seg_id)  # never touched by this PE's CPU atomics
        else:
            sh.local[segment.seg_id] = (segment.address, segment.size)
        flags = DEVICE if cuda else 0
        return KEY.pack(segment.seg_id, flags, segment.address, segment.size) + \
            bytes(ffi.buffer(buf, size[0]))

    def carries(self, kind: str, dmabuf: bool = False) -> frozenset[str]:
        """Puts and gets on every kind it registers; AMOs on host memory only (UCX would apply
        them to CUDA memory with the CPU), and on no memory domain's segment with the rail
        option ``domain_amo=proxy`` (their owner applies them: atomic with its own atomics
        whatever UCX_ATOMIC_MODE). Not consulted for the host heap, whose AMOs UCX always
        carries."""
        ops = SPEC.ops_on(kind, dmabuf)
        if self._shared.options.domain_amo == "proxy":
            ops -= {AMO}
        return ops

    def connect(self, peers: Mapping[int, PeerInfo]) -> None:
        """Record every peer's worker address and segment keys; endpoints open on first use.
        May be called again (e.g. after new segments were registered)."""
        w = self._live()
        sh = self._shared
        sh.connected = True  # segments registered from now on are not the core's heap
        for pe, info in peers.items():
            if info.address is None:
                continue
            segs: dict[int, tuple[int, int, int, bytes]] = {}
            for seg_id, blob in info.rkeys.items():
                if len(blob) <= KEY.size:
                    raise TransportError(NAME, f"PE {pe} published an unreadable key for "
                                         f"segment {seg_id}")
                sid, flags, base, size = KEY.unpack_from(blob)
                if sid != seg_id:
                    raise TransportError(NAME, f"PE {pe}'s key for segment {seg_id} names "
                                         f"segment {sid}")
                segs[sid] = (base, size, flags, blob[KEY.size:])
                if flags & DEVICE:
                    sh.device.add(sid)
            with sh.lock:
                sh.peers[pe] = (bytes(info.address), segs)
            self._feed(w, pe, bytes(info.address), segs)

    def _feed(self, w: Any, pe: int, address: bytes,
              segs: Mapping[int, tuple[int, int, int, bytes]]) -> None:
        rc = lib.vku_peer_set(w, pe, address, len(address))
        if rc:
            raise TransportError(NAME, f"PE {pe}: unusable worker address", status=_status(rc))
        for sid, (base, size, flags, key) in segs.items():
            rc = lib.vku_peer_seg(w, pe, sid, base, size, int(flags & DEVICE), key, len(key))
            if rc:
                raise TransportError(NAME, f"PE {pe}: unusable key for segment {sid}",
                                     status=_status(rc))
