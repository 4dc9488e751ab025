"""The environment variables the GPU layer reads, their defaults, and how they are parsed.

The core's config registry (:mod:`vkshmem.core.config`) lists them too.
"""

from __future__ import annotations

import os

from vkshmem.core.errors import ConfigError

__all__ = ["DEFAULT_SPIN_US", "DEFAULT_STAGING", "DEFAULT_TIMEOUT", "ENV_BAR", "ENV_BAR_READ",
           "ENV_BAR_WRITE", "ENV_DEVICE", "ENV_NATIVE", "ENV_SPIN", "ENV_STAGING", "ENV_TIMEOUT",
           "env_float", "env_size"]

ENV_DEVICE = "VKSHMEM_GPU_DEVICE"
ENV_TIMEOUT = "VKSHMEM_GPU_TIMEOUT"
ENV_STAGING = "VKSHMEM_GPU_STAGING_SIZE"
ENV_SPIN = "VKSHMEM_GPU_SPIN_US"
ENV_NATIVE = "VKSHMEM_GPU_NATIVE"
ENV_BAR = "VKSHMEM_GPU_BAR"
ENV_BAR_WRITE = "VKSHMEM_GPU_BAR_WRITE_MAX"
ENV_BAR_READ = "VKSHMEM_GPU_BAR_READ_MAX"
DEFAULT_SPIN_US = 200.0
DEFAULT_TIMEOUT = 30.0
DEFAULT_STAGING = 8 << 20


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, f"expected a number of seconds, got {raw!r}") from None
    return value


def env_size(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if raw[-1].upper() in units:
            return int(float(raw[:-1]) * units[raw[-1].upper()])
        return int(raw)
    except ValueError:
        raise ConfigError(name, f"expected a size such as 8M, got {raw!r}") from None
