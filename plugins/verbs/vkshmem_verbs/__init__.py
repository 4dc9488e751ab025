"""vkshmem-verbs: the ``verbs`` transport (raw ibverbs: RC QPs, RDMA WRITE/READ, NIC atomics).

Registered through the entry point group ``vkshmem.transports``; the core opens it per rail,
e.g. ``VKSHMEM_TRANSPORTS=verbs`` or ``VKSHMEM_RAIL0=verbs:device=mlx5_0:port=1:gid_index=3``.
See ``README.md`` for the options, the AMO scheme and what was (and was not) exercised.

Importing this package loads nothing: the spec is always offered (so ``vkshmem info`` lists
it); its ``available`` probe says whether this machine has an RDMA device at all, so the
automatic choice passes over it silently where there is none, while naming it gives an error
that says which device is missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vkshmem.plugin import AmoOp, TransportContext, TransportError, TransportSpec, hookimpl

if TYPE_CHECKING:
    from ._transport import VerbsTransport

__all__ = ["NAME", "OPTIONS", "SPEC", "SYSFS", "available", "device_names", "load_native",
           "open_transport", "register_transports"]

NAME = "verbs"
#: Where the kernel lists RDMA devices (one directory per device).
SYSFS = "/sys/class/infiniband"
#: Rail options this transport understands (each also read from ``VKSHMEM_VERBS_<OPTION>``).
OPTIONS = ("device", "port", "gid_index", "mtu", "traffic_class", "sl", "hop_limit",
           "timeout", "ack_timeout", "retry_cnt", "rnr_retry", "depth", "max_inline",
           "staging_kib", "staging_slots", "atomics")


def sysfs_devices(root: str = SYSFS) -> list[str]:
    """The RDMA devices the kernel lists under ``root`` (empty where there is none)."""
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []


def available() -> bool:
    """Whether this machine has an RDMA device (cheap: reads sysfs, loads no library)."""
    return bool(sysfs_devices())


def load_native() -> Any:
    """The native module ``vkshmem_verbs._verbs`` (loading libibverbs), or a TransportError
    that says what to install."""
    try:
        from . import _verbs
    except ImportError as exc:
        raise TransportError(
            NAME, f"cannot load libibverbs ({exc}). Install it (`apt-get install libibverbs1 "
            "ibverbs-providers`, or libibverbs-dev to build), then reinstall vkshmem-verbs "
            "(`pip install 'vkshmem[verbs]'`)") from None
    return _verbs


def device_names() -> tuple[list[str], str]:
    """The devices libibverbs lists, and why the list is empty where it is (its error)."""
    verbs = load_native()
    buf = verbs.ffi.new("char[]", 8192)
    n = verbs.lib.vkv_device_names(buf, 8192)
    if n < 0:
        return [], f"ibv_get_device_list: {os.strerror(-n)}"
    names = [x for x in verbs.ffi.string(buf).decode().split("\n") if x]
    return names, "" if names else "libibverbs lists no device"


def open_transport(context: TransportContext) -> VerbsTransport:
    """The spec's factory: open the verbs transport for one rail (loads libibverbs)."""
    load_native()
    from ._transport import VerbsTransport

    return VerbsTransport(context)


SPEC = TransportSpec(
    name=NAME,
    factory=open_transport,
    priority=30,
    memory_kinds=frozenset({"host", "dmabuf"}),
    reach=frozenset({"intra", "inter"}),
    amo_ops=frozenset(AmoOp),
    amo_widths=frozenset({4, 8}),
    native_fence=True,
    put_signal=False,
    available=available,
    description="raw ibverbs: RC QP per peer, RDMA WRITE/READ, NIC fetch-add/compare-swap "
                "(other AMOs as compare-swap loops); needs an RDMA device",
)


@hookimpl
def register_transports(register: Callable[[Any], None]) -> None:
    """Offer the ``verbs`` transport."""
    register(SPEC)
