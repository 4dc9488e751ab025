"""vkshmem/gpu/peermap.py on lavapipe: what a PE does with a peer's heap fd when it tries to
map that heap on the CPU through a Vulkan device of its own (the two-GPU case itself runs on
NVIDIA: tests/test_gpu_multipe.py::test_gpu_link[cuda-bar]). Here every refusal must close
the fd and leave no device open."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest
from gpu.helpers import device_fixture, fd_count

from vkshmem.gpu import VulkanDevice
from vkshmem.gpu.peermap import PeerMaps


@pytest.fixture(scope="module")
def dev() -> Iterator[VulkanDevice]:
    yield from device_fixture()


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_unknown_gpu_closes_the_fd(dev: VulkanDevice) -> None:
    """A heap on a GPU Vulkan does not list: None, the fd closed, no device opened."""
    mem = dev.alloc_exportable(1 << 16)
    try:
        info = dataclasses.replace(mem.export_info(), device_uuid=b"\xee" * 16)
        fd = mem.export_fd()
        maps = PeerMaps(0, 5.0)
        assert maps.map(fd, info) is None
        assert _closed(fd)
        assert maps._devices == {}
        maps.close()
    finally:
        mem.free()


def test_cached_heap_is_not_mapped(dev: VulkanDevice) -> None:
    """lavapipe's memory is host-cached, not a write-combined BAR: the import succeeds on a
    second device, is freed again and the call says None; close() closes that device and no
    fd stays open."""
    mem = dev.alloc_exportable(1 << 16)
    try:
        if not mem.host_visible or not mem.host_cached:
            pytest.skip("this device's exportable memory is not host-cached (not lavapipe)")
        before = fd_count()
        maps = PeerMaps(0, 5.0)
        fd = mem.export_fd()
        assert maps.map(fd, mem.export_info()) is None
        assert _closed(fd)  # Vulkan took it, and freed the import
        opened = [d for d in maps._devices.values() if d is not None]
        assert len(opened) == 1 and opened[0]._memories == {}
        maps.close()
        assert maps._devices == {}
        assert fd_count() == before
    finally:
        mem.free()
