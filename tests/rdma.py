"""Is there an RDMA device for the verbs integration tests, and if not, exactly why not?

:func:`rdma_device` looks in ``/sys/class/infiniband``; where that lists nothing and this
process may, it tries to create a soft RoCE device (``rdma link add vkshmem_rxe0 type rxe
netdev <the first interface that is up>``; deleted again at exit). The answer is computed once
per test session.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess

SYSFS = "/sys/class/infiniband"
RXE = "vkshmem_rxe0"

__all__ = ["RXE", "SYSFS", "rdma_device"]


def _devices() -> list[str]:
    try:
        return sorted(os.listdir(SYSFS))
    except OSError:
        return []


def _netdev() -> str | None:
    try:
        for name in sorted(os.listdir("/sys/class/net")):
            with open(f"/sys/class/net/{name}/operstate") as f:
                if name != "lo" and f.read().strip() == "up":
                    return name
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def rdma_device() -> tuple[str | None, str]:
    """``(device, "")``, or ``(None, why there is none)``."""
    found = _devices()
    if found:
        return found[0], ""
    absent = f"{SYSFS} is {'empty' if os.path.isdir(SYSFS) else 'missing'}"
    rdma, netdev = shutil.which("rdma"), _netdev()
    if rdma is None:
        return None, f"no RDMA device: {absent} and the `rdma` tool (iproute2) is not installed"
    if netdev is None:
        return None, f"no RDMA device: {absent} and no network interface is up for rxe"
    cmd = [rdma, "link", "add", RXE, "type", "rxe", "netdev", netdev]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"no RDMA device: {absent} and `{' '.join(cmd)}` failed: {exc}"
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        return None, (f"no RDMA device: {absent}, and `rdma {' '.join(cmd[1:])}` failed "
                      f"({why[-1] if why else f'exit {r.returncode}'}; a soft RoCE device "
                      "needs the kernel's ib_core and rdma_rxe modules)")
    atexit.register(subprocess.run, [rdma, "link", "delete", RXE], capture_output=True,
                    timeout=10)
    found = _devices()
    return (found[0], "") if found else (None, f"`{' '.join(cmd)}` succeeded but {SYSFS} "
                                               "lists no device")
