"""Low-level access to Vulkan through the ``vulkan`` PyPI package (cffi, ABI mode).

Only the package's ``ffi`` (every Vulkan type and constant) and ``lib`` (the loader,
``libvulkan.so.1``) are used; its Python wrappers are avoided: building a struct through them
costs 10-35 us, some return the wrong thing (``vkGetBufferDeviceAddress`` returns its info
struct instead of the address) and two Vulkan 1.2 flag constants are missing from its module
(``VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT``, ``VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT``; the
cffi ``lib`` does have them, and we define them here anyway), and ``VK_WHOLE_SIZE`` is ``-1``
(cffi refuses it for an unsigned ``VkDeviceSize``). Structs are built with
``ffi.new`` (~1 us) and prebuilt for hot paths.

Importing this module never imports ``vulkan``; :func:`load` does, and turns every way of it
being absent into a :class:`~vkshmem.core.errors.FeatureNotAvailableError` that says what to
install.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

from vkshmem.core.errors import FeatureNotAvailableError

from ..errors import GpuError

__all__ = ["VK", "c_strings", "check", "cstr", "keep", "load", "make_version"]


def make_version(major: int, minor: int, patch: int = 0) -> int:
    """``VK_MAKE_API_VERSION(0, major, minor, patch)``."""
    return (major << 22) | (minor << 12) | patch


class _Vk:
    """The loaded cffi ``ffi``/``lib`` pair plus constants the package lacks."""

    # Missing from the package's module namespace (present in the Vulkan 1.2 headers).
    BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT = 0x00020000
    MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT = 0x00000002
    API_VERSION_1_2 = make_version(1, 2)
    # The package defines VK_WHOLE_SIZE as -1, which cffi refuses for a VkDeviceSize.
    WHOLE_SIZE = (1 << 64) - 1

    def __init__(self, module: Any) -> None:
        self.module = module
        self.ffi = module.ffi
        self.lib = module.lib
        self.results = {
            name: value for name, value in vars(module).items()
            if name.startswith(("VK_ERROR_", "VK_SUCCESS", "VK_TIMEOUT", "VK_NOT_READY",
                                "VK_INCOMPLETE", "VK_EVENT_"))
            and isinstance(value, int)
        }

    def __getattr__(self, name: str) -> Any:
        # Constants: VK.VK_STRUCTURE_TYPE_... (module first, then the cffi lib's enums).
        try:
            return getattr(self.module, name)
        except AttributeError:
            return getattr(self.lib, name)

    def result_name(self, code: int) -> str:
        for name, value in self.results.items():
            if value == code and not name.endswith(("_KHR", "_EXT")):
                return name
        for name, value in self.results.items():
            if value == code:
                return name
        return str(code)


_lock = threading.Lock()
_loaded: _Vk | None = None

#: What a user needs when the Vulkan pieces are missing (Debian 12 package names).
INSTALL_HINT = (
    "install the Vulkan loader and a driver (Debian/Ubuntu: apt-get install libvulkan1 "
    "mesa-vulkan-drivers; mesa-vulkan-drivers provides lavapipe, a CPU Vulkan driver, where "
    "no GPU driver is present) and the Python binding (pip install 'vkshmem[gpu]', i.e. "
    "'vulkan>=1.3')"
)


def load() -> _Vk:
    """Import the ``vulkan`` package (once) or raise FeatureNotAvailableError."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        try:
            import vulkan
        except ImportError as exc:
            raise FeatureNotAvailableError(
                f"the GPU domain needs the Python package 'vulkan' ({exc}); {INSTALL_HINT}"
            ) from None
        except OSError as exc:  # the package raises OSError when libvulkan.so.1 is missing
            raise FeatureNotAvailableError(
                f"the Vulkan loader libvulkan.so.1 could not be loaded ({exc}); {INSTALL_HINT}"
            ) from None
        _loaded = _Vk(vulkan)
        return _loaded


class _Proxy:
    """``VK`` resolves to the loaded :class:`_Vk` on first attribute access."""

    def __getattr__(self, name: str) -> Any:
        return getattr(load(), name)


VK: Any = _Proxy()


def check(result: int, what: str) -> None:
    """Raise GpuError naming ``what`` and the VkResult unless ``result`` is VK_SUCCESS."""
    if result != 0:
        vk = load()
        raise GpuError(f"{what} failed: {vk.result_name(result)}", result)


def cstr(vk: Any, arr: Any) -> str:
    """The text of a NUL-terminated ``char[]`` field."""
    return vk.ffi.string(arr).decode(errors="replace")


def keep(store: list[Any], *objs: Any) -> Any:
    """Hold ``objs`` (cffi objects that a struct points to) in ``store``; returns the first."""
    store.extend(objs)
    return objs[0]


def c_strings(vk: Any, names: Iterable[str], store: list[Any]) -> Any:
    """A ``char*[]`` of ``names`` and its length, the strings held in ``store``."""
    ffi = vk.ffi
    cs = [ffi.new("char[]", s.encode()) for s in names]
    store.extend(cs)
    return keep(store, ffi.new("char*[]", cs)), len(cs)


def icd_hint() -> str:
    """Where the loader looked for drivers, for error messages."""
    for var in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
        if os.environ.get(var):
            return f"{var}={os.environ[var]} is set: check that it names an installed driver's JSON"
    hint = ("no Vulkan driver was found: apt-get install mesa-vulkan-drivers (lavapipe, the CPU "
            "driver) or your GPU vendor's driver, or point VK_DRIVER_FILES at its ICD JSON")
    for folder in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"):
        if os.path.exists(os.path.join(folder, "nvidia_icd.json")):
            hint += ("; on a headless NVIDIA machine (a container without X) the shipped "
                     "nvidia_icd.json names libGLX_nvidia.so.0, which cannot start there: point "
                     "VK_DRIVER_FILES at a copy whose library_path is libEGL_nvidia.so.0")
            break
    return hint
