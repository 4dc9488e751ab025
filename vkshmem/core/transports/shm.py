"""The core's built-in ``shm`` path: direct load/store into same-node peers' mapped segments.

Peers' memfd segments arrive through :mod:`fdshare` and are mapped here; copies and AMOs are
native (``_native``), so an 8-byte put is one memcpy and AMOs are the same hardware atomics the
transports' progress threads use. ``VKSHMEM_SHM=0`` switches it off.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping

from .._native import ffi, lib
from ..errors import InvalidArgumentError, TransportError
from .contract import AmoOp, PeerInfo, SegmentInfo, Transport, TransportSpec

__all__ = ["SHM_SPEC", "ShmTransport"]

#: What the native calls' error codes mean (see _native_build.py).
_NATIVE_ERRORS = {
    -1: "outside every segment", -2: "outside the segment", -3: "that PE's segment is not "
    "mapped here", -4: "misaligned AMO", -5: "segment id or PE out of range",
    -6: "unsupported AMO op or width",
}


def _check(rc: int, what: str, pe: int, seg: int, offset: int, n: int) -> None:
    if rc:
        raise InvalidArgumentError(f"shm: {what} {n} bytes at offset {offset} of segment {seg} "
                                   f"of PE {pe}: {_NATIVE_ERRORS.get(rc, f'error {rc}')}")


class ShmTransport(Transport):
    """Same-node direct access; the route to every same-node PE while ``VKSHMEM_SHM=1``."""

    def __init__(self, my_pe: int) -> None:
        self.my_pe = my_pe
        self.maps: dict[tuple[int, int], mmap.mmap] = {}

    def register(self, segment: SegmentInfo) -> bytes:
        lib.vk_set_peer(segment.seg_id, self.my_pe, segment.address)
        return b""

    def attach(self, pe: int, seg_id: int, fd: int, size: int) -> None:
        """Map peer ``pe``'s segment ``seg_id`` from its fd (closed here once mapped)."""
        try:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise TransportError("shm", f"cannot map PE {pe}'s segment {seg_id}: {exc}") from None
        finally:
            os.close(fd)
        cdata = ffi.from_buffer(mm)
        lib.vk_set_peer(seg_id, pe, int(ffi.cast("uintptr_t", cdata)))
        ffi.release(cdata)
        self.maps[(seg_id, pe)] = mm

    def peer_buffer(self, pe: int, seg_id: int) -> mmap.mmap | None:
        """The mapping of a peer's segment (None for this PE or an unmapped peer)."""
        return self.maps.get((seg_id, pe))

    def address(self) -> bytes:
        return b""

    def connect(self, peers: Mapping[int, PeerInfo]) -> None:
        pass  # mapping happens through attach()

    def reaches(self, peer: PeerInfo) -> bool:
        return peer.same_node

    # The native calls check their own arguments; a bad one raises here (nothing is touched).
    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        rc = -2 if offset < 0 else lib.vk_shm_put(seg, pe, offset, ffi.from_buffer(src),
                                                  src.nbytes)
        _check(rc, "put of", pe, seg, offset, src.nbytes)

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        rc = -2 if offset < 0 else lib.vk_shm_get(
            seg, pe, offset, ffi.from_buffer(dst, require_writable=True), dst.nbytes)
        _check(rc, "get of", pe, seg, offset, dst.nbytes)

    def amo(self, pe: int, seg: int, offset: int, op: AmoOp, width: int,
            operand: int, compare: int, fetch: bool) -> int:
        if offset < 0:
            _check(-2, "AMO on", pe, seg, offset, width)
        old = int(lib.vk_shm_amo(seg, pe, offset, op, width, operand, compare))
        if old == lib.VK_SENTINEL:
            _check(lib.vk_last_error(), "AMO on", pe, seg, offset, width)
        return old

    def fence(self) -> None:
        lib.vk_fence()

    def quiet(self) -> None:
        lib.vk_fence()

    def close(self) -> None:
        for (seg_id, pe), mm in self.maps.items():
            lib.vk_set_peer(seg_id, pe, 0)
            try:
                mm.close()
            except BufferError:
                pass  # a ptr() view is still alive; unmapped at exit
        self.maps.clear()


SHM_SPEC = TransportSpec(
    name="shm", factory=lambda ctx: ShmTransport(ctx.my_pe), priority=1000,
    reach=frozenset({"intra"}),
    description="core: same-node load/store into peers' mapped memfd segments (VKSHMEM_SHM)",
)
ShmTransport.spec = SHM_SPEC
