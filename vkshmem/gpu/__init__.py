"""vkshmem's GPU memory domain through Vulkan (vendor-neutral; lavapipe in CI).

Nothing here imports the ``vulkan`` package until a device is opened, so ``import
vkshmem.gpu`` always works; a missing loader, driver or binding raises
:class:`~vkshmem.core.errors.FeatureNotAvailableError` naming what to install.

- :class:`VulkanDevice` — instance (+ validation layer), physical device, compute queue;
  properties; ``alloc_exportable``/``import_fd``; ``write``/``read``/``copy``; ``amo``;
  ``reduce``; ``pipeline``; ``close``.
- :class:`GpuMemory` — one allocation + buffer + device address; ``export_fd``,
  ``export_info``, ``map``, ``free``.
- :class:`ComputePipeline`, :func:`load_spirv` — SPIR-V compute pipelines with push constants.
- :class:`Ring` — the host view of the GPU-initiated request ring (``shaders/vkshmem.glsl``).
- :class:`GpuSegment` — a symmetric segment as transports see it.
- :class:`Stream` — in-order GPU work without host waits (timeline semaphore): ``stream=``
  of the Vulkan domain (:func:`vkshmem.shmem.gpu_stream`).
- :mod:`vkshmem.gpu.shaders` — ``build()``/``check()`` of the shipped SPIR-V.

Layout: :mod:`~vkshmem.gpu.vk` (Vulkan objects: instance, devices, memory, submissions,
pipelines), :mod:`~vkshmem.gpu.domain` (the ``vulkan`` memory domain, its segment, the CPU
mappings of peers' heaps), :mod:`~vkshmem.gpu.initiated` (GPU-initiated communication:
kernels, the request ring, its service); beside them the domain's entry point
(:mod:`~vkshmem.gpu.plugin`), its variables (:mod:`~vkshmem.gpu.env`), the interface a vendor's
accelerations attach through (:mod:`~vkshmem.gpu.accel`), ``DeviceArray``
(:mod:`~vkshmem.gpu.array`), the public GPU API helpers (:mod:`~vkshmem._api.kernels`) and the
errors.
"""

from .domain.segment import GpuSegment
from .env import ENV_DEVICE, ENV_STAGING, ENV_TIMEOUT
from .errors import GpuError, GpuTimeoutError, RingError
from .initiated.launch import Launch, UserKernel
from .initiated.push import pack_push
from .initiated.ring import Descriptor, Ring, RingOp, SignalOp
from .initiated.ringservice import RingService
from .stream import Stream
from .vk.device import VulkanDevice
from .vk.instance import list_devices
from .vk.kernels import REDUCE_DTYPES, REDUCE_FEATURES, REDUCE_OPS, reduce_unsupported
from .vk.memory import ExportInfo, GpuMemory
from .vk.physical import DeviceInfo
from .vk.pipeline import ComputePipeline, load_spirv, shipped_shaders

__all__ = [
    "ENV_DEVICE",
    "ENV_STAGING",
    "ENV_TIMEOUT",
    "REDUCE_DTYPES",
    "REDUCE_FEATURES",
    "REDUCE_OPS",
    "ComputePipeline",
    "Descriptor",
    "DeviceInfo",
    "ExportInfo",
    "GpuError",
    "GpuMemory",
    "GpuSegment",
    "GpuTimeoutError",
    "Launch",
    "Ring",
    "RingError",
    "RingOp",
    "RingService",
    "SignalOp",
    "Stream",
    "UserKernel",
    "VulkanDevice",
    "list_devices",
    "load_spirv",
    "pack_push",
    "reduce_unsupported",
    "shipped_shaders",
]
