"""The entry point of the ``vulkan`` memory domain (group ``vkshmem.domains``).

Declared in vkshmem's own ``pyproject.toml`` exactly as a third party declares its domain;
importing this module imports no Vulkan binding: the domain is built on first use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vkshmem.core.config import Config
from vkshmem.core.domains.contract import DomainContext, DomainSpec, MemoryDomain
from vkshmem.core.plugins.hookspecs import hookimpl

from .env import VARIABLES, settings

__all__ = ["SPEC", "register_domains"]

log = logging.getLogger("vkshmem")


def _open(ctx: DomainContext) -> MemoryDomain:
    from .domain.vulkan import VulkanDomain

    return VulkanDomain(SPEC, ctx)


def _has_gpu(config: Config) -> bool:
    """Whether this PE's Vulkan device would be a GPU (not a CPU driver such as lavapipe)."""
    try:
        from .vk.instance import list_devices

        devices = list_devices()
    except Exception as exc:  # no loader, driver or binding
        log.info("domain='auto': no Vulkan GPU (%s)", exc)
        return False
    pick = settings().device
    if pick is None:
        return any(not d.is_cpu for d in devices)
    return pick < len(devices) and not devices[pick].is_cpu


def _has_device(config: Config) -> bool:
    """Whether a Vulkan device (a GPU or a CPU driver such as lavapipe) can be opened here."""
    from .vk.instance import list_devices

    return bool(list_devices())


SPEC = DomainSpec(
    name="vulkan", factory=_open, family="gpu", priority=10, accelerator=_has_gpu,
    available=_has_device,
    description="exportable Vulkan device memory (any vendor; lavapipe on the CPU)",
    size_variable="VKSHMEM_GPU_SYMMETRIC_SIZE",
    memory_kinds=frozenset({"opaque_fd", "dmabuf"}),  # dmabuf: drivers with the extension
    variables=VARIABLES,  # vkshmem info lists them with their values (env.py parses them)
)


@hookimpl
def register_domains(register: Callable[[Any], None]) -> None:
    """The Vulkan GPU domain."""
    register(SPEC)
