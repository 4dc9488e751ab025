"""Rail options of the ofi transport and what is known about each Debian 12 provider."""

from __future__ import annotations

import os
from dataclasses import dataclass

from vkshmem.plugin import AmoOp, ConfigError, TransportContext

from . import NAME, OPTIONS, PROVIDER_VAR

__all__ = ["BROKEN", "DEFAULT_BUSY_US", "DEFAULT_PROVIDER", "DEFAULT_TIMEOUT", "KNOWN",
           "Options", "amo_bit", "parse_options"]

#: Seconds any wait (completion, quiet) may last before the peer is declared stuck or dead.
DEFAULT_TIMEOUT = 60.0
DEFAULT_PROVIDER = "tcp;ofi_rxm"
#: Microseconds the progress thread polls without sleeping after a peer's operation was served
#: here (shm: seen by a remote-access counter) or a peer's traffic woke it on the CQ's wait fd
#: (tcp;ofi_rxm) (the rail option busy_us; 0: never).
DEFAULT_BUSY_US = 2000
#: Providers measured correct on libfabric 1.17 (Debian 12), with what they need.
KNOWN = {
    "tcp;ofi_rxm": "correct for RMA and every AMO at 32/64 bit; orders put-after-put and "
                   "AMO-after-AMO only (fence = quiet)",
    "shm": "same node only; non-fetching AMOs are injected (fi_atomic with "
           "FI_DELIVERY_COMPLETE crashes it); needs FI_MR_VIRT_ADDR",
    "sockets": "correct but about 10 ms per operation",
}
#: Providers known to be wrong on libfabric 1.17: refused unless the rail option force=1.
BROKEN = {
    "net": "lists FI_ATOMIC but implements no atomic",
    "udp;ofi_rxd": "never completes injected atomics",
    "ofi_rxd": "never completes injected atomics",
    "udp": "has no RMA",
}
_TRUE = ("1", "yes", "on", "true")
_FALSE = ("0", "no", "off", "false")
_W8, _FETCH = 8, 16


def amo_bit(op: AmoOp, width: int, fetch: bool) -> int:
    """The native capability/emulation bit of an AMO (``VKO_AMO_*`` in ``csrc/vko.h``)."""
    return 1 << (int(op) + (_W8 if width == 8 else 0) + (_FETCH if fetch else 0))


@dataclass(frozen=True)
class Options:
    """One rail's settings."""

    provider: str
    provider_from: str  # where the choice came from (for messages)
    timeout: float
    poll_us: int
    idle_poll_us: int
    busy_us: int
    spin_us: int
    emulate: int  # VKO_AMO bits
    inject_amo: str  # auto | on | off
    fence: str  # auto | quiet
    native: bool  # offer the C data path to the core's compiled hot path
    contexts: str  # shared (contexts on the root endpoint) | own (an endpoint each)


def _emulate_mask(text: str, bad: type[Exception], var: str) -> int:
    """``all``, or names like ``add,fetch_and,swap``: AMOs to run as compare-and-swap loops."""
    mask = 0
    for word in filter(None, (w.strip().lower() for w in text.replace("+", ",").split(","))):
        if word == "all":
            return sum(amo_bit(op, w, f) for op in AmoOp if op != AmoOp.CSWAP
                       for w in (4, 8) for f in (False, True))
        fetch = word.startswith("fetch_") and word != "fetch"
        name = word[6:] if fetch else word
        try:
            op = AmoOp[name.upper()]
        except KeyError:
            raise ConfigError(var, f"{NAME}: emulate={text!r}: unknown AMO {word!r} (use all, "
                              "or names such as add, fetch_add, and, swap, fetch)") from None
        if op == AmoOp.CSWAP:
            raise ConfigError(var, f"{NAME}: emulate={text!r}: compare-and-swap is what "
                              "emulation uses; it cannot be emulated itself")
        fetch = fetch or op.fetching_only
        mask |= sum(amo_bit(op, w, fetch) for w in (4, 8))
    return mask


def _number(known: dict[str, str], key: str, default: float, low: float, high: float,
            var: str, unit: str) -> float:
    try:
        value = float(known.get(key, default))
        if not low <= value <= high:
            raise ValueError
    except ValueError:
        raise ConfigError(var, f"{NAME}: {key}={known[key]!r} is not a number of {unit} "
                          f"({low:g} to {high:g})") from None
    return value


def parse_options(context: TransportContext) -> Options:
    """The rail's options, checked; errors name ``VKSHMEM_RAIL<n>`` (or the provider
    variable) and the option."""
    var = f"VKSHMEM_RAIL{context.rail}"
    known: dict[str, str] = {}
    for key, value in context.options.items():
        if key not in OPTIONS:
            raise ConfigError(var, f"{NAME}: unknown option {key!r} (known: "
                              f"{', '.join(OPTIONS)})")
        known[key] = value
    if "provider" in known:
        provider, source = known["provider"], f"{var} (provider=)"
    elif os.environ.get(PROVIDER_VAR, "").strip():
        provider, source = os.environ[PROVIDER_VAR].strip(), PROVIDER_VAR
    else:
        provider, source = DEFAULT_PROVIDER, "the default"
    force = known.get("force", "0").lower()
    if force not in _TRUE + _FALSE:
        raise ConfigError(var, f"{NAME}: force={known['force']!r} (use 1 or 0)")
    if provider in BROKEN and force in _FALSE:
        src_var = var if source.startswith(var) else PROVIDER_VAR
        raise ConfigError(src_var, f"{NAME}: provider {provider!r} {BROKEN[provider]} on "
                          "libfabric 1.17; choose one of "
                          f"{', '.join(KNOWN)} (or add the rail option force=1 to try it)")
    inject = known.get("inject_amo", "auto").lower()
    if inject in _TRUE:
        inject = "on"
    elif inject in _FALSE:
        inject = "off"
    elif inject != "auto":
        raise ConfigError(var, f"{NAME}: inject_amo={known['inject_amo']!r} (use auto, on "
                          "or off)")
    fence = known.get("fence", "auto").lower()
    if fence not in ("auto", "quiet"):
        raise ConfigError(var, f"{NAME}: fence={known['fence']!r} (use auto: rely on the "
                          "provider's write-after-write ordering where granted, or quiet)")
    native = known.get("native", "1").lower()
    if native not in _TRUE + _FALSE:
        raise ConfigError(var, f"{NAME}: native={known['native']!r} (use 1: the core's "
                          "compiled hot path calls the C data path, or 0: the Python methods)")
    contexts = known.get("contexts", "shared").lower()
    if contexts not in ("shared", "own"):
        raise ConfigError(var, f"{NAME}: contexts={known['contexts']!r} (use shared: contexts "
                          "count their operations on the transport's endpoint, or own: each "
                          "opens its own endpoint)")
    return Options(
        provider=provider, provider_from=source,
        timeout=_number(known, "timeout", DEFAULT_TIMEOUT, 0.001, 1e6, var, "seconds"),
        poll_us=int(_number(known, "poll_us", 50, 1, 1e6, var, "microseconds")),
        idle_poll_us=int(_number(known, "idle_poll_us", 500, 1, 1e6, var, "microseconds")),
        busy_us=int(_number(known, "busy_us", DEFAULT_BUSY_US, 0, 1e7, var, "microseconds")),
        spin_us=int(_number(known, "spin_us", 50, 0, 1e7, var, "microseconds")),
        emulate=_emulate_mask(known.get("emulate", ""), ConfigError, var),
        inject_amo=inject, fence=fence, native=native in _TRUE, contexts=contexts,
    )
