"""Host segments for hand-made jobs: what the core's heap gives a transport to register."""

from __future__ import annotations

import mmap

from vkshmem.core.heap import HostSegment

__all__ = ["Segment"]


class Segment(HostSegment):
    """A memfd-backed symmetric host segment, built by the core's own heap code."""

    def __init__(self, seg_id: int, size: int) -> None:
        super().__init__(seg_id, size, f"vkshmem-test-{seg_id}")

    @property
    def map(self) -> mmap.mmap:
        """The mapping itself."""
        return self._map

    @property
    def view(self) -> memoryview:
        """A memoryview of the whole segment."""
        return self.buffer
