"""The Vulkan logical device that the GPU layer's engines are built on, and its memory.

:class:`LogicalDevice` opens the chosen physical device (:mod:`~vkshmem.gpu.vk.instance`) with a
compute queue (and a launch queue for user kernels where the device has one), command pools and
the prebuilt structs of command submission (:mod:`~vkshmem.gpu.vk.submit`). It picks memory types,
allocates and imports device memory (:mod:`~vkshmem.gpu.vk.memory`) and keeps the registry of live
allocations. The engines (slots, pipelines, staging copies, kernels) take it as their device;
:class:`~vkshmem.gpu.vk.device.VulkanDevice` extends it with them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError

from ..env import (
    DEFAULT_SPIN_US,
    DEFAULT_TIMEOUT,
    ENV_DEVICE,
    ENV_SPIN,
    ENV_TIMEOUT,
    env_float,
    settings,
)
from ..errors import GpuError
from ._vk import c_strings, check, load
from .hostimport import import_alignment
from .instance import Messenger, choose_physical, create_instance
from .memory import GpuMemory
from .native import open_native
from .physical import (
    EXT_DMA_BUF,
    EXT_EXTERNAL_MEMORY_FD,
    EXT_MEMORY_HOST,
    DeviceInfo,
    bar_memory_type,
    clock_feature,
    pick_memory_type,
)

__all__ = ["LogicalDevice"]

_NVIDIA = 0x10DE

log = logging.getLogger("vkshmem.gpu")


class LogicalDevice:
    """One Vulkan logical device with a compute queue, for one PE: what the engines need.

    ``validation=True`` loads the Khronos validation layer and records its warnings and errors
    (see :class:`~vkshmem.gpu.vk.instance.Messenger`), including leak reports at :meth:`close`.
    ``timeout`` (default ``VKSHMEM_GPU_TIMEOUT``) bounds every wait for the GPU.
    """

    def __init__(self, index: int | None = None, validation: bool = False, *,
                 local_rank: int = 0, timeout: float | None = None) -> None:
        self._vk = load()
        self._keep: list[Any] = []
        self.lock = threading.RLock()
        self.timeout = timeout if timeout is not None else env_float(ENV_TIMEOUT,
                                                                     DEFAULT_TIMEOUT)
        #: Seconds a wait polls the fence before blocking (VKSHMEM_GPU_SPIN_US, microseconds).
        self.spin_wait = env_float(ENV_SPIN, DEFAULT_SPIN_US) * 1e-6
        self.validation = validation
        self._messenger = Messenger() if validation else None
        self._debug_handle: Any = None
        self.instance: Any = None
        self.handle: Any = None
        self.command_pool: Any = None
        self.launch_pool: Any = None
        #: the native submission helper (vkshmem.gpu._submit) for this device, or None
        self.native: Any = None
        #: submissions not yet waited for, per queue (0: ``queue``, 1: ``launch_queue`` when it
        #: is another queue); changed under ``lock``. A command buffer recorded while its queue
        #: has none skips the leading barrier (see :meth:`Slot.begin
        #: <vkshmem.gpu.vk.submit.Slot.begin>`).
        self.in_flight = [0, 0]
        #: called after each submission (under ``lock``): the Vulkan domain parks its CUDA
        #: service kernel there, which the GPU would otherwise time-slice this work against
        self.on_submit: Callable[[], None] | None = None
        self.has_memory_host = False
        self.host_alignment = 0
        #: exportable memory may take the CPU-mapped device memory type (see bar_type)
        self.bar_exports = False
        self._memories: dict[int, GpuMemory] = {}
        self._closed = False
        try:
            self._open(index, local_rank)
        except BaseException:
            self.close()
            raise

    # -- set-up ---------------------------------------------------------------------------

    def _open(self, index: int | None, local_rank: int) -> None:
        vk = self._vk
        ffi, lib = vk.ffi, vk.lib
        self.instance = create_instance(vk, self.validation, self._messenger, self._keep)
        if self._messenger is not None:
            create = ffi.cast("PFN_vkCreateDebugUtilsMessengerEXT", lib.vkGetInstanceProcAddr(
                self.instance, b"vkCreateDebugUtilsMessengerEXT"))
            out = ffi.new("VkDebugUtilsMessengerEXT*")
            check(create(self.instance, self._messenger.create_info, ffi.NULL, out),
                  "vkCreateDebugUtilsMessengerEXT")
            self._debug_handle = out[0]
        phys = choose_physical(vk, self.instance, index, local_rank)
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
                f"Vulkan device {self.info.index} ({self.info.name}, driver "
                f"{self.info.driver_name}) lacks {', '.join(missing)}; pick another with "
                f"{ENV_DEVICE}=<n> or update the driver")
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
            "timelineSemaphore": f12.timelineSemaphore,  # streams (vkshmem.gpu.stream)
        })
        f2 = ffi.new("VkPhysicalDeviceFeatures2*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": feats})
        f2.features.shaderInt64 = 1
        f2.features.shaderFloat64 = f.shaderFloat64
        f2.features.shaderInt16 = f.shaderInt16
        # A launch queue for user kernels (vkshmem.gpu.initiated.launch), so the copies and AMOs the
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
        #: whether host memory can be imported (vkshmem.gpu.vk.hostimport)
        self.has_memory_host = EXT_MEMORY_HOST in phys.extensions
        if self.has_memory_host:
            exts.append(EXT_MEMORY_HOST)
        f11.pNext = clock_feature(vk, self.info, exts, self._keep)  # bounds stream waits
        ext, next_ = c_strings(vk, exts, self._keep)
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
        self.native = open_native(vk, self)
        bar = settings().bar  # VKSHMEM_GPU_BAR, parsed: auto, 0 or 1
        self.bar_exports = bar == "1" or (bar == "auto" and not self.validation
                                          and self.info.vendor_id == _NVIDIA)
        #: minImportedHostPointerAlignment (0: host memory cannot be imported)
        self.host_alignment = import_alignment(self)
        log.info("vkshmem.gpu: opened %s (%s, %s); submission path: %s", self.info.name,
                 self.info.driver_name, self.info.uuid, "native" if self.native else "Python")

    def _device_fn(self, name: str) -> Any:
        vk = self._vk
        ptr = vk.lib.vkGetDeviceProcAddr(self.handle, name.encode())
        if ptr == vk.ffi.NULL:
            raise FeatureNotAvailableError(f"Vulkan function {name} is not available")
        return vk.ffi.cast(f"PFN_{name}", ptr)

    # -- memory -----------------------------------------------------------------------------

    def memory_type(self, type_bits: int, host_visible: bool | None, size: int = 0) -> int:
        """Index of the memory type to use among ``type_bits`` for ``size`` bytes (see
        :func:`~vkshmem.gpu.vk.physical.pick_memory_type`)."""
        return pick_memory_type(self._phys, self.info.name, type_bits, host_visible, size)

    def bar_type(self, size: int) -> int | None:
        """The DEVICE_LOCAL|HOST_VISIBLE|HOST_COHERENT memory type exportable memory may use
        although an exportable buffer's memoryTypeBits exclude it, or None.

        This is a deviation from the Vulkan spec, taken only where it was verified: NVIDIA's
        driver (580, H100) exports, imports, maps and binds such memory, and the CPU then
        writes a peer's GPU memory with plain stores (~5 GB/s, ~1 us for small data) instead
        of a queue submission (~20 us). Enabled by ``VKSHMEM_GPU_BAR`` (``auto``: on NVIDIA
        without the validation layer, which would rightly report the bind); the GPU domain
        checks each such segment (CPU and GPU see each other's writes) before using it."""
        return bar_memory_type(self._phys, size) if self.bar_exports else None

    def alloc(self, size: int, *, exportable: bool = True, host_visible: bool | None = None,
              memory_type_index: int | None = None) -> GpuMemory:
        """Allocate ``size`` bytes of device memory bound to a buffer with a device address.

        ``exportable`` makes it exportable as an opaque fd (and a dma-buf where the device has
        ``VK_EXT_external_memory_dma_buf``); ``host_visible`` as in :meth:`memory_type`, or
        an explicit ``memory_type_index``.
        """
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
        """Import another process's allocation from its opaque fd (same device: equal
        ``info.device_uuid``). ``size``/``memory_type_index``/``dedicated`` must be the exporter's
        (:meth:`GpuMemory.export_info` carries them); the defaults are what
        :meth:`alloc_exportable` picks for ``size``. The fd is duplicated unless
        ``take_ownership`` (then Vulkan owns it on success; on failure it is closed)."""
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

    # -- copies -----------------------------------------------------------------------------

    def write(self, mem: GpuMemory, offset: int, src: Any, *, timeout: float | None = None,
              direct: bool = False) -> None:
        """Copy ``src`` into ``mem`` at ``offset`` (what :meth:`GpuMemory.write
        <vkshmem.gpu.vk.memory.GpuMemory.write>` calls);
        :class:`~vkshmem.gpu.vk.device.VulkanDevice` implements it with its staging buffer."""
        raise NotImplementedError

    def read(self, mem: GpuMemory, offset: int, dst: Any, *, timeout: float | None = None,
             direct: bool = False) -> None:
        """Fill ``dst`` from ``mem`` at ``offset``; see :meth:`write`."""
        raise NotImplementedError

    # -- open and closed --------------------------------------------------------------------

    def check_open(self) -> None:
        if self._closed or self.handle is None:
            raise GpuError("the Vulkan device is closed")

    def close(self) -> None:
        """Free every allocation and the device and instance (see
        :meth:`VulkanDevice.close <vkshmem.gpu.vk.device.VulkanDevice.close>`)."""
        if self._closed:
            return
        vk = self._vk
        ffi, lib = vk.ffi, vk.lib
        with self.lock:
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
            if self.native is not None:
                self.native.close()
                self.native = None
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

