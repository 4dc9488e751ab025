"""Compute pipelines over SPIR-V whose buffers are reached by device address.

Shaders take their arguments as push constants (device addresses, offsets, counts) instead of
descriptor sets: no descriptor updates, no per-descriptor size limits. The pipeline layout has
one push-constant range of :data:`PUSH_CONSTANT_SIZE` bytes (the minimum every device offers)
and no descriptor set. Push constants are passed to ``vkCmdPushConstants`` with
``ffi.from_buffer`` (the ``vulkan`` package's wrapper cannot take a Python buffer).

lavapipe trap: a shader loop runs at most 65,535 iterations (later ones are silently
skipped), so shaders here do a bounded amount of work per invocation and the host splits
large jobs into several dispatches (:meth:`ComputePipeline.dispatch_many`), each under
``maxComputeWorkGroupCount``.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError

from ..errors import GpuError
from ._vk import check
from .submit import Slot

if TYPE_CHECKING:
    from .logical import LogicalDevice

__all__ = ["PUSH_CONSTANT_SIZE", "ComputePipeline", "load_spirv", "shipped_shaders"]

#: Bytes of push constants every pipeline's layout declares (Vulkan's guaranteed minimum).
PUSH_CONSTANT_SIZE = 128
SPIRV_MAGIC = 0x07230203

Groups = int | tuple[int, int, int]


def shipped_shaders() -> list[str]:
    """Names of the SPIR-V modules shipped in ``vkshmem/gpu/spv``."""
    root = resources.files("vkshmem.gpu") / "spv"
    return sorted(p.name[:-4] for p in root.iterdir() if p.name.endswith(".spv"))


def load_spirv(source: str | bytes | Path) -> bytes:
    """SPIR-V bytes from ``bytes``, a file path, or the name of a shipped module
    (``"amo_u64"``)."""
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
    else:
        path = Path(source)
        if path.suffix == ".spv" and path.exists():
            data = path.read_bytes()
        else:
            res = resources.files("vkshmem.gpu") / "spv" / f"{source}.spv"
            if not res.is_file():
                raise InvalidArgumentError(
                    f"no shipped shader named {source!r} (have: {', '.join(shipped_shaders())})")
            data = res.read_bytes()
    if len(data) < 20 or len(data) % 4 or int.from_bytes(data[:4], "little") != SPIRV_MAGIC:
        raise InvalidArgumentError("not a SPIR-V module (bad magic number or length)")
    return data


class ComputePipeline:
    """A compute pipeline of one SPIR-V module (entry point ``main``) with a 128-byte
    push-constant range; owns a command buffer for its own dispatches."""

    def __init__(self, device: LogicalDevice, spirv: bytes, *, name: str = "shader",
                 entry: str = "main") -> None:
        vk = device._vk
        ffi, lib = vk.ffi, vk.lib
        self.device = device
        self.name = name
        self.module: Any = None
        self.layout: Any = None
        self.handle: Any = None
        self._slot: Slot | None = None
        device.check_open()
        if device.info.max_push_constants_size < PUSH_CONSTANT_SIZE:  # pragma: no cover
            raise FeatureNotAvailableError("the device offers fewer than 128 push-constant bytes")
        code = ffi.from_buffer("uint32_t[]", spirv)
        minfo = ffi.new("VkShaderModuleCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
            "codeSize": len(spirv), "pCode": code})
        try:
            out = ffi.new("VkShaderModule*")
            check(lib.vkCreateShaderModule(device.handle, minfo, ffi.NULL, out),
                  f"vkCreateShaderModule ({name})")
            self.module = out[0]
            rng = ffi.new("VkPushConstantRange*", {
                "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT, "offset": 0,
                "size": PUSH_CONSTANT_SIZE})
            linfo = ffi.new("VkPipelineLayoutCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                "pushConstantRangeCount": 1, "pPushConstantRanges": rng})
            lout = ffi.new("VkPipelineLayout*")
            check(lib.vkCreatePipelineLayout(device.handle, linfo, ffi.NULL, lout),
                  "vkCreatePipelineLayout")
            self.layout = lout[0]
            entry_c = ffi.new("char[]", entry.encode())
            cinfo = ffi.new("VkComputePipelineCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                "stage": {
                    "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                    "stage": vk.VK_SHADER_STAGE_COMPUTE_BIT, "module": self.module,
                    "pName": entry_c},
                "layout": self.layout})
            pout = ffi.new("VkPipeline*")
            res = lib.vkCreateComputePipelines(device.handle, ffi.NULL, 1, cinfo, ffi.NULL, pout)
            if res != 0:
                raise GpuError(f"vkCreateComputePipelines ({name}) failed: "
                               f"{vk.result_name(res)}", res)
            self.handle = pout[0]
            self._slot = Slot(device, f"dispatch of {name}")
        except BaseException:
            self.close()
            raise
        self._lib = lib
        self._addrs = (int(ffi.cast("uintptr_t", self.handle)),
                       int(ffi.cast("uintptr_t", self.layout)))
        self._from_buffer = ffi.from_buffer
        self._bind = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        self._stage = vk.VK_SHADER_STAGE_COMPUTE_BIT
        self._lock = threading.Lock()  # this pipeline's slot; the device lock only to record

    def _check(self, groups: Groups, push: bytes | bytearray | memoryview
               ) -> tuple[int, int, int]:
        x, y, z = (groups, 1, 1) if isinstance(groups, int) else groups
        limit = self.device.info.max_workgroup_count
        if not (0 < x <= limit[0] and 0 < y <= limit[1] and 0 < z <= limit[2]):
            raise InvalidArgumentError(
                f"{self.name}: {(x, y, z)} workgroups exceed the device limit {limit}; "
                "split the work into several dispatches")
        n = len(push)
        if n > PUSH_CONSTANT_SIZE or n % 4:
            raise InvalidArgumentError(f"push constants must be a multiple of 4 bytes, at most "
                                       f"{PUSH_CONSTANT_SIZE} (got {n})")
        return x, y, z

    def record(self, slot: Slot, groups: Groups, push: bytes | bytearray | memoryview) -> None:
        """Record bind + push constants + dispatch into ``slot`` (which is recording).
        Check arguments before :meth:`Slot.begin` (a failure here leaves it recording)."""
        x, y, z = self._check(groups, push)
        lib = self._lib
        lib.vkCmdBindPipeline(slot.cmd, self._bind, self.handle)
        if len(push):
            lib.vkCmdPushConstants(slot.cmd, self.layout, self._stage, 0, len(push),
                                   self._from_buffer(push))
        lib.vkCmdDispatch(slot.cmd, x, y, z)

    def dispatch(self, groups: Groups, push: bytes | bytearray | memoryview = b"", *,
                 timeout: float | None = None) -> None:
        """Run one dispatch and wait for it (GpuTimeoutError after ``timeout``)."""
        self.dispatch_many([(groups, push)], timeout=timeout)

    def run1(self, x: int, push: bytes, timeout: float | None = None) -> None:
        """One dispatch of ``x`` (1 .. maxComputeWorkGroupCount[0]) workgroups with ``push``
        (a multiple of 4 bytes, at most 128) as push constants, and wait for it: the hot path of
        the shipped kernels, which check their arguments themselves (one C call to record and
        submit where the native helper is built)."""
        dev = self.device
        if dev.native is None:
            self.dispatch_many([(x, push)], timeout=timeout)
            return
        with self._lock:
            dev.check_open()
            slot = self._slot
            if slot is None:
                raise GpuError(f"pipeline {self.name} is closed")
            slot.wait(timeout)
            with dev.lock:
                slot.dispatch1(*self._addrs, x, push)
            slot.wait(timeout)

    def dispatch_many(self, items: Sequence[tuple[Groups, bytes | bytearray | memoryview]], *,
                      barrier: bool = False, timeout: float | None = None) -> None:
        """Record several dispatches in one command buffer, submit, wait. ``barrier`` orders
        each after the previous one (otherwise they may overlap: use it only for disjoint
        work)."""
        dev = self.device
        with self._lock:
            dev.check_open()
            slot = self._slot
            if slot is None:
                raise GpuError(f"pipeline {self.name} is closed")
            dims = [self._check(groups, push) for groups, push in items]  # before recording
            slot.wait(timeout)
            sizes = {len(push) for _, push in items}
            if dev.native is not None and len(sizes) == 1:  # one C call records + submits
                size = sizes.pop()
                flat = array("I", [v for d in dims for v in d])
                pushes = b"".join(bytes(push) for _, push in items) or b"\0"
                with dev.lock:
                    slot.dispatch(*self._addrs, flat, pushes, len(items), size, barrier)
                slot.wait(timeout)
                return
            with dev.lock:
                slot.begin(timeout)
                try:
                    for k, (groups, push) in enumerate(items):
                        if k and barrier:
                            slot.barrier()
                        self.record(slot, groups, push)
                finally:
                    slot.end()
                slot.submit()
            slot.wait(timeout)

    def close(self) -> None:
        dev = self.device
        if dev.handle is None:
            return
        vk = dev._vk
        lib, null = vk.lib, vk.ffi.NULL
        if self._slot is not None:
            self._slot.close()
            self._slot = None
        if self.handle is not None:
            lib.vkDestroyPipeline(dev.handle, self.handle, null)
            self.handle = None
        if self.layout is not None:
            lib.vkDestroyPipelineLayout(dev.handle, self.layout, null)
            self.layout = None
        if self.module is not None:
            lib.vkDestroyShaderModule(dev.handle, self.module, null)
            self.module = None
