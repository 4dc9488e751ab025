"""The Vulkan instance: loader, validation layer and messenger, and the choice of device.

:func:`create_instance` makes a Vulkan 1.2 instance, with the Khronos validation layer and a
:class:`Messenger` recording what it reports when asked. :func:`list_devices` lists the physical
devices (:mod:`~vkshmem.gpu.vk.physical`) in vkshmem's order.

Which physical device (:func:`choose_physical`): ``index`` if given, else
``VKSHMEM_GPU_DEVICE`` if set, else ``local_rank`` modulo the number of GPUs (CPU drivers such
as lavapipe are used only when no GPU exists, or when picked by index). Devices are numbered
GPUs first (discrete, integrated, virtual, other), CPU drivers last; :func:`list_devices` shows
the order.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from vkshmem.core.errors import ConfigError, FeatureNotAvailableError, InvalidArgumentError

from ..env import ENV_DEVICE, settings
from ._vk import c_strings, check, cstr, icd_hint, keep, load
from .physical import DeviceInfo, PhysicalDevice, physical_devices

__all__ = ["Messenger", "choose_physical", "create_instance", "list_devices"]

log = logging.getLogger("vkshmem.gpu")

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
EXT_DEBUG_UTILS = "VK_EXT_debug_utils"
_SEVERITY = {0x1: "verbose", 0x10: "info", 0x100: "warning", 0x1000: "error"}


class Messenger:
    """Records what the validation layer reports (warnings and errors), from any thread."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        vk = load()

        def callback(severity: int, types: int, data: Any, user: Any) -> int:
            try:
                ident = vk.ffi.string(data.pMessageIdName).decode() if data.pMessageIdName \
                    != vk.ffi.NULL else ""
                text = vk.ffi.string(data.pMessage).decode(errors="replace") if data.pMessage \
                    != vk.ffi.NULL else ""
                sev = _SEVERITY.get(severity, str(severity))
                with self._lock:
                    self.messages.append((sev, ident, text))
                if sev == "error":
                    log.error("Vulkan validation: %s", text)
                else:
                    log.warning("Vulkan validation: %s", text)
            except BaseException:  # never let an exception unwind through the driver
                pass
            return 0

        self.callback = vk.ffi.callback("PFN_vkDebugUtilsMessengerCallbackEXT", callback)
        self.create_info = vk.ffi.new("VkDebugUtilsMessengerCreateInfoEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            "messageSeverity": 0x100 | 0x1000,
            "messageType": 0x1 | 0x2 | 0x4,
            "pfnUserCallback": self.callback,
        })

    @property
    def errors(self) -> list[str]:
        with self._lock:
            return [f"[{i}] {t}" for s, i, t in self.messages if s == "error"]


def _layers(vk: Any) -> set[str]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    check(lib.vkEnumerateInstanceLayerProperties(n, ffi.NULL), "vkEnumerateInstanceLayerProperties")
    props = ffi.new("VkLayerProperties[]", n[0])
    check(lib.vkEnumerateInstanceLayerProperties(n, props), "vkEnumerateInstanceLayerProperties")
    return {cstr(vk, props[i].layerName) for i in range(n[0])}


def _instance_extensions(vk: Any) -> set[str]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    check(lib.vkEnumerateInstanceExtensionProperties(ffi.NULL, n, ffi.NULL),
          "vkEnumerateInstanceExtensionProperties")
    props = ffi.new("VkExtensionProperties[]", n[0])
    check(lib.vkEnumerateInstanceExtensionProperties(ffi.NULL, n, props),
          "vkEnumerateInstanceExtensionProperties")
    return {cstr(vk, props[i].extensionName) for i in range(n[0])}


def _layer_extensions(vk: Any) -> set[str]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    name = ffi.new("char[]", VALIDATION_LAYER.encode())
    if lib.vkEnumerateInstanceExtensionProperties(name, n, ffi.NULL) != 0:
        return set()
    props = ffi.new("VkExtensionProperties[]", n[0])
    lib.vkEnumerateInstanceExtensionProperties(name, n, props)
    return {cstr(vk, props[i].extensionName) for i in range(n[0])}


def create_instance(vk: Any, validation: bool, messenger: Messenger | None,
                    store: list[Any]) -> Any:
    """A Vulkan 1.2 instance, with the validation layer and ``messenger`` if ``validation``;
    what its structs point to is held in ``store``."""
    ffi, lib = vk.ffi, vk.lib
    layers: list[str] = []
    exts: list[str] = []
    if validation:
        if VALIDATION_LAYER not in _layers(vk):
            raise FeatureNotAvailableError(
                f"the Vulkan validation layer {VALIDATION_LAYER} is not installed: apt-get "
                "install vulkan-validationlayers (or run without validation)")
        if EXT_DEBUG_UTILS not in _instance_extensions(vk) | _layer_extensions(vk):
            raise FeatureNotAvailableError(f"instance extension {EXT_DEBUG_UTILS} is missing")
        layers.append(VALIDATION_LAYER)
        exts.append(EXT_DEBUG_UTILS)
    app = keep(store, ffi.new("VkApplicationInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
        "pApplicationName": keep(store, ffi.new("char[]", b"vkshmem")),
        "pEngineName": keep(store, ffi.new("char[]", b"vkshmem")),
        "apiVersion": vk.API_VERSION_1_2,
    }))
    lay, nlay = c_strings(vk, layers, store)
    ext, next_ = c_strings(vk, exts, store)
    info = keep(store, ffi.new("VkInstanceCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        # Chained so that vkCreateInstance/vkDestroyInstance (leak reports) are covered too.
        "pNext": messenger.create_info if messenger else ffi.NULL,
        "pApplicationInfo": app,
        "enabledLayerCount": nlay, "ppEnabledLayerNames": lay,
        "enabledExtensionCount": next_, "ppEnabledExtensionNames": ext,
    }))
    out = ffi.new("VkInstance*")
    res = lib.vkCreateInstance(info, ffi.NULL, out)
    if res == vk.VK_ERROR_INCOMPATIBLE_DRIVER:
        raise FeatureNotAvailableError(f"no Vulkan 1.2 driver could be loaded; {icd_hint()}")
    if res == vk.VK_ERROR_LAYER_NOT_PRESENT:
        raise FeatureNotAvailableError(
            "the Vulkan validation layer could not be loaded: apt-get install "
            "vulkan-validationlayers")
    check(res, "vkCreateInstance")
    return out[0]


def list_devices() -> list[DeviceInfo]:
    """Every Vulkan physical device, in vkshmem's order (GPUs first, CPU drivers last)."""
    vk = load()
    store: list[Any] = []
    instance = create_instance(vk, False, None, store)
    try:
        return [PhysicalDevice(vk, pd, i).info
                for i, pd in enumerate(physical_devices(vk, instance))]
    finally:
        vk.lib.vkDestroyInstance(instance, vk.ffi.NULL)


def _choose(n_total: int, infos: list[DeviceInfo], index: int | None, local_rank: int) -> int:
    if index is None:
        index = settings().device  # VKSHMEM_GPU_DEVICE, parsed once with the domain's others
        if index is not None:
            if not 0 <= index < n_total:
                raise ConfigError(ENV_DEVICE, f"device {index} does not exist; devices: "
                                  + ", ".join(f"{d.index}={d.name}" for d in infos))
            return index
        gpus = [d.index for d in infos if not d.is_cpu]
        pool = gpus or [d.index for d in infos]
        return pool[local_rank % len(pool)]
    if not 0 <= index < n_total:
        raise InvalidArgumentError(f"Vulkan device {index} does not exist; devices: "
                                   + ", ".join(f"{d.index}={d.name}" for d in infos))
    return index



def choose_physical(vk: Any, instance: Any, index: int | None, local_rank: int
                    ) -> PhysicalDevice:
    """The physical device of ``instance`` that a PE opens (see module doc)."""
    handles = physical_devices(vk, instance)
    if not handles:
        raise FeatureNotAvailableError(f"Vulkan found no device; {icd_hint()}")
    infos = [PhysicalDevice(vk, h, i).info for i, h in enumerate(handles)]
    chosen = _choose(len(handles), infos, index, local_rank)
    return PhysicalDevice(vk, handles[chosen], chosen)
