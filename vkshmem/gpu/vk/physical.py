"""Physical devices: what each Vulkan device is and can do for vkshmem.

:class:`PhysicalDevice` queries a device's properties, features, extensions and memory types
once; its :class:`DeviceInfo` is what the rest of the layer (and :func:`~vkshmem.gpu.list_devices`)
reads. :func:`physical_devices` numbers an instance's devices in vkshmem's order: GPUs first
(discrete, integrated, virtual, other), CPU drivers last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vkshmem.core.errors import FeatureNotAvailableError

from ._vk import check, cstr, keep

__all__ = ["EXT_DMA_BUF", "EXT_EXTERNAL_MEMORY_FD", "EXT_MEMORY_HOST", "EXT_SHADER_CLOCK",
           "MEM_DEVICE_LOCAL",
           "MEM_HOST_CACHED",
           "MEM_HOST_COHERENT", "MEM_HOST_VISIBLE", "SHADER_FEATURES", "DeviceInfo",
           "PhysicalDevice", "bar_memory_type", "clock_feature",
           "physical_devices", "pick_memory_type"]

#: Device extensions vkshmem needs (external memory fd) or uses where present (dma-buf).
EXT_EXTERNAL_MEMORY_FD = "VK_KHR_external_memory_fd"
EXT_DMA_BUF = "VK_EXT_external_memory_dma_buf"
#: host memory imported as device memory: CPU<->GPU copies without a staging buffer
EXT_MEMORY_HOST = "VK_EXT_external_memory_host"
#: a clock shaders read (device scope): what bounds a stream's wait in time (stream_wait.comp)
EXT_SHADER_CLOCK = "VK_KHR_shader_clock"

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
    timeline_semaphore: bool = False
    """Vulkan 1.2 timeline semaphores (what orders a :class:`~vkshmem.gpu.stream.Stream`)."""
    device_clock: bool = False
    """``VK_KHR_shader_clock`` with ``shaderDeviceClock`` (what bounds a stream's wait)."""

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


def _device_extensions(vk: Any, pd: Any) -> set[str]:
    ffi, lib = vk.ffi, vk.lib
    n = ffi.new("uint32_t*")
    check(lib.vkEnumerateDeviceExtensionProperties(pd, ffi.NULL, n, ffi.NULL),
          "vkEnumerateDeviceExtensionProperties")
    props = ffi.new("VkExtensionProperties[]", n[0])
    check(lib.vkEnumerateDeviceExtensionProperties(pd, ffi.NULL, n, props),
          "vkEnumerateDeviceExtensionProperties")
    return {cstr(vk, props[i].extensionName) for i in range(n[0])}


class PhysicalDevice:
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
        clock = ffi.new("VkPhysicalDeviceShaderClockFeaturesKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR})
        if EXT_SHADER_CLOCK in self.extensions:
            lib.vkGetPhysicalDeviceFeatures2(pd, ffi.new("VkPhysicalDeviceFeatures2*", {
                "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": clock}))
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
            name=cstr(vk, p.deviceName),
            vendor_id=p.vendorID,
            vendor=_VENDORS.get(p.vendorID, f"0x{p.vendorID:04x}"),
            device_type=_TYPE_NAMES.get(p.deviceType, str(p.deviceType)),
            api_version=f"{p.apiVersion >> 22}.{(p.apiVersion >> 12) & 0x3FF}."
                        f"{p.apiVersion & 0xFFF}",
            driver_name=cstr(vk, drv.driverName) if v12 else "",
            driver_info=cstr(vk, drv.driverInfo) if v12 else "",
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
            timeline_semaphore=v12 and bool(self.f12.timelineSemaphore),
            device_clock=bool(clock.shaderDeviceClock),
        )


def physical_devices(vk: Any, instance: Any) -> list[Any]:
    """The handles of ``instance``'s physical devices in vkshmem's order (see module doc)."""
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

def pick_memory_type(phys: PhysicalDevice, name: str, type_bits: int,
                     host_visible: bool | None, size: int = 0) -> int:
    """Index of the memory type to use among ``type_bits`` for ``size`` bytes.

    ``host_visible=None``: device-local, also host-visible (and coherent) when such a
    type exists with a heap larger than ``size`` (NVIDIA exposes one; without resizable
    BAR its heap is only 256 MiB); ``True``: host-visible and coherent, preferably cached
    and in system memory (CPU reads of write-combined device memory crawl: 30 MB/s on an
    H100); ``False``: device-local, preferably not host-visible.
    """
    types = phys.memory_types
    heaps = phys.heap_sizes
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
            f"Vulkan device {name} has no {want} memory type for this buffer")
    scored.sort(key=lambda t: (t[0], -t[1]), reverse=True)
    return scored[0][1]


def bar_memory_type(phys: PhysicalDevice, size: int) -> int | None:
    """A DEVICE_LOCAL|HOST_VISIBLE|HOST_COHERENT memory type with a heap over ``2 * size``."""
    want = MEM_DEVICE_LOCAL | MEM_HOST_VISIBLE | MEM_HOST_COHERENT
    for i, (flags, heap) in enumerate(phys.memory_types):
        if flags & want == want and phys.heap_sizes[heap] > 2 * size:
            return i
    return None


def clock_feature(vk: Any, info: DeviceInfo, extensions: list[str], store: list[Any]) -> Any:
    """Where the device has a device-scope shader clock (what bounds a stream's waits,
    stream_wait.comp): add its extension to ``extensions`` and return the feature struct to
    chain into the device's creation (held in ``store``); else NULL."""
    if not info.device_clock:
        return vk.ffi.NULL
    extensions.append(EXT_SHADER_CLOCK)
    return keep(store, vk.ffi.new("VkPhysicalDeviceShaderClockFeaturesKHR*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR,
        "shaderDeviceClock": 1}))
