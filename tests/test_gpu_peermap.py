"""vkshmem/gpu/domain/peermap.py on lavapipe: what a PE does with a peer's heap fd when it tries to
map that heap on the CPU through a Vulkan device of its own (the two-GPU case itself runs on
NVIDIA: tests/test_gpu_multipe.py::test_gpu_link[cuda-bar]). Here every refusal must close
the fd and leave no device open."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from gpu.helpers import device_fixture, fd_count

from vkshmem.gpu import VulkanDevice
from vkshmem.gpu.domain.peermap import PeerMaps


@pytest.fixture(scope="module")
def dev() -> Iterator[VulkanDevice]:
    yield from device_fixture()


def _refused(dev: VulkanDevice, **export: object) -> None:
    """A heap whose export info differs by ``export``: None, its fd closed, no device."""
    mem = dev.alloc_exportable(1 << 16)
    try:
        info = dataclasses.replace(mem.export_info(), **export)
        before = fd_count()
        maps = PeerMaps(0, 5.0)
        assert maps.map(mem.export_fd(), info) is None
        assert fd_count() == before
        assert maps._devices == {}
        maps.close()
    finally:
        mem.free()


def test_unknown_gpu_closes_the_fd(dev: VulkanDevice) -> None:
    """A heap on a GPU Vulkan does not list."""
    _refused(dev, device_uuid=b"\xee" * 16)


def test_type_outside_host_visible_opens_no_device(dev: VulkanDevice) -> None:
    """A heap whose memory type the GPU does not list as host-visible (here: one it does not
    list at all): no device opened only to find that out."""
    _refused(dev, memory_type_index=len(dev.info.memory_types))


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
        assert maps.map(mem.export_fd(), mem.export_info()) is None
        opened = [d for d in maps._devices.values() if d is not None]
        assert len(opened) == 1 and opened[0]._memories == {}  # the import was freed
        maps.close()
        assert maps._devices == {}
        assert fd_count() == before  # the fd (Vulkan's after the import) and the device's
    finally:
        mem.free()
