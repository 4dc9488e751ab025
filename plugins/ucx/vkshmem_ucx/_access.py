"""Which of UCX's transports a rail may open: those that enforce access to a PE's memory.

UCX's own transports differ in what keeps a stranger out of a PE's memory (docs/security.md has
the table). Two enforce nothing a job could rely on:

* ``tcp`` applies the remote address of a put or get as it comes, checking no remote key: any
  process that reaches its listening port can write anywhere in the PE's address space;
* ``sysv`` creates its shared-memory segments mode 0660: every process of the user's *group*
  can attach them.

So by default a rail's ``UCX_TLS`` leaves both out: unset (UCX's ``all``), it becomes
``^tcp,sysv``; an exclusion list (``^...``) gets them added; a list that names them is an
error that says why and what to use instead; the aliases ``sm``/``shm``/``mm`` (which contain
``sysv``) are narrowed to their other members. ``VKSHMEM_UCX_TRUSTED_NETWORK=1`` (or the rail
option ``trusted=on``) says that every process that can reach the rail's network and the user's
group is trusted: then UCX_TLS is left as it is, and where ``tcp`` may be used and no
``UCX_NET_DEVICES`` is given, the rail's tcp listens only on the interface the job uses (plus
any RDMA port of the host).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
from collections.abc import Mapping

from vkshmem.plugin import ConfigError

__all__ = ["TRUST_VAR", "UNCHECKED", "job_devices", "restrict"]

log = logging.getLogger("vkshmem.ucx")

#: the variable that lifts the refusal (the rail option ``trusted=`` overrides it per rail)
TRUST_VAR = "VKSHMEM_UCX_TRUSTED_NETWORK"
#: UCX transports that do not enforce access to the memory they serve, and why
UNCHECKED = {
    "tcp": "UCX's tcp transport writes and reads whatever address a request names, without "
           "checking a remote key: any process that reaches its port could write into any PE's "
           "memory",
    "sysv": "UCX creates its SysV shared-memory segments mode 0660: every process of the "
            "user's group could attach a PE's memory",
}
#: UCX's aliases that contain an unchecked transport, and their other members that are always
#: built (xpmem and knem need kernel modules: name them explicitly where a site UCX has them)
_ALIASES = {"sm": ("posix", "cma"), "shm": ("posix", "cma"), "mm": ("posix",)}
_SIOCGIFADDR = 0x8915


def restrict(ucx: dict[str, str], trusted: bool, rail_var: str, host_address: str) -> None:
    """Apply the access policy to the UCX variables ``ucx`` (without the ``UCX_`` prefix) of
    one rail, in place: ``TLS`` is set to what the rail may open, and under ``trusted`` the
    tcp listener is kept to the job's interface. Raises ConfigError for a list that names an
    unchecked transport without ``trusted``."""
    given = ucx.get("TLS") or os.environ.get("UCX_TLS") or "all"
    source = f"{rail_var} (tls=)" if "TLS" in ucx else "UCX_TLS"
    names = [n.strip() for n in given.strip().split(",") if n.strip()]
    if trusted:
        if _may_use_tcp(names) and "NET_DEVICES" not in ucx and \
                "UCX_NET_DEVICES" not in os.environ:
            devices = job_devices(host_address)
            if devices:
                ucx["NET_DEVICES"] = ",".join(devices)
        return
    if names in (["all"], ["^"]) or not names:
        ucx["TLS"] = "^" + ",".join(UNCHECKED)
        return
    if names[0].startswith("^"):
        excluded = [names[0][1:], *names[1:]]
        ucx["TLS"] = "^" + ",".join(dict.fromkeys([*filter(None, excluded), *UNCHECKED]))
        return
    bad = [n for n in names if n in UNCHECKED or n == "all"]
    if bad:
        why = "; ".join(UNCHECKED[n] for n in dict.fromkeys(bad) if n in UNCHECKED)
        raise ConfigError(source, f"ucx: {given!r} names {', '.join(bad)}, which vkshmem does "
                          f"not open by default ({why or 'all includes tcp and sysv'}). Use "
                          "UCX's shared memory (posix,cma,self) on a node, a verbs NIC "
                          "(rc,ud,dc: the NIC checks remote keys) between nodes, or the "
                          "authenticated hostproxy transport (VKSHMEM_TRANSPORTS=hostproxy); "
                          f"or, if only the job's own hosts and users can reach this network "
                          f"and the user's group is trusted, set {TRUST_VAR}=1 (or the rail "
                          "option trusted=on)")
    narrowed: list[str] = []
    for n in names:
        narrowed.extend(_ALIASES.get(n, (n,)))
    if narrowed != names:
        log.info("ucx: %s=%s narrowed to %s (sysv segments are mode 0660; %s=1 keeps it)",
                 source, given, ",".join(dict.fromkeys(narrowed)), TRUST_VAR)
        ucx["TLS"] = ",".join(dict.fromkeys(narrowed))
    else:
        ucx["TLS"] = given


def _may_use_tcp(names: list[str]) -> bool:
    if not names or names == ["all"]:
        return True
    if names[0].startswith("^"):
        return "tcp" not in {names[0][1:], *names[1:]}
    return "tcp" in names


def job_devices(host_address: str) -> list[str]:
    """UCX's names of the network devices the job uses: the interface that holds
    ``host_address`` (IPv4) and every RDMA port of this host (``mlx5_0:1``). Empty when no
    interface holds it (then UCX's own choice stands)."""
    iface = _interface_of(host_address)
    if iface is None:
        return []
    rdma = []
    base = "/sys/class/infiniband"
    for dev in sorted(os.listdir(base)) if os.path.isdir(base) else ():
        ports = os.path.join(base, dev, "ports")
        rdma += [f"{dev}:{p}" for p in sorted(os.listdir(ports))] if os.path.isdir(ports) else []
    return [iface, *rdma]


def _interface_of(address: str) -> str | None:
    try:
        want = socket.inet_aton(address)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            try:
                got = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if got[20:24] == want:
                return name
    return None


def trusted_default(env: Mapping[str, str] = os.environ) -> bool:
    """``VKSHMEM_UCX_TRUSTED_NETWORK`` as a boolean (ConfigError for another value)."""
    value = env.get(TRUST_VAR, "0").strip().lower()
    if value in ("1", "yes", "on", "true"):
        return True
    if value in ("0", "no", "off", "false", ""):
        return False
    raise ConfigError(TRUST_VAR, f"{value!r} is not a boolean (use 1 or 0)")
