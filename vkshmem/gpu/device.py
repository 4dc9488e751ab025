"""A Vulkan device opened for vkshmem: instance, physical device, compute queue, command pool.

:class:`VulkanDevice` is the one object the rest of the layer hangs off: memory
(:meth:`~VulkanDevice.alloc_exportable`, :meth:`~VulkanDevice.import_fd`), copies
(:meth:`~VulkanDevice.write`, :meth:`~VulkanDevice.read`, :meth:`~VulkanDevice.copy`), shader
work (:meth:`~VulkanDevice.amo`, :meth:`~VulkanDevice.reduce`, :meth:`~VulkanDevice.pipeline`).

Which physical device: ``index`` if given, else ``VKSHMEM_GPU_DEVICE`` if set, else
``local_rank`` modulo the number of GPUs (CPU drivers such as lavapipe are used only when no GPU
exists, or when picked by index). Devices are numbered GPUs first (discrete, integrated,
virtual, other), CPU drivers last; :func:`list_devices` shows the order.

Threads: every method may be called from any thread. Each engine (the staging copies, each
pipeline, the AMO kernels) has its own lock held for a whole operation; the device lock is held
only while recording and submitting (Vulkan requires external synchronisation of the command
pool and the queue), never while waiting for the GPU.
Every wait for the GPU has a timeout (``timeout=``, default ``VKSHMEM_GPU_TIMEOUT`` seconds)
and raises :class:`~vkshmem.gpu.errors.GpuTimeoutError` instead of hanging.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError

from ._vk import check, icd_hint, load
from .errors import GpuError, GpuTimeoutError

if TYPE_CHECKING:
    from .copy import Transfer
    from .kernels import Kernels
    from .memory import GpuMemory
    from .pipeline import ComputePipeline

__all__ = ["SHADER_FEATURES", "DeviceInfo", "VulkanDevice", "list_devices"]

log = logging.getLogger("vkshmem.gpu")

#: Environment variables this layer reads (the core's config registry lists them too).
ENV_DEVICE = "VKSHMEM_GPU_DEVICE"
ENV_TIMEOUT = "VKSHMEM_GPU_TIMEOUT"
ENV_STAGING = "VKSHMEM_GPU_STAGING_SIZE"
ENV_SPIN = "VKSHMEM_GPU_SPIN_US"
DEFAULT_SPIN_US = 200.0
DEFAULT_TIMEOUT = 30.0
DEFAULT_STAGING = 8 << 20

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
EXT_DEBUG_UTILS = "VK_EXT_debug_utils"
EXT_EXTERNAL_MEMORY_FD = "VK_KHR_external_memory_fd"
EXT_DMA_BUF = "VK_EXT_external_memory_dma_buf"

#: Optional shader features recorded in :attr:`DeviceInfo.shader_features` (and enabled when
#: the device has them), by Vulkan name -> where Vulkan reports it (VkPhysicalDeviceFeatures,
#: VkPhysicalDeviceVulkan11Features, VkPhysicalDeviceVulkan12Features). The 8/16-bit ones are
#: what reduce.comp's small-type variants need.
SHADER_FEATURES = {
    "shaderInt16": "core",
    "shaderInt64": "core",
    "shaderFloat64": "core",
    "storageBuffer16BitAccess": "1.1",
    "uniformAndStorageBuffer16BitAccess": "1.1",
    "shaderInt8": "1.2",
    "shaderFloat16": "1.2",
    "storageBuffer8BitAccess": "1.2",
    "uniformAndStorageBuffer8BitAccess": "1.2",
}

_TYPE_NAMES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}
_TYPE_ORDER = {2: 0, 1: 1, 3: 2, 0: 3, 4: 4}
_VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x10005: "Mesa",
            0x13B5: "ARM", 0x5143: "Qualcomm", 0x106B: "Apple"}

# VkMemoryPropertyFlagBits
MEM_DEVICE_LOCAL = 0x1
MEM_HOST_VISIBLE = 0x2
MEM_HOST_COHERENT = 0x4
MEM_HOST_CACHED = 0x8

_SEVERITY = {0x1: "verbose", 0x10: "info", 0x100: "warning", 0x1000: "error"}


@dataclass(frozen=True)
class DeviceInfo:
    """What a physical device is and what it can do for vkshmem."""

    index: int
    name: str
    vendor_id: int
    vendor: str
    device_type: str
    api_version: str
    driver_name: str
    driver_info: str
    driver_version: int
    device_uuid: bytes
    driver_uuid: bytes
    external_memory_fd: bool
    dma_buf: bool
    buffer_device_address: bool
    int64_atomics: bool
    int64: bool
    float64: bool
    int8_storage: bool
    device_local_host_visible: bool
    max_allocation_size: int
    max_push_constants_size: int
    max_workgroup_count: tuple[int, int, int]
    memory_types: tuple[tuple[int, int], ...] = field(repr=False)
    """(property flags, heap index) of each memory type."""
    shader_features: frozenset[str] = frozenset()
    """The optional shader features the device has among :data:`SHADER_FEATURES` (Vulkan
    names, e.g. ``"shaderInt16"``); vkshmem enables each one it has."""

    def has_features(self, *names: str) -> bool:
        """Whether the device has every named feature of :data:`SHADER_FEATURES`."""
        return all(n in self.shader_features for n in names)

    def missing_features(self, *names: str) -> list[str]:
        """The named features of :data:`SHADER_FEATURES` the device lacks."""
        return [n for n in names if n not in self.shader_features]

    @property
    def uuid(self) -> str:
        """The device UUID as text (equal across processes, and CUDA's for the same GPU)."""
        u = self.device_uuid.hex()
        return f"{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}"

    @property
    def is_cpu(self) -> bool:
        return self.device_type == "cpu"


class _Messenger:
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


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        from vkshmem.core.errors import ConfigError
        raise ConfigError(name, f"expected a number of seconds, got {raw!r}") from None
    return value


def _env_size(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if raw[-1].upper() in units:
            return int(float(raw[:-1]) * units[raw[-1].upper()])
        return int(raw)
    except ValueError:
        from vkshmem.core.errors import ConfigError
        raise ConfigError(name, f"expected a size such as 8M, got {raw!r}") from None


def _cstr(vk: Any, arr: Any) -> str:
    return vk.ffi.string(arr).decode(errors="replace")


def _layers(vk: Any) -> set[str]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    check(lib.vkEnumerateInstanceLayerProperties(n, ffi.NULL), "vkEnumerateInstanceLayerProperties")
    props = ffi.new("VkLayerProperties[]", n[0])
    check(lib.vkEnumerateInstanceLayerProperties(n, props), "vkEnumerateInstanceLayerProperties")
    return {_cstr(vk, props[i].layerName) for i in range(n[0])}


def _instance_extensions(vk: Any) -> set[str]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    check(lib.vkEnumerateInstanceExtensionProperties(ffi.NULL, n, ffi.NULL),
          "vkEnumerateInstanceExtensionProperties")
    props = ffi.new("VkExtensionProperties[]", n[0])
    check(lib.vkEnumerateInstanceExtensionProperties(ffi.NULL, n, props),
          "vkEnumerateInstanceExtensionProperties")
    return {_cstr(vk, props[i].extensionName) for i in range(n[0])}


def _device_extensions(vk: Any, pd: Any) -> set[str]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    check(lib.vkEnumerateDeviceExtensionProperties(pd, ffi.NULL, n, ffi.NULL),
          "vkEnumerateDeviceExtensionProperties")
    props = ffi.new("VkExtensionProperties[]", n[0])
    check(lib.vkEnumerateDeviceExtensionProperties(pd, ffi.NULL, n, props),
          "vkEnumerateDeviceExtensionProperties")
    return {_cstr(vk, props[i].extensionName) for i in range(n[0])}


def _keep(store: list[Any], *objs: Any) -> Any:
    store.extend(objs)
    return objs[0]


def _strings(vk: Any, names: Iterable[str], keep: list[Any]) -> Any:
    ffi = vk.ffi
    cs = [ffi.new("char[]", s.encode()) for s in names]
    keep.extend(cs)
    return _keep(keep, ffi.new("char*[]", cs)), len(cs)


class _Physical:
    """A physical device's properties and features, queried once."""

    def __init__(self, vk: Any, pd: Any, index: int) -> None:
        ffi, lib = vk.ffi, vk.lib
        self.handle = pd
        props = ffi.new("VkPhysicalDeviceProperties*")
        lib.vkGetPhysicalDeviceProperties(pd, props)
        p = props[0]
        self.api_version = p.apiVersion
        self.extensions = _device_extensions(vk, pd)
        v12 = self.api_version >= vk.API_VERSION_1_2
        idp = ffi.new("VkPhysicalDeviceIDProperties*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES})
        drv = ffi.new("VkPhysicalDeviceDriverProperties*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, "pNext": idp})
        p2 = ffi.new("VkPhysicalDeviceProperties2*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
            "pNext": drv if v12 else idp})
        lib.vkGetPhysicalDeviceProperties2(pd, p2)
        f11 = ffi.new("VkPhysicalDeviceVulkan11Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES})
        f12 = ffi.new("VkPhysicalDeviceVulkan12Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, "pNext": f11})
        f2 = ffi.new("VkPhysicalDeviceFeatures2*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
            "pNext": f12 if v12 else ffi.NULL})
        lib.vkGetPhysicalDeviceFeatures2(pd, f2)
        # cffi trap: a nested struct read from an ffi.new object does not keep that object
        # alive; hold the owners for as long as the views are used.
        self._owners = (f2, f12, f11)
        self.features = f2.features
        self.f12 = f12[0]
        self.f11 = f11[0]
        structs = {"core": self.features, "1.1": self.f11, "1.2": self.f12}
        shader_features = frozenset(
            name for name, where in SHADER_FEATURES.items()
            if (v12 or where == "core") and getattr(structs[where], name))
        mp = ffi.new("VkPhysicalDeviceMemoryProperties*")
        lib.vkGetPhysicalDeviceMemoryProperties(pd, mp)
        self.memory_types = tuple(
            (mp.memoryTypes[i].propertyFlags, mp.memoryTypes[i].heapIndex)
            for i in range(mp.memoryTypeCount))
        self.heap_sizes = tuple(mp.memoryHeaps[i].size for i in range(mp.memoryHeapCount))
        m3 = ffi.new("VkPhysicalDeviceMaintenance3Properties*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES})
        p2b = ffi.new("VkPhysicalDeviceProperties2*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": m3})
        lib.vkGetPhysicalDeviceProperties2(pd, p2b)
        lim = p.limits
        dlhv = MEM_DEVICE_LOCAL | MEM_HOST_VISIBLE
        self.info = DeviceInfo(
            index=index,
            name=_cstr(vk, p.deviceName),
            vendor_id=p.vendorID,
            vendor=_VENDORS.get(p.vendorID, f"0x{p.vendorID:04x}"),
            device_type=_TYPE_NAMES.get(p.deviceType, str(p.deviceType)),
            api_version=f"{p.apiVersion >> 22}.{(p.apiVersion >> 12) & 0x3FF}."
                        f"{p.apiVersion & 0xFFF}",
            driver_name=_cstr(vk, drv.driverName) if v12 else "",
            driver_info=_cstr(vk, drv.driverInfo) if v12 else "",
            driver_version=p.driverVersion,
            device_uuid=bytes(ffi.buffer(idp.deviceUUID, 16)),
            driver_uuid=bytes(ffi.buffer(idp.driverUUID, 16)),
            external_memory_fd=EXT_EXTERNAL_MEMORY_FD in self.extensions,
            dma_buf=EXT_DMA_BUF in self.extensions,
            buffer_device_address=v12 and bool(self.f12.bufferDeviceAddress),
            int64_atomics=v12 and bool(self.f12.shaderBufferInt64Atomics),
            int64=bool(self.features.shaderInt64),
            float64=bool(self.features.shaderFloat64),
            int8_storage=v12 and bool(self.f12.storageBuffer8BitAccess and self.f12.shaderInt8),
            device_local_host_visible=any(f & dlhv == dlhv for f, _ in self.memory_types),
            max_allocation_size=m3.maxMemoryAllocationSize,
            max_push_constants_size=lim.maxPushConstantsSize,
            max_workgroup_count=tuple(lim.maxComputeWorkGroupCount[i] for i in range(3)),
            memory_types=self.memory_types,
            shader_features=shader_features,
        )


def _sorted_physical(vk: Any, instance: Any) -> list[Any]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    check(lib.vkEnumeratePhysicalDevices(instance, n, ffi.NULL), "vkEnumeratePhysicalDevices")
    handles = ffi.new("VkPhysicalDevice[]", n[0])
    if n[0]:
        check(lib.vkEnumeratePhysicalDevices(instance, n, handles), "vkEnumeratePhysicalDevices")
    devs = []
    for i in range(n[0]):
        props = ffi.new("VkPhysicalDeviceProperties*")
        lib.vkGetPhysicalDeviceProperties(handles[i], props)
        devs.append((_TYPE_ORDER.get(props.deviceType, 3), i, handles[i]))
    devs.sort(key=lambda t: (t[0], t[1]))
    return [h for _, _, h in devs]


def _create_instance(vk: Any, validation: bool, messenger: _Messenger | None,
                     keep: list[Any]) -> Any:
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
    app = _keep(keep, ffi.new("VkApplicationInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
        "pApplicationName": _keep(keep, ffi.new("char[]", b"vkshmem")),
        "pEngineName": _keep(keep, ffi.new("char[]", b"vkshmem")),
        "apiVersion": vk.API_VERSION_1_2,
    }))
    lay, nlay = _strings(vk, layers, keep)
    ext, next_ = _strings(vk, exts, keep)
    info = _keep(keep, ffi.new("VkInstanceCreateInfo*", {
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


def _layer_extensions(vk: Any) -> set[str]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    name = ffi.new("char[]", VALIDATION_LAYER.encode())
    if lib.vkEnumerateInstanceExtensionProperties(name, n, ffi.NULL) != 0:
        return set()
    props = ffi.new("VkExtensionProperties[]", n[0])
    lib.vkEnumerateInstanceExtensionProperties(name, n, props)
    return {_cstr(vk, props[i].extensionName) for i in range(n[0])}


def list_devices() -> list[DeviceInfo]:
    """Every Vulkan physical device, in vkshmem's order (GPUs first, CPU drivers last)."""
    vk = load()
    keep: list[Any] = []
    instance = _create_instance(vk, False, None, keep)
    try:
        return [_Physical(vk, pd, i).info for i, pd in enumerate(_sorted_physical(vk, instance))]
    finally:
        vk.lib.vkDestroyInstance(instance, vk.ffi.NULL)


def _choose(n_total: int, infos: list[DeviceInfo], index: int | None, local_rank: int) -> int:
    if index is None:
        raw = os.environ.get(ENV_DEVICE, "").strip()
        if raw:
            try:
                index = int(raw)
            except ValueError:
                from vkshmem.core.errors import ConfigError
                raise ConfigError(ENV_DEVICE, f"expected a device number, got {raw!r}") from None
            if not 0 <= index < n_total:
                from vkshmem.core.errors import ConfigError
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


class VulkanDevice:
    """One Vulkan logical device with a compute queue, for one PE.

    ``validation=True`` loads the Khronos validation layer and records its warnings and errors
    (:attr:`validation_messages`, :attr:`validation_errors`), including leak reports at
    :meth:`close`. ``staging_size`` (default ``VKSHMEM_GPU_STAGING_SIZE`` or 8 MiB) is the
    persistent host-visible buffer that :meth:`write`/:meth:`read` go through, in two halves
    so that filling one overlaps the GPU's copy of the other.
    """

    def __init__(self, index: int | None = None, validation: bool = False, *,
                 local_rank: int = 0, timeout: float | None = None,
                 staging_size: int | None = None) -> None:
        self._vk = vk = load()
        ffi, lib = vk.ffi, vk.lib
        self._keep: list[Any] = []
        self.lock = threading.RLock()
        self.timeout = timeout if timeout is not None else _env_float(ENV_TIMEOUT,
                                                                      DEFAULT_TIMEOUT)
        #: Seconds a wait polls the fence before blocking (VKSHMEM_GPU_SPIN_US, microseconds).
        self.spin_wait = _env_float(ENV_SPIN, DEFAULT_SPIN_US) * 1e-6
        self.validation = validation
        self._messenger = _Messenger() if validation else None
        self._debug_handle: Any = None
        self.instance: Any = None
        self.handle: Any = None
        self.command_pool: Any = None
        self.launch_pool: Any = None
        self._memories: dict[int, GpuMemory] = {}
        self._pipelines: dict[str, ComputePipeline] = {}
        self._transfer: Transfer | None = None
        self._kernels: Kernels | None = None
        self._exportable_types: int | None = None
        self._closed = False
        try:
            self._open(index, local_rank)
            from .copy import Transfer
            size = staging_size if staging_size is not None else _env_size(ENV_STAGING,
                                                                            DEFAULT_STAGING)
            self._transfer = Transfer(self, size)
        except BaseException:
            self.close()
            raise
        del ffi, lib

    # -- set-up ---------------------------------------------------------------------------

    def _open(self, index: int | None, local_rank: int) -> None:
        vk = self._vk
        ffi, lib = vk.ffi, vk.lib
        self.instance = _create_instance(vk, self.validation, self._messenger, self._keep)
        if self._messenger is not None:
            create = ffi.cast("PFN_vkCreateDebugUtilsMessengerEXT", lib.vkGetInstanceProcAddr(
                self.instance, b"vkCreateDebugUtilsMessengerEXT"))
            out = ffi.new("VkDebugUtilsMessengerEXT*")
            check(create(self.instance, self._messenger.create_info, ffi.NULL, out),
                  "vkCreateDebugUtilsMessengerEXT")
            self._debug_handle = out[0]
        handles = _sorted_physical(vk, self.instance)
        if not handles:
            raise FeatureNotAvailableError(f"Vulkan found no device; {icd_hint()}")
        infos = [_Physical(vk, h, i).info for i, h in enumerate(handles)]
        chosen = _choose(len(handles), infos, index, local_rank)
        phys = _Physical(vk, handles[chosen], chosen)
        self.physical = phys.handle
        self.info: DeviceInfo = phys.info
        self._phys = phys
        missing = []
        if phys.api_version < vk.API_VERSION_1_2:
            missing.append(f"Vulkan 1.2 (the driver offers {self.info.api_version})")
        if not self.info.buffer_device_address:
            missing.append("bufferDeviceAddress")
        if not self.info.int64:
            missing.append("shaderInt64")
        if not self.info.external_memory_fd:
            missing.append(EXT_EXTERNAL_MEMORY_FD)
        if missing:
            raise FeatureNotAvailableError(
                f"Vulkan device {chosen} ({self.info.name}, driver {self.info.driver_name}) lacks "
                f"{', '.join(missing)}; pick another with {ENV_DEVICE}=<n> or update the driver")
        # A queue family with compute (which implies transfer).
        n = ffi.new("uint32_t*")
        lib.vkGetPhysicalDeviceQueueFamilyProperties(self.physical, n, ffi.NULL)
        fams = ffi.new("VkQueueFamilyProperties[]", n[0])
        lib.vkGetPhysicalDeviceQueueFamilyProperties(self.physical, n, fams)
        family = next((i for i in range(n[0]) if fams[i].queueFlags & vk.VK_QUEUE_COMPUTE_BIT),
                      None)
        if family is None:
            raise FeatureNotAvailableError(f"Vulkan device {self.info.name} has no compute queue")
        self.queue_family = family
        # Features: everything our shaders may use that the device has.
        f = phys.features
        f12 = phys.f12
        f11 = ffi.new("VkPhysicalDeviceVulkan11Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
            "storageBuffer16BitAccess": phys.f11.storageBuffer16BitAccess,
            "uniformAndStorageBuffer16BitAccess": phys.f11.uniformAndStorageBuffer16BitAccess,
        })
        feats = ffi.new("VkPhysicalDeviceVulkan12Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
            "bufferDeviceAddress": 1,
            "shaderBufferInt64Atomics": f12.shaderBufferInt64Atomics,
            "pNext": f11,
            "shaderInt8": f12.shaderInt8,
            "shaderFloat16": f12.shaderFloat16,
            "storageBuffer8BitAccess": f12.storageBuffer8BitAccess,
            "uniformAndStorageBuffer8BitAccess": f12.uniformAndStorageBuffer8BitAccess,
            "scalarBlockLayout": f12.scalarBlockLayout,
            "vulkanMemoryModel": f12.vulkanMemoryModel,
            "vulkanMemoryModelDeviceScope": f12.vulkanMemoryModelDeviceScope,
        })
        f2 = ffi.new("VkPhysicalDeviceFeatures2*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": feats})
        f2.features.shaderInt64 = 1
        f2.features.shaderFloat64 = f.shaderFloat64
        f2.features.shaderInt16 = f.shaderInt16
        # A launch queue for user kernels (vkshmem.gpu.launch), so the copies and AMOs the
        # host does for their requests on the first queue can run while a kernel waits for
        # them: preferably from another compute family (NVIDIA's async-compute family; the
        # H100 runs nothing else on the first family's queues while a kernel spins), else
        # the first family's second queue, else none (lavapipe: one queue).
        alt = next((i for i in range(n[0]) if i != family
                    and fams[i].queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None)
        nq = 1 if alt is not None else min(2, fams[family].queueCount)
        prio = ffi.new("float[]", [1.0, 1.0])
        qinfo = ffi.new("VkDeviceQueueCreateInfo[]", 2)
        for k, (fam, count) in enumerate(((family, nq), (alt, 1))):
            if fam is None:
                continue
            qinfo[k].sType = vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO
            qinfo[k].queueFamilyIndex = fam
            qinfo[k].queueCount = count
            qinfo[k].pQueuePriorities = prio
        self.launch_family = alt if alt is not None else family
        exts = [EXT_EXTERNAL_MEMORY_FD]
        if self.info.dma_buf:
            exts.append(EXT_DMA_BUF)
        ext, next_ = _strings(vk, exts, self._keep)
        dinfo = ffi.new("VkDeviceCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, "pNext": f2,
            "queueCreateInfoCount": 2 if alt is not None else 1, "pQueueCreateInfos": qinfo,
            "enabledExtensionCount": next_, "ppEnabledExtensionNames": ext})
        out = ffi.new("VkDevice*")
        check(lib.vkCreateDevice(self.physical, dinfo, ffi.NULL, out), "vkCreateDevice")
        self.handle = out[0]
        q = ffi.new("VkQueue*")
        lib.vkGetDeviceQueue(self.handle, family, 0, q)
        self.queue = q[0]
        #: the queue user kernels are submitted to (``queue`` itself on a one-queue device)
        self.launch_queue = self.queue
        self.queue_count = nq + (1 if alt is not None else 0)
        if alt is not None or nq > 1:
            lib.vkGetDeviceQueue(self.handle, self.launch_family, 0 if alt is not None else 1,
                                 q)
            self.launch_queue = q[0]
        pinfo = ffi.new("VkCommandPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            "flags": vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            "queueFamilyIndex": family})
        pool = ffi.new("VkCommandPool*")
        check(lib.vkCreateCommandPool(self.handle, pinfo, ffi.NULL, pool), "vkCreateCommandPool")
        self.command_pool = pool[0]
        self.launch_pool = self.command_pool
        if alt is not None:
            pinfo.queueFamilyIndex = alt
            check(lib.vkCreateCommandPool(self.handle, pinfo, ffi.NULL, pool),
                  "vkCreateCommandPool (launch queue)")
            self.launch_pool = pool[0]
        self._get_memory_fd = self._device_fn("vkGetMemoryFdKHR")
        # Prebuilt structs of the hot paths (see Slot).
        self._begin_info = ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            "flags": vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT})
        self._begin_info_reuse = ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
        # Every command buffer starts by ordering itself after everything submitted before it
        # and ends by making its writes visible to the host.
        self._barrier_in = ffi.new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": vk.VK_ACCESS_MEMORY_WRITE_BIT | vk.VK_ACCESS_HOST_WRITE_BIT,
            "dstAccessMask": vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT})
        self._barrier_out = ffi.new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": vk.VK_ACCESS_MEMORY_WRITE_BIT,
            "dstAccessMask": vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_HOST_WRITE_BIT})
        self._barrier_mid = ffi.new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": vk.VK_ACCESS_MEMORY_WRITE_BIT,
            "dstAccessMask": vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT})
        log.info("vkshmem.gpu: opened %s (%s, %s)", self.info.name, self.info.driver_name,
                 self.info.uuid)

    def _device_fn(self, name: str) -> Any:
        vk = self._vk
        ptr = vk.lib.vkGetDeviceProcAddr(self.handle, name.encode())
        if ptr == vk.ffi.NULL:
            raise FeatureNotAvailableError(f"Vulkan function {name} is not available")
        return vk.ffi.cast(f"PFN_{name}", ptr)

    # -- properties -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def vendor(self) -> str:
        return self.info.vendor

    @property
    def driver(self) -> str:
        return f"{self.info.driver_name} {self.info.driver_info}".strip()

    @property
    def uuid(self) -> bytes:
        """The 16-byte device UUID (peers must match it to import each other's memory)."""
        return self.info.device_uuid

    @property
    def has_external_memory_fd(self) -> bool:
        return self.info.external_memory_fd

    @property
    def has_dma_buf(self) -> bool:
        return self.info.dma_buf

    @property
    def has_buffer_device_address(self) -> bool:
        return self.info.buffer_device_address

    @property
    def has_int64_atomics(self) -> bool:
        return self.info.int64_atomics

    @property
    def has_device_local_host_visible(self) -> bool:
        return self.info.device_local_host_visible

    @property
    def can_map_exportable(self) -> bool:
        """Whether exportable memory (a symmetric segment) can be device-local and mapped:
        True on lavapipe; False on an H100 (driver 580), whose DEVICE_LOCAL|HOST_VISIBLE type
        is not offered for exportable buffers, so its segments are reached by staging copies
        and shaders only."""
        if self._exportable_types is None:
            from .memory import exportable_memory_types
            self._exportable_types = exportable_memory_types(self)
        want = MEM_DEVICE_LOCAL | MEM_HOST_VISIBLE | MEM_HOST_COHERENT
        return any(self.info.memory_types[i][0] & want == want
                   for i in range(len(self.info.memory_types))
                   if self._exportable_types & (1 << i))

    @property
    def validation_messages(self) -> list[tuple[str, str, str]]:
        """(severity, message id, text) of every validation warning and error so far."""
        return list(self._messenger.messages) if self._messenger else []

    @property
    def validation_errors(self) -> list[str]:
        """Validation-layer errors so far (empty without ``validation=True``)."""
        return self._messenger.errors if self._messenger else []

    def __repr__(self) -> str:
        return f"<VulkanDevice {self.info.index}: {self.info.name} ({self.driver})>"

    # -- memory -----------------------------------------------------------------------------

    def memory_type(self, type_bits: int, host_visible: bool | None, size: int = 0) -> int:
        """Index of the memory type to use among ``type_bits`` for ``size`` bytes.

        ``host_visible=None``: device-local, also host-visible (and coherent) when such a
        type exists with a heap larger than ``size`` (NVIDIA exposes one; without resizable
        BAR its heap is only 256 MiB); ``True``: host-visible and coherent, preferably cached
        and in system memory (CPU reads of write-combined device memory crawl: 30 MB/s on an
        H100); ``False``: device-local, preferably not host-visible.
        """
        types = self._phys.memory_types
        heaps = self._phys.heap_sizes
        cands = [(i, flags, heaps[heap]) for i, (flags, heap) in enumerate(types)
                 if type_bits & (1 << i)]

        def score(flags: int, heap_size: int) -> tuple[int, ...] | None:
            dl = bool(flags & MEM_DEVICE_LOCAL)
            hv = bool(flags & MEM_HOST_VISIBLE)
            hc = bool(flags & MEM_HOST_COHERENT)
            cached = bool(flags & MEM_HOST_CACHED)
            if host_visible is True:
                if not (hv and hc):
                    return None
                return (int(cached), int(not dl))
            if not dl:
                return None
            if host_visible is False:
                return (int(not hv),)
            return (int(hv and hc and heap_size > 2 * size),)

        scored = [(sc, i) for i, fl, hs in cands if (sc := score(fl, hs)) is not None]
        if not scored:
            want = "host-visible coherent" if host_visible else "device-local"
            raise FeatureNotAvailableError(
                f"Vulkan device {self.info.name} has no {want} memory type for this buffer")
        scored.sort(key=lambda t: (t[0], -t[1]), reverse=True)
        return scored[0][1]

    def alloc(self, size: int, *, exportable: bool = True, host_visible: bool | None = None,
              memory_type_index: int | None = None) -> GpuMemory:
        """Allocate ``size`` bytes of device memory bound to a buffer with a device address.

        ``exportable`` makes it exportable as an opaque fd (and a dma-buf where the device has
        ``VK_EXT_external_memory_dma_buf``); ``host_visible`` as in :meth:`memory_type`, or
        an explicit ``memory_type_index``.
        """
        from .memory import GpuMemory
        return GpuMemory._allocate(self, size, exportable=exportable, host_visible=host_visible,
                                   memory_type_index=memory_type_index)

    def alloc_mapped(self, size: int) -> GpuMemory:
        """Mapped memory that a *running* shader and the host both see each other's writes in
        (rings, flags, results of GPU-initiated requests): device-local and host-visible where
        the device has such a type, else host memory.

        Measured on an H100 (driver 580): during a dispatch, host writes to host (system)
        memory are never seen by a spinning shader, whatever the load (atomic, volatile,
        Vulkan memory model acquire/MakeVisible), while host writes to device-local
        host-visible memory are seen within microseconds; shader writes reach the host in
        ~10 us from either. ``tests/gpu/visibility_probe.py`` measures it on a device.
        """
        mem = self.alloc(size, exportable=False, host_visible=None)
        if mem.map() is None:
            mem.free()
            log.warning("vkshmem.gpu: %s has no device-local host-visible memory for this "
                        "buffer; a running shader may not see host writes to host memory",
                        self.info.name)
            mem = self.alloc(size, exportable=False, host_visible=True)
        return mem

    def alloc_exportable(self, size: int, *, host_visible: bool | None = None) -> GpuMemory:
        """Allocate exportable device memory (what a symmetric GPU segment is made of)."""
        return self.alloc(size, exportable=True, host_visible=host_visible)

    def import_fd(self, fd: int, size: int, *, memory_type_index: int | None = None,
                  dedicated: bool | None = None, take_ownership: bool = False) -> GpuMemory:
        """Import another process's allocation from its opaque fd (same device, see
        :attr:`uuid`). ``size``/``memory_type_index``/``dedicated`` must be the exporter's
        (:meth:`GpuMemory.export_info` carries them); the defaults are what
        :meth:`alloc_exportable` picks for ``size``. The fd is duplicated unless
        ``take_ownership`` (then Vulkan owns it on success; on failure it is closed)."""
        from .memory import GpuMemory
        return GpuMemory._import(self, fd, size, memory_type_index=memory_type_index,
                                 dedicated=dedicated, take_ownership=take_ownership)

    def resolve_address(self, address: int) -> tuple[GpuMemory, int]:
        """The live allocation of this device holding device ``address``, and the offset."""
        with self.lock:
            for mem in self._memories.values():
                if mem.device_address <= address < mem.device_address + mem.size:
                    return mem, address - mem.device_address
        raise InvalidArgumentError(f"device address 0x{address:x} is in no live allocation")

    def _register(self, mem: GpuMemory) -> None:
        with self.lock:
            self._memories[id(mem)] = mem

    def _unregister(self, mem: GpuMemory) -> None:
        with self.lock:
            self._memories.pop(id(mem), None)

    # -- copies (see copy.py) ---------------------------------------------------------------

    @property
    def transfer(self) -> Transfer:
        if self._transfer is None:
            raise GpuError("the device is closed")
        return self._transfer

    def write(self, mem: GpuMemory, offset: int, src: Any, *, timeout: float | None = None,
              direct: bool = False) -> None:
        """Copy the bytes of ``src`` (any contiguous buffer) into ``mem`` at ``offset``
        through the staging buffer, ordered after all GPU work submitted before it.
        ``direct=True`` copies through the mapping instead (host-visible memory only; not
        ordered with GPU work in flight; ~100x faster for small data on lavapipe)."""
        if direct:
            self.transfer.write_direct(mem, offset, src)
        else:
            self.transfer.write(mem, offset, src, timeout)

    def read(self, mem: GpuMemory, offset: int, dst: Any, *, timeout: float | None = None,
             direct: bool = False) -> None:
        """Fill ``dst`` (a writable contiguous buffer) from ``mem`` at ``offset`` (``direct``
        as in :meth:`write`)."""
        if direct:
            self.transfer.read_direct(mem, offset, dst)
        else:
            self.transfer.read(mem, offset, dst, timeout)

    def copy(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
             nbytes: int, *, timeout: float | None = None) -> None:
        """Device-to-device copy (either side may be imported peer memory); overlapping
        ranges of one allocation are copied as memmove does."""
        self.transfer.copy(dst, dst_offset, src, src_offset, nbytes, timeout)

    # -- shaders (see pipeline.py, kernels.py) -----------------------------------------------

    def pipeline(self, name: str) -> ComputePipeline:
        """The compute pipeline of the shipped shader ``name`` (e.g. ``"amo_u64"``), cached."""
        with self.lock:
            pipe = self._pipelines.get(name)
            if pipe is None:
                from .pipeline import ComputePipeline, load_spirv
                pipe = ComputePipeline(self, load_spirv(name), name=name)
                self._pipelines[name] = pipe
            return pipe

    @property
    def kernels(self) -> Kernels:
        with self.lock:
            if self._kernels is None:
                from .kernels import Kernels
                self._kernels = Kernels(self)
            return self._kernels

    def amo(self, mem: GpuMemory, offset: int, op: int, width: int, operand: int = 0,
            compare: int = 0, *, timeout: float | None = None) -> int:
        """Apply one AMO (:class:`~vkshmem.core.transport.AmoOp`) to the ``width``-byte word at
        ``offset`` of ``mem`` with a shader atomic; returns the old value (unsigned)."""
        return self.kernels.amo(mem, offset, op, width, operand, compare, timeout=timeout)

    def reduce(self, dst: GpuMemory, dst_offset: int, src: GpuMemory, src_offset: int,
               count: int, op: str, dtype: Any, *, timeout: float | None = None) -> None:
        """In place ``dst[i] = op(dst[i], src[i])`` for ``count`` elements of ``dtype``."""
        self.kernels.reduce(dst, dst_offset, src, src_offset, count, op, dtype,
                            timeout=timeout)

    # -- command buffers and fences ---------------------------------------------------------

    def slot(self, name: str, launch: bool = False) -> Slot:
        """A command buffer with its own fence (see :class:`Slot`), submitted to the first
        queue, or with ``launch`` to the launch queue of user kernels."""
        return Slot(self, name, launch)

    def check_open(self) -> None:
        if self._closed or self.handle is None:
            raise GpuError("the Vulkan device is closed")

    # -- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Free every pipeline, allocation, command buffer and the device and instance.

        Waits (up to the timeout) for work in flight; memory whose :meth:`GpuMemory.map` view
        is still exported (numpy arrays on it) cannot be unmapped safely, so it and the device
        are left alive with a warning rather than freed under those arrays."""
        if self._closed:
            return
        vk = self._vk
        ffi, lib = vk.ffi, vk.lib
        with self.lock:
            if self._kernels is not None:
                self._kernels.close()
                self._kernels = None
            for pipe in list(self._pipelines.values()):
                pipe.close()
            self._pipelines.clear()
            if self._transfer is not None:
                self._transfer.close()
                self._transfer = None
            pinned = []
            for mem in list(self._memories.values()):
                try:
                    mem.free()
                except BufferError:
                    pinned.append(mem)
            if pinned:
                log.warning("vkshmem.gpu: %d allocation(s) are still viewed by arrays; the "
                            "Vulkan device stays open so those views remain valid", len(pinned))
                return
            self._closed = True
            if self.handle is not None:
                lib.vkDeviceWaitIdle(self.handle)
                if self.launch_pool is not None and self.launch_pool != self.command_pool:
                    lib.vkDestroyCommandPool(self.handle, self.launch_pool, ffi.NULL)
                self.launch_pool = None
                if self.command_pool is not None:
                    lib.vkDestroyCommandPool(self.handle, self.command_pool, ffi.NULL)
                    self.command_pool = None
                lib.vkDestroyDevice(self.handle, ffi.NULL)
                self.handle = None
            if self.instance is not None:
                if self._debug_handle is not None:
                    destroy = ffi.cast("PFN_vkDestroyDebugUtilsMessengerEXT",
                                       lib.vkGetInstanceProcAddr(
                                           self.instance, b"vkDestroyDebugUtilsMessengerEXT"))
                    destroy(self.instance, self._debug_handle, ffi.NULL)
                    self._debug_handle = None
                lib.vkDestroyInstance(self.instance, ffi.NULL)
                self.instance = None
            self._keep.clear()

    def __enter__(self) -> VulkanDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Slot:
    """A primary command buffer, its fence and a prebuilt submit: one unit of GPU work.

    Never re-recorded while in flight: :meth:`begin` first waits for the previous submission
    (recording an in-flight command buffer crashes lavapipe and is invalid Vulkan anyway).
    Its owner serialises its use (its own lock); ``device.lock`` is held from :meth:`begin`
    to :meth:`submit` (the command pool and the queue need external synchronisation), never
    during :meth:`wait`, so one thread's long dispatch does not block another's copies.
    """

    def __init__(self, device: VulkanDevice, name: str, launch: bool = False) -> None:
        vk = device._vk
        ffi, lib = vk.ffi, vk.lib
        self.device = device
        self.queue = device.launch_queue if launch else device.queue
        self.pool = device.launch_pool if launch else device.command_pool
        self.name = name
        self.pending = False
        self.cmd: Any = None
        self.fence: Any = None
        info = ffi.new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            "commandPool": self.pool,
            "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, "commandBufferCount": 1})
        self._cmds = ffi.new("VkCommandBuffer[]", 1)
        with device.lock:
            check(lib.vkAllocateCommandBuffers(device.handle, info, self._cmds),
                  "vkAllocateCommandBuffers")
        self.cmd = self._cmds[0]
        finfo = ffi.new("VkFenceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO})
        self._fences = ffi.new("VkFence[]", 1)
        res = lib.vkCreateFence(device.handle, finfo, ffi.NULL, self._fences)
        if res != 0:
            lib.vkFreeCommandBuffers(device.handle, self.pool, 1, self._cmds)
            check(res, "vkCreateFence")
        self.fence = self._fences[0]
        self._submit = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
            "commandBufferCount": 1, "pCommandBuffers": self._cmds})
        self._lib = lib
        self._all_commands = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
        self._host_stage = vk.VK_PIPELINE_STAGE_HOST_BIT
        self._null = ffi.NULL

    def begin(self, timeout: float | None = None, reusable: bool = False) -> Any:
        """Start recording (waiting for the previous submission first); returns the cmd."""
        dev = self.device
        if self.pending:
            self.wait(timeout)
        lib = self._lib
        check(lib.vkBeginCommandBuffer(
            self.cmd, dev._begin_info_reuse if reusable else dev._begin_info),
            "vkBeginCommandBuffer")
        lib.vkCmdPipelineBarrier(self.cmd, self._all_commands, self._all_commands, 0,
                                 1, dev._barrier_in, 0, self._null, 0, self._null)
        return self.cmd

    def barrier(self) -> None:
        """Order the commands recorded so far before the ones recorded next."""
        self._lib.vkCmdPipelineBarrier(self.cmd, self._all_commands, self._all_commands, 0,
                                       1, self.device._barrier_mid, 0, self._null, 0, self._null)

    def end(self) -> None:
        """Finish recording; the commands' writes become visible to the host at the fence."""
        lib = self._lib
        lib.vkCmdPipelineBarrier(self.cmd, self._all_commands, self._host_stage, 0,
                                 1, self.device._barrier_out, 0, self._null, 0, self._null)
        check(lib.vkEndCommandBuffer(self.cmd), "vkEndCommandBuffer")

    def submit(self) -> None:
        if self.pending:
            raise GpuError(f"{self.name}: command buffer submitted twice while in flight")
        check(self._lib.vkQueueSubmit(self.queue, 1, self._submit, self.fence),
              f"vkQueueSubmit ({self.name})")
        self.pending = True

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the last submission (GpuTimeoutError after ``timeout``) and reset the
        fence; nothing to do when none is pending."""
        if not self.pending:
            return
        dev = self.device
        lib = self._lib
        t = dev.timeout if timeout is None else timeout
        # Poll briefly first: a blocking vkWaitForFences costs a thread wake-up (~50 us more
        # per round trip on lavapipe), while short work is often done within microseconds.
        handle = dev.handle
        fence = self.fence
        res = lib.vkGetFenceStatus(handle, fence)
        if res == 1 and dev.spin_wait > 0:  # VK_NOT_READY
            end = perf_counter() + min(dev.spin_wait, t)
            while res == 1 and perf_counter() < end:
                res = lib.vkGetFenceStatus(handle, fence)
        if res == 1:
            res = lib.vkWaitForFences(handle, 1, self._fences, 1, int(t * 1e9))
        if res == 2:  # VK_TIMEOUT
            raise GpuTimeoutError(
                f"{self.name} did not finish within {t:g} s on {dev.info.name} (raise "
                f"{ENV_TIMEOUT} or pass timeout=); the work is still in flight")
        check(res, f"vkWaitForFences ({self.name})")
        check(lib.vkResetFences(dev.handle, 1, self._fences), "vkResetFences")
        self.pending = False

    def close(self) -> None:
        """Wait for pending work (bounded) and free the command buffer and fence."""
        if self.fence is None:
            return
        dev = self.device
        if self.pending:
            self.wait()  # raises GpuTimeoutError rather than freeing in-flight objects
        self._lib.vkDestroyFence(dev.handle, self.fence, self._null)
        self._lib.vkFreeCommandBuffers(dev.handle, self.pool, 1, self._cmds)
        self.fence = None
        self.cmd = None
