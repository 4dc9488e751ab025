"""The core's memfd host segment, with the names the transport unit tests use."""

from __future__ import annotations

import mmap

from vkshmem.core.heap import HostSegment


class Segment(HostSegment):
    """A symmetric host segment built by the core's own :class:`HostSegment`."""

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
