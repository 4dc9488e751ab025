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
- :mod:`vkshmem.gpu.shaders` — ``build()``/``check()`` of the shipped SPIR-V.
"""

from .device import VulkanDevice
from .env import ENV_DEVICE, ENV_STAGING, ENV_TIMEOUT
from .errors import GpuError, GpuTimeoutError, RingError
from .instance import list_devices
from .kernels import REDUCE_DTYPES, REDUCE_FEATURES, REDUCE_OPS, reduce_unsupported
from .launch import Launch, UserKernel, pack_push
from .memory import ExportInfo, GpuMemory
from .physical import DeviceInfo
from .pipeline import ComputePipeline, load_spirv, shipped_shaders
from .ring import Descriptor, Ring, RingOp, SignalOp
from .ringservice import RingService
from .segment import GpuSegment

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
    "UserKernel",
    "VulkanDevice",
    "list_devices",
    "load_spirv",
    "pack_push",
    "reduce_unsupported",
    "shipped_shaders",
]
