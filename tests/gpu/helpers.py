"""Shared by the GPU tests (tests/test_gpu_*.py): a validated lavapipe device per module.

Every test runs with the Khronos validation layer on; a module's device fixture fails the
module if the layer reported any error (leak reports at vkDestroyDevice/vkDestroyInstance
included), and ``no_new_errors`` fails the test that caused one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from vkshmem.core.errors import FeatureNotAvailableError
from vkshmem.gpu import VulkanDevice

#: Seconds any single GPU wait may take in tests before GpuTimeoutError.
TIMEOUT = 20.0


def open_device(**kwargs: object) -> VulkanDevice:
    """A validated device, or a skip naming what is missing (the suite's set-up installs
    mesa-vulkan-drivers, vulkan-validationlayers and the vulkan package, so this runs)."""
    kwargs.setdefault("validation", True)
    kwargs.setdefault("timeout", TIMEOUT)
    try:
        return VulkanDevice(**kwargs)  # type: ignore[arg-type]
    except FeatureNotAvailableError as exc:
        if os.environ.get("VKSHMEM_GPU_TESTS") == "require":
            raise
        pytest.skip(f"no usable Vulkan: {exc}")


def device_fixture(**kwargs: object) -> Iterator[VulkanDevice]:
    dev = open_device(**kwargs)
    try:
        yield dev
    finally:
        dev.close()
    assert dev.validation_errors == [], "\n".join(dev.validation_errors)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_targets() -> dict[int, str]:
    """This process's open fds and what they point at (readable in a failed assertion)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own fd, closed by now
            pass
    return out
