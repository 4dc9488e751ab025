"""The native submission helper (:mod:`vkshmem.gpu._submit`, see ``_submit_build.py``) bound to
one device: handles and prebuilt structs are passed to C as integers, and every call releases
the GIL. Absent (not built) or switched off (``VKSHMEM_GPU_NATIVE=0``), the Python path runs."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from vkshmem.core.config import registry
from vkshmem.core.errors import ConfigError

from ..env import ENV_NATIVE

if TYPE_CHECKING:
    from .logical import LogicalDevice

__all__ = ["NativeSubmit", "open_native"]

log = logging.getLogger("vkshmem.gpu")


class NativeSubmit:
    """The native submission helper bound to one device (see ``_submit_build.py``): handles
    and prebuilt structs are passed to C as addresses; every call releases the GIL."""

    def __init__(self, lib: Any, ffi: Any, handle: Any) -> None:
        self.lib = lib
        self.ffi = ffi
        self.dev = handle

    def close(self) -> None:
        if self.dev != self.ffi.NULL:
            self.lib.vks_close(self.dev)
            self.dev = self.ffi.NULL


def open_native(vk: Any, device: LogicalDevice) -> NativeSubmit | None:
    """The native submission path for ``device``, or None (Python's) when the helper was not
    built or ``VKSHMEM_GPU_NATIVE`` is off (a boolean, declared in the core's registry)."""
    var = registry[ENV_NATIVE]
    text = os.environ.get(ENV_NATIVE, var.default)
    try:
        enabled = var.parse(text)
    except ValueError as exc:
        raise ConfigError(ENV_NATIVE, f"bad value {text!r}: {exc}") from None
    if not enabled:
        return None
    try:
        from .._submit import ffi as native_ffi
        from .._submit import lib as native_lib
    except ImportError as exc:
        log.info("vkshmem.gpu: no native submission helper (%s): the Python path is used", exc)
        return None
    ffi = vk.ffi

    def addr(x: Any) -> int:
        return int(ffi.cast("uintptr_t", x))

    handle = native_lib.vks_open(
        addr(ffi.addressof(vk.lib, "vkGetDeviceProcAddr")), addr(device.handle),
        addr(device._begin_info), addr(device._barrier_in), addr(device._barrier_out),
        addr(device._barrier_mid), vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
        vk.VK_PIPELINE_STAGE_HOST_BIT)
    if handle == native_ffi.NULL:
        log.warning("vkshmem.gpu: the native submission helper found no Vulkan functions; "
                    "the Python path is used")
        return None
    return NativeSubmit(native_lib, native_ffi, handle)

