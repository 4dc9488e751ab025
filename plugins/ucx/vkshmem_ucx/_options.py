"""The ucx transport's rail options (``VKSHMEM_RAIL<n>=ucx:key=value:...``, see README.md):
parsed and checked once, when the transport opens."""

from __future__ import annotations

import os
from dataclasses import dataclass

from vkshmem.plugin import ConfigError, TransportContext

from . import OPTIONS
from ._access import restrict, trusted_default

__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_WAIT_SPIN_US", "Options", "heap_unshared", "parse_options"]

#: Seconds any wait (completion, flush) may last before the peer is declared stuck or dead.
DEFAULT_TIMEOUT = 60.0
#: Microseconds a caller polls for its operation's completion before it sleeps on the worker.
DEFAULT_WAIT_SPIN_US = 20
_ATOMIC_MODES = ("cpu", "device", "guess")
_TRUE = ("1", "yes", "on", "true")
_FALSE = ("0", "no", "off", "false")


@dataclass(frozen=True)
class Options:
    ucx: dict[str, str]  # UCX variables (without the UCX_ prefix) set for this rail
    timeout: float
    spin_us: int
    wait_spin_us: int
    err_peer: bool
    selftest: str  # auto | on | off
    heap: str  # auto | ucx | core: who allocates the core's host segments (rail option heap=)
    direct: bool  # loads/stores/CPU atomics on peers' segments UCX maps here (rail option)
    domain_amo: str  # ucx | proxy: who carries AMOs on memory domains' segments (rail option)
    trusted: bool  # unchecked UCX transports (tcp, sysv) allowed (rail option / variable)


def parse_options(context: TransportContext) -> Options:
    var = f"VKSHMEM_RAIL{context.rail}"

    def bad(message: str) -> ConfigError:
        return ConfigError(var, f"ucx: {message}")

    ucx: dict[str, str] = {}
    known: dict[str, str] = {}
    for key, value in context.options.items():
        if key.upper().startswith("UCX_") and len(key) > 4:
            ucx[key[4:].upper()] = value
        elif key in OPTIONS:
            known[key] = value
        else:
            raise bad(f"unknown option {key!r} (known: {', '.join(OPTIONS)}, or UCX_<NAME> "
                      "for any UCX variable)")
    if "tls" in known:
        ucx["TLS"] = known["tls"]
    if "dev" in known:  # ':' separates rail options, so a port is written mlx5_0/1
        ucx["NET_DEVICES"] = known["dev"].replace("/", ":")
    if "atomic" in known:
        if known["atomic"] not in _ATOMIC_MODES:
            raise bad(f"atomic={known['atomic']!r} (use {', '.join(_ATOMIC_MODES)})")
        ucx["ATOMIC_MODE"] = known["atomic"]
    elif "ATOMIC_MODE" not in ucx and "UCX_ATOMIC_MODE" not in os.environ:
        # CPU atomics (or UCX's software atomics, applied by the target's CPU) are atomic with
        # the core's own CPU atomics on the same word (shm path, this PE); NIC atomics are not.
        ucx["ATOMIC_MODE"] = "cpu"
    try:
        timeout = float(known.get("timeout", DEFAULT_TIMEOUT))
        if not timeout > 0:
            raise ValueError
    except ValueError:
        raise bad(f"timeout={known['timeout']!r} is not a positive number of seconds") from None
    try:
        spin = int(known.get("spin", "0"))
        if not 0 <= spin <= 10_000_000:
            raise ValueError
    except ValueError:
        raise bad(f"spin={known['spin']!r} is not a number of microseconds (0 to 10000000)"
                  ) from None
    try:
        wait_spin = int(known.get("wait_spin", str(DEFAULT_WAIT_SPIN_US)))
        if not 0 <= wait_spin <= 10_000_000:
            raise ValueError
    except ValueError:
        raise bad(f"wait_spin={known['wait_spin']!r} is not a number of microseconds (0 to "
                  "10000000)") from None
    def choice(key: str, *allowed: str) -> str:
        """The option's value among ``allowed`` (the first is the default; where ``on`` and
        ``off`` are allowed, any boolean spelling becomes one of them)."""
        value = known.get(key, allowed[0]).lower()
        if "on" in allowed and value in _TRUE + _FALSE:
            value = "on" if value in _TRUE else "off"
        if value not in allowed:
            raise bad(f"{key}={known[key]!r} (use {', '.join(allowed)})")
        return value

    errmode = choice("errmode", "none", "peer")
    selftest = choice("selftest", "auto", "on", "off")
    heap = choice("heap", "auto", "ucx", "core")
    direct = choice("direct", "on", "off")
    domain_amo = choice("domain_amo", "ucx", "proxy")
    trusted = (choice("trusted", "off", "on") == "on") if "trusted" in known \
        else trusted_default()
    restrict(ucx, trusted, var, context.host_address)
    if heap != "core" and "ALLOC_PRIO" not in ucx and "UCX_ALLOC_PRIO" not in os.environ:
        # a heap UCX allocates must be shared memory its posix transport maps into the peers
        # (not private memory from another method), else registering it in place is better
        ucx["ALLOC_PRIO"] = "md:posix"
    return Options(ucx, timeout, spin, wait_spin, errmode == "peer", selftest, heap,
                   direct == "on", domain_amo, trusted)


def heap_unshared(context: TransportContext) -> bool:
    """Whether no same-node peer maps this PE's memfd segments (the core's shm path is off,
    ``VKSHMEM_SHM=0``: ``TransportContext.shm``): then UCX may allocate them in place (rail
    option ``heap=auto``)."""
    return not context.shm
