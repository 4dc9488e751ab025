"""Rail options of the verbs transport: ``VKSHMEM_RAIL<n>=verbs:k=v:...``, else
``VKSHMEM_VERBS_<K>``, else the default. Errors name the variable and the option."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from vkshmem.plugin import ConfigError

from . import NAME, OPTIONS

__all__ = ["ATOMICS", "MTUS", "Options", "env_var", "parse_options"]

#: Path MTUs an RC QP can use, in bytes (``auto``: the port's active MTU).
MTUS = (256, 512, 1024, 2048, 4096)
#: ``nic``: every AMO must go through the NIC (refused while VKSHMEM_SHM=1 would apply this
#: node's AMOs with CPU atomics); ``mixed``: accept that (no word is updated from both sides).
ATOMICS = ("nic", "mixed")

# option: (default, low, high) for the integer ones
_INTS = {
    "port": (1, 1, 255),
    "gid_index": (-1, -1, 255),  # -1: none on InfiniBand, 0 on RoCE
    "traffic_class": (0, 0, 255),
    "sl": (0, 0, 15),
    "hop_limit": (64, 1, 255),
    "ack_timeout": (14, 0, 31),  # 4.096 us * 2^14 = 67 ms per try
    "retry_cnt": (7, 0, 7),
    "rnr_retry": (7, 0, 7),
    "depth": (256, 16, 65536),
    "max_inline": (64, 0, 1024),
    "staging_kib": (64, 4, 65536),
    "staging_slots": (32, 2, 4096),
}


def env_var(option: str) -> str:
    """The environment variable that sets ``option`` where the rail does not."""
    return f"VKSHMEM_VERBS_{option.upper()}"


@dataclass(frozen=True)
class Options:
    """One rail's settings (``sources``: option -> where its value came from)."""

    device: str | None  # None: the first device libibverbs lists
    port: int
    gid_index: int
    mtu: int  # bytes; 0: the port's active MTU
    traffic_class: int
    sl: int
    hop_limit: int
    timeout: float
    ack_timeout: int
    retry_cnt: int
    rnr_retry: int
    depth: int
    max_inline: int
    staging_kib: int
    staging_slots: int
    atomics: str
    sources: Mapping[str, str]

    def source(self, option: str) -> str:
        """Where ``option`` came from, for messages (``VKSHMEM_RAIL0 (device=)`` ...)."""
        return self.sources.get(option, "the default")


def parse_options(rail: int, options: Mapping[str, str],
                  environ: Mapping[str, str] | None = None) -> Options:
    """The rail's options, checked (rail option, else ``VKSHMEM_VERBS_<OPTION>``)."""
    env = os.environ if environ is None else environ
    var = f"VKSHMEM_RAIL{rail}"
    for key in options:
        if key not in OPTIONS:
            raise ConfigError(var, f"{NAME}: unknown option {key!r} (known: "
                              f"{', '.join(OPTIONS)})")
    text: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key in OPTIONS:
        if key in options:
            text[key], sources[key] = options[key], f"{var} ({key}=)"
        elif env.get(env_var(key), "").strip():
            text[key], sources[key] = env[env_var(key)].strip(), env_var(key)

    def where(key: str) -> str:
        return var if sources[key].startswith(var) else sources[key]

    ints = {}
    for key, (default, low, high) in _INTS.items():
        if key not in text:
            ints[key] = default
            continue
        try:
            ints[key] = int(text[key], 0)
            if not low <= ints[key] <= high:
                raise ValueError
        except ValueError:
            raise ConfigError(where(key), f"{NAME}: {key}={text[key]!r} is not an integer "
                              f"from {low} to {high}") from None
    mtu = 0
    if text.get("mtu", "auto").lower() != "auto":
        try:
            mtu = int(text["mtu"])
            if mtu not in MTUS:
                raise ValueError
        except ValueError:
            raise ConfigError(where("mtu"), f"{NAME}: mtu={text['mtu']!r} (use auto or one of "
                              f"{', '.join(map(str, MTUS))})") from None
    try:
        timeout = float(text.get("timeout", "60"))
        if not 0.001 <= timeout <= 1e6:
            raise ValueError
    except ValueError:
        raise ConfigError(where("timeout"), f"{NAME}: timeout={text['timeout']!r} is not a "
                          "number of seconds (0.001 to 1e6)") from None
    atomics = text.get("atomics", "nic").lower()
    if atomics not in ATOMICS:
        raise ConfigError(where("atomics"), f"{NAME}: atomics={text['atomics']!r} (use "
                          f"{' or '.join(ATOMICS)})")
    device = text.get("device") or None
    return Options(device=device, mtu=mtu, timeout=timeout, atomics=atomics, sources=sources,
                   **ints)
