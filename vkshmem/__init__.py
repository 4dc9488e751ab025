"""vkshmem: vendor-neutral OpenSHMEM-style distributed shared memory for CPUs and GPUs.

The OpenSHMEM API lives in :mod:`vkshmem.shmem` (``from vkshmem import shmem``); importing
this package alone initialises nothing.
"""

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
    VkshmemError,
    WaitTimeoutError,
)

__version__ = "0.2.0"

__all__ = [
    "BootstrapError",
    "ConfigError",
    "FeatureNotAvailableError",
    "HeapExhaustedError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "NotAllocatedError",
    "PeerFailedError",
    "PluginError",
    "TransportError",
    "VkshmemError",
    "WaitTimeoutError",
    "__version__",
]


def __getattr__(name: str) -> object:
    # ``from vkshmem import shmem`` imports (and, by default, initialises) the API lazily.
    if name == "shmem":
        import importlib

        return importlib.import_module("vkshmem.shmem")
    raise AttributeError(f"module 'vkshmem' has no attribute {name!r}")
