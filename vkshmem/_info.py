"""``vkshmem info``: version, the config registry with current values, the plugins found, and
(by starting a small job) the route each PE takes to each peer."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from . import __version__
from .core.config import load
from .core.errors import VkshmemError
from .core.plugins.loader import load_plugins
from .core.transports.contract import AMO, RMA


def main(args: argparse.Namespace) -> int:
    """Print everything a bug report needs; returns the exit code."""
    print(f"vkshmem {__version__} (OpenSHMEM 1.5 API), Python {platform.python_version()} "
          f"on {platform.machine()}")
    try:
        cfg = load()
    except VkshmemError as exc:
        print(f"configuration error: {exc}")
        return 2
    print("\nConfiguration (VKSHMEM_* variables; * = set in the environment):")
    for var, value in cfg.items():
        mark = "*" if (var.name in os.environ or (var.kind == "rail" and value)) else " "
        print(f" {mark} {var.name:26s} = {value or '(unset)':14s} [{var.kind}, default "
              f"{var.default or 'unset'}]")
        for line in textwrap.wrap(var.doc, 72):
            print(f"      {line}")
    reg = load_plugins(cfg)
    print("\nPlugins (entry points):")
    for p in reg.plugins:
        provides = f" -> {', '.join(p.provides)}" if p.provides else ""
        print(f"   {p.group:20s} {p.name:12s} from {p.distribution} {p.version}: "
              f"{p.status}{provides}")
    print("\nTransports (priority order; 'shm' is the core's same-node path):")
    print(f"   {'shm':12s} priority 1000  core   same-node load/store "
          f"({'on' if cfg.shm else 'off: VKSHMEM_SHM=0'})")
    for spec in sorted(reg.transports.values(), key=lambda s: -s.priority):
        reach = "+".join(sorted(spec.reach))
        kinds = "+".join(sorted(spec.memory_kinds))
        absent = (" [not available here: left out of the automatic choice]"
                  if spec.available is not None and not spec.available() else "")
        print(f"   {spec.name:12s} priority {spec.priority:<5d} {reg.origin[spec.name]:10s} "
              f"reach {reach}, registers {kinds}; {spec.description}{absent}")
        _plugin_variables(spec.variables)
    print("\nMemory domains (segment 0 host, 1 internal, then the plugins in name order):")
    print(f"   {'host':12s} segment 0     core       memfd host heap (VKSHMEM_SYMMETRIC_SIZE)")
    for seg, spec in enumerate(sorted(reg.domains.values(), key=lambda s: s.name), start=2):
        print(f"   {spec.name:12s} segment {seg:<5d} {reg.origin[spec.name]:10s} "
              f"family {spec.family}, priority {spec.priority}; {spec.description}")
        print(textwrap.fill(_carriage(spec, reg.transports.values()), 100,
                            initial_indent=" " * 16, subsequent_indent=" " * 16))
        _plugin_variables(spec.variables)
    _gpu_accelerators(cfg)
    _gpu_devices()
    print(f"\nRoutes of a {args.npes}-PE job on this node (vkshmem run -n {args.npes}), per "
          "peer and domain (domains are opened here to show them):")
    sys.stdout.flush()
    script = Path(__file__).with_name("_routes.py")
    cmd = [sys.executable, "-m", "vkshmem", "run", "-n", str(args.npes), "--timeout", "120",
           str(script)]
    return subprocess.run(cmd, timeout=180).returncode


def _plugin_variables(variables: Any) -> None:
    """A plugin's own variables (``DomainSpec.variables``, ``TransportSpec.variables``) with
    their current values, as the core's are printed (* = set in the environment)."""
    for name, default, doc in variables:
        value = os.environ.get(name)
        mark = "*" if value is not None else " "
        print(f"             {mark} {name:30s} = {value or '(unset)':10s} [default "
              f"{default or 'unset'}]")
        for line in textwrap.wrap(doc, 72):
            print(f"                   {line}")


def _carriage(spec: Any, transports: Any) -> str:
    """What carries domain ``spec``'s heap to each kind of peer: same-node peers that import
    it (the shm path); per transport, what it registers and carries (puts and gets, AMOs:
    :meth:`TransportSpec.ops_on`), the rest going through the domain proxy (the target's proxy
    thread, data staged through host memory over the host heap's transport)."""
    kinds = set(spec.memory_kinds)
    if not kinds:
        return "memory kind not declared: peers not imported go through the domain proxy"
    dmabuf = "dmabuf" in kinds
    own = sorted(kinds - {"dmabuf"}) or ["dmabuf"]
    parts = []
    for t in sorted(transports, key=lambda t: -t.priority):
        says = []
        for kind in own:
            ops = t.ops_on(kind, dmabuf)
            how = kind if kind in t.memory_kinds else (
                f"{kind} by its dma-buf, where the build and the device or provider take one")
            if ops >= {RMA, AMO}:
                says.append(f"registers it ({how}): puts, gets and AMOs")
            elif RMA in ops:
                says.append(f"registers it ({how}): puts and gets; AMOs through the domain "
                            "proxy")
            else:
                says.append("through the domain proxy")
        parts.append(f"{t.name} {' / '.join(dict.fromkeys(says))}")
    where = ("same-node peers on the same device" if spec.family == "gpu"
             else "same-node peers")
    return (f"memory {'/'.join(sorted(kinds))}: {where} import it (direct); other peers: "
            + ("; ".join(parts) if parts else "the domain proxy (no transport installed)"))


def _gpu_accelerators(cfg: Any) -> None:
    """The vendor accelerations of the Vulkan domain (entry points ``vkshmem.gpu_accelerators``,
    :mod:`vkshmem.gpu.accel`) with their variables."""
    print("\nVulkan domain accelerators (entry points vkshmem.gpu_accelerators):")
    try:
        from .gpu.accel import installed_accelerators

        found = installed_accelerators(cfg)
    except Exception as exc:
        print(f"   none usable: {exc}")
        return
    if not found:
        print("   none installed: the vulkan domain is Vulkan-only (vkshmem-cuda, "
              "plugins/cuda, adds NVIDIA's)")
    for entry in found:
        accel = entry.accelerator
        if accel is None:
            print(f"   {entry.name:12s} from {entry.distribution}: {entry.status}")
            continue
        print(f"   {entry.name:12s} from {entry.distribution}: {accel.status()}; "
              f"{accel.description}")
        _plugin_variables(accel.variables)


def _gpu_devices() -> None:
    """The Vulkan devices of the GPU domain, in VKSHMEM_GPU_DEVICE numbering."""
    print("\nVulkan devices (VKSHMEM_GPU_DEVICE numbers; a PE takes local rank % GPUs):")
    try:
        from .gpu.vk.instance import list_devices

        devices = list_devices()
    except Exception as exc:
        print(f"   none usable: {exc}")
        return
    for d in devices:
        caps = [c for c, ok in (("opaque-fd", d.external_memory_fd), ("dma-buf", d.dma_buf),
                                ("int64-atomics", d.int64_atomics),
                                ("host-visible-vram", d.device_local_host_visible)) if ok]
        print(f"   {d.index}: {d.name} [{d.device_type}] {d.driver_name} {d.driver_info}; "
              f"{', '.join(caps) or 'no external memory'}")
