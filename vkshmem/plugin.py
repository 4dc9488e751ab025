"""The plugin kit: everything a transport or memory-domain plugin imports from vkshmem.

A third party's plugin (and every in-tree one) imports this module, :mod:`vkshmem.testing`
and the public API (:mod:`vkshmem.shmem`), nothing else of vkshmem; ``tests/test_structure.py``
holds the in-tree plugins to it. A plugin registers its specs through the :data:`hookimpl`
hooks, under the entry-point groups ``vkshmem.transports`` or ``vkshmem.domains``::

    from vkshmem.plugin import TransportSpec, hookimpl

    @hookimpl
    def register_transports(register):
        register(TransportSpec(name="mynic", factory=MyTransport, api_version=API_VERSION))

Versioning: :data:`API_VERSION` is ``"major.minor"`` of this API. A spec declares the version
it was built for (``api_version``; by default the version of the vkshmem it was imported
from); at load time a spec of another major version, or of a newer minor one, is refused with
a message naming both versions.

Native code: :func:`get_include` is the folder holding ``vkshmem/plugin.h`` (the native ops
table, the watch board and the status codes every native transport uses).

The names of the Vulkan domain's accelerator interface (:class:`GpuAccelerator`,
:class:`DomainAccelerator`, :class:`GpuError`, :class:`GpuMemory`, ``CONTROL_*``,
:func:`vulkan_initiator`, ...) come from :mod:`vkshmem.gpu` and are imported at first use: a
transport plugin or a build script importing this module does not load the GPU layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core._native import ffi as _ffi
from .core.auth import derive_key
from .core.config import Config, parse_bool, parse_choice, parse_size
from .core.dlpack import KDL_CPU, KDL_CUDA, cuda_array_interface, dlpack_capsule
from .core.domains.array import DomainArray
from .core.domains.contract import (
    DomainContext,
    DomainExport,
    DomainLink,
    DomainSpec,
    MemoryDomain,
    StreamOps,
)
from .core.errors import (
    BootstrapError,
    ConfigError,
    FeatureNotAvailableError,
    HeapExhaustedError,
    InvalidArgumentError,
    InvalidTypeError,
    NotAllocatedError,
    PeerFailedError,
    PluginError,
    TransportError,
    ValueRangeError,
    VkshmemError,
    WaitTimeoutError,
)
from .core.plugins.apiversion import API_VERSION, check_api_version, parse_api_version
from .core.plugins.build import FoundLibrary, header_cdef, include_dir, locate_library, plugin_cdef
from .core.plugins.hookspecs import hookimpl
from .core.plugins.nativetransport import STATUS, NativeTransport, status_message
from .core.shmnames import job_shm_name
from .core.transports.contract import (
    ALL_AMO_OPS,
    ALL_OPS,
    AMO,
    RMA,
    AmoOp,
    CollectiveArgs,
    PeerInfo,
    SegmentInfo,
    Transport,
    TransportContext,
    TransportSpec,
)

#: names taken from the Vulkan domain (:mod:`vkshmem.gpu`), loaded at first use (PEP 562): a
#: transport plugin or a build script importing this module does not load vkshmem.gpu
_GPU_NAMES = frozenset({
    "CONTROL_BYTES",
    "CONTROL_SLOT",
    "CONTROL_WORDS",
    "DomainAccelerator",
    "EnvVariable",
    "ExportInfo",
    "GpuAccelerator",
    "GpuError",
    "GpuMemory",
    "PeerMaps",
    "gpu_settings",
    "parse_variables",
    "vulkan_initiator",
})

if TYPE_CHECKING:
    from .gpu.accel import (
        CONTROL_BYTES,
        CONTROL_SLOT,
        CONTROL_WORDS,
        DomainAccelerator,
        EnvVariable,
        ExportInfo,
        GpuAccelerator,
        GpuError,
        GpuMemory,
        PeerMaps,
        gpu_settings,
        parse_variables,
        vulkan_initiator,
    )

__all__ = [
    "ALL_AMO_OPS",
    "ALL_OPS",
    "AMO",
    "API_VERSION",
    "CONTROL_BYTES",
    "CONTROL_SLOT",
    "CONTROL_WORDS",
    "KDL_CPU",
    "KDL_CUDA",
    "RMA",
    "STATUS",
    "AmoOp",
    "BootstrapError",
    "CollectiveArgs",
    "Config",
    "ConfigError",
    "DomainAccelerator",
    "DomainArray",
    "DomainContext",
    "DomainExport",
    "DomainLink",
    "DomainSpec",
    "EnvVariable",
    "ExportInfo",
    "FeatureNotAvailableError",
    "FoundLibrary",
    "GpuAccelerator",
    "GpuError",
    "GpuMemory",
    "HeapExhaustedError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "MemoryDomain",
    "NativeTransport",
    "NotAllocatedError",
    "PeerFailedError",
    "PeerInfo",
    "PeerMaps",
    "PluginError",
    "SegmentInfo",
    "StreamOps",
    "Transport",
    "TransportContext",
    "TransportError",
    "TransportSpec",
    "ValueRangeError",
    "VkshmemError",
    "WaitTimeoutError",
    "address_of",
    "check_api_version",
    "cuda_array_interface",
    "derive_key",
    "dlpack_capsule",
    "get_include",
    "gpu_settings",
    "header_cdef",
    "hookimpl",
    "job_shm_name",
    "locate_library",
    "parse_api_version",
    "parse_bool",
    "parse_choice",
    "parse_size",
    "parse_variables",
    "plugin_cdef",
    "status_message",
    "vulkan_initiator",
]

#: the folder to put on a native plugin's include path: it holds ``vkshmem/plugin.h``
get_include = include_dir


def address_of(buf: Any) -> int:
    """The address of a contiguous host buffer (read-only ones included): valid while the
    caller holds ``buf`` (cffi's view of it costs a sixth of numpy's)."""
    return int(_ffi.cast("uintptr_t", _ffi.from_buffer(buf)))


def __getattr__(name: str) -> Any:
    """The names of :data:`_GPU_NAMES`, imported from :mod:`vkshmem.gpu.accel` at first use."""
    if name in _GPU_NAMES:
        from .gpu import accel

        value = getattr(accel, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
