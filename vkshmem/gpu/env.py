"""The environment variables the GPU layer reads, their defaults, and how they are parsed.

The ``vulkan`` domain's own variables are declared here (:data:`VARIABLES`, its
``DomainSpec.variables``, which ``vkshmem info`` lists) and parsed once per process
(:func:`settings`); the core's config registry (:mod:`vkshmem.core.config`) keeps the GPU
variables the core reads itself (``VKSHMEM_GPU_TIMEOUT``, ``_PROVIDER``, ``_NATIVE``,
``_PROXY_CHUNK``, ``_RING_REDUCE``), and a vendor's accelerator declares its own
(:attr:`vkshmem.gpu.accel.GpuAccelerator.variables`). The Vulkan objects made outside a domain
(tests, tools) read their defaults from the environment with :func:`env_float`/:func:`env_size`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from vkshmem.core.config import parse_bool, parse_choice, parse_size
from vkshmem.core.errors import ConfigError

__all__ = ["DEFAULT_SPIN_US", "DEFAULT_STAGING", "DEFAULT_TIMEOUT", "ENV_BAR", "ENV_BAR_READ",
           "ENV_BAR_WRITE", "ENV_DEVICE", "ENV_NATIVE", "ENV_SPIN", "ENV_STAGING", "ENV_TIMEOUT",
           "VARIABLES", "EnvVariable", "GpuSettings", "env_float", "env_size", "parse_bool",
           "parse_choice", "parse_variables", "settings"]

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
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(name, f"expected a finite number >= 0, got {raw!r}")
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


# -- the vulkan domain's own variables ----------------------------------------------------------


def _parse_us(text: str) -> float:
    """Microseconds >= 0 (0: no polling; unlike the core's seconds, 0 is not "no limit")."""
    value = float(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _parse_device(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError("must be a device number >= 0, as `vkshmem info` lists them (empty: "
                         "local rank % devices)")
    return int(text)


@dataclass(frozen=True)
class EnvVariable:
    """One variable of a component: its name, default (text), meaning, parser and the
    attribute its parsed value takes."""

    name: str
    default: str
    doc: str
    parse: Callable[[str], Any]
    attr: str


def parse_variables(variables: tuple[EnvVariable, ...], make: Callable[..., Any],
                    environ: Mapping[str, str] | None = None) -> Any:
    """``make(**values)`` from ``variables`` read in ``environ`` (default ``os.environ``),
    parsed once per distinct set of values (a cached parse: the same object again while the
    environment is unchanged); ConfigError naming the variable for a bad value."""
    env = os.environ if environ is None else environ
    return _parse_cached(variables, make, tuple(env.get(v.name) for v in variables))


@lru_cache(maxsize=32)
def _parse_cached(variables: tuple[EnvVariable, ...], make: Callable[..., Any],
                  raw: tuple[str | None, ...]) -> Any:
    values = {}
    for var, text in zip(variables, raw, strict=True):
        source = var.default if text is None else text
        try:
            values[var.attr] = var.parse(source)
        except ValueError as exc:
            raise ConfigError(var.name, f"bad value {source!r}: {exc}") from None
    return make(**values)


@dataclass(frozen=True)
class GpuSettings:
    """The ``vulkan`` domain's variables, parsed (:func:`settings`)."""

    symmetric_size: int
    device: int | None
    staging_size: int
    spin_us: float
    host_import: bool
    bar: str
    bar_write_max: int
    bar_read_max: int
    validation: bool
    mapped: bool


_VARIABLES = (
    EnvVariable("VKSHMEM_GPU_SYMMETRIC_SIZE", "256M",
             "Size of each PE's symmetric GPU heap (Vulkan device memory, exportable). It is "
             "made at the first allocation with domain='gpu' (or 'auto' choosing the GPU).",
             parse_size, "symmetric_size"),
    EnvVariable(ENV_DEVICE, "",
             "Vulkan device of this PE, by number in 'vkshmem info' order (GPUs first, CPU "
             "drivers such as lavapipe last); empty: the PE's local rank modulo the number of "
             "GPUs.", _parse_device, "device"),
    EnvVariable(ENV_STAGING, "8M",
             "Host-visible staging buffer of each PE's Vulkan device (host <-> GPU copies go "
             "through it in two halves).", parse_size, "staging_size"),
    EnvVariable(ENV_SPIN, "200",
             "Microseconds a wait for the GPU polls its fence before blocking in the driver.",
             _parse_us, "spin_us"),
    EnvVariable("VKSHMEM_GPU_HOST_IMPORT", "1",
             "Import the host heap into the GPU (VK_EXT_external_memory_host) when the GPU "
             "domain opens, so CPU<->GPU copies between symmetric arrays are one DMA; the driver "
             "may pin the whole heap (VKSHMEM_SYMMETRIC_SIZE of RAM per PE). 0 stages those "
             "copies instead.", parse_bool, "host_import"),
    EnvVariable(ENV_BAR, "auto",
             "Let exportable GPU memory take the CPU-mapped device-local type (a PCIe BAR) "
             "although the spec excludes it for exportable buffers: then small CPU->GPU puts, "
             "gets and flag writes are CPU stores and loads. auto: on NVIDIA without the "
             "validation layer, checked at start-up; 1: always try; 0: never.",
             parse_choice("auto", "0", "1"), "bar"),
    EnvVariable(ENV_BAR_WRITE, "64K",
             "Largest CPU->GPU transfer done with CPU stores into a write-combined GPU mapping "
             "(larger ones are GPU copies).", parse_size, "bar_write_max"),
    EnvVariable(ENV_BAR_READ, "256",
             "Largest GPU->CPU transfer done with CPU loads from a write-combined GPU mapping "
             "(they run at tens of MB/s; larger ones are GPU copies).", parse_size,
             "bar_read_max"),
    EnvVariable("VKSHMEM_GPU_VALIDATION", "0",
             "Load the Khronos validation layer for the GPU domain; its errors make vkshmem "
             "raise GpuError after the next barrier_all and at finalize (CI sets it).",
             parse_bool, "validation"),
    EnvVariable("VKSHMEM_GPU_MAPPED", "1",
             "Where GPU memory is host-visible (lavapipe, resizable-BAR GPUs), copy, wait and "
             "zero through its CPU mapping (and, on CPU drivers, apply AMOs with CPU atomics). "
             "0 takes the discrete-GPU paths everywhere: staged copies, shader atomics, polled "
             "waits.", parse_bool, "mapped"),
)

#: ``(name, default, meaning)`` of each: the vulkan domain's ``DomainSpec.variables``
VARIABLES = tuple((v.name, v.default, v.doc) for v in _VARIABLES)


def settings(environ: Mapping[str, str] | None = None) -> GpuSettings:
    """The ``vulkan`` domain's variables as set in ``environ`` (default ``os.environ``),
    parsed once (see :func:`parse_variables`)."""
    return parse_variables(_VARIABLES, GpuSettings, environ)
