"""The registry of every ``VKSHMEM_*`` variable: name, type, default and documentation.

Variables are read once, when :func:`load` builds a :class:`Config`; nothing on a hot path reads
the environment. A bad value raises :class:`~vkshmem.core.errors.ConfigError` naming the variable.
``vkshmem info`` prints the registry with the current values; the README lists it too.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = ["RAIL_PATTERN", "Config", "RailSpec", "Var", "load", "parse_bool", "parse_choice",
           "parse_size", "registry"]

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


def parse_size(text: str) -> int:
    """Parse a byte count such as ``4096``, ``512M``, ``4G`` or ``1.5GiB``."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (use a number with an optional K, M, G or T)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


def parse_bool(text: str) -> bool:
    """``1/0``, ``true/false``, ``yes/no``, ``on/off`` (``y``/``n``; empty: false)."""
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r} (use 1/0, true/false, yes/no, on/off)")


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _parse_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:  # inf, nan: 0 is "no limit"
        raise ValueError("must be a finite number of seconds >= 0 (0 means no limit)")
    return value


def parse_choice(*choices: str) -> Callable[[str], str]:
    """A parser of one of ``choices`` (case-insensitive; the value comes back lower-case)."""
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return low

    return parse


@dataclass(frozen=True)
class Var:
    """One registered variable."""

    name: str
    parse: Callable[[str], Any]
    default: str
    doc: str
    kind: str


registry: dict[str, Var] = {}


def _var(name: str, kind: str, default: str, doc: str, parse: Callable[[str], Any]) -> None:
    registry[name] = Var(name, parse, default, doc, kind)


_var("VKSHMEM_SYMMETRIC_SIZE", "size", "512M",
     "Size of each PE's symmetric host heap (units K, M, G, T).", parse_size)
_var("VKSHMEM_HOST_PIN", "bool", "0",
     "Lock the host heap in RAM (mlock) so NICs can register it without page faults.",
     parse_bool)
_var("VKSHMEM_BOOTSTRAP", "str", "auto",
     "How PEs find each other: auto, local (vkshmem run), env (RANK/WORLD_SIZE/MASTER_ADDR/"
     "MASTER_PORT or SLURM_PROCID/SLURM_NTASKS), mpi (mpi4py), single, or a plugin's name.",
     lambda s: s.strip().lower() or "auto")
_var("VKSHMEM_BOOTSTRAP_TIMEOUT", "seconds", "60",
     "Seconds to wait for the other PEs during start-up and bootstrap exchanges.",
     _parse_seconds)
_var("VKSHMEM_BOOTSTRAP_PORT", "str", "",
     "Port of the 'env' bootstrap's rendezvous (default MASTER_PORT, or MASTER_PORT+1 under "
     "torchrun, whose agent owns MASTER_PORT; derived from SLURM_JOB_ID under Slurm).",
     lambda s: s.strip())
_var("VKSHMEM_TRANSPORTS", "list", "",
     "Ordered, comma-separated list of transports allowed (default: every installed one, by "
     "priority). Naming one that cannot load or reach a peer is an error.", _parse_list)
_var("VKSHMEM_SHM", "bool", "1",
     "Same-node peers load/store each other's heaps directly. 0 forces all traffic, even to "
     "this PE itself, through the chosen transport.", parse_bool)
_var("VKSHMEM_DOMAIN_IMPORT", "bool", "1",
     "Same-node peers of one device import each other's GPU (memory domain) heaps and copy "
     "directly. 0 reaches them as peers on other devices are reached (a transport that carries "
     "the memory, else the GPU proxy) while host memory keeps the shm path: to compare the "
     "routes, or test the proxy on one device.", parse_bool)
_var("VKSHMEM_STRIPE_THRESHOLD", "size", "256K",
     "With several rails, puts/gets of at least this many bytes are split across every rail "
     "that reaches the target; smaller ones use one rail per target.", parse_size)
_var("VKSHMEM_PLUGINS_ALLOW", "list", "",
     "If set, only plugins (entry point or distribution names) in this list are loaded.",
     _parse_list)
_var("VKSHMEM_PLUGINS_DENY", "list", "",
     "Plugins (entry point or distribution names) never to load.", _parse_list)
_var("VKSHMEM_PLUGINS_STRICT", "bool", "0",
     "A plugin that fails to load is an error instead of a warning.", parse_bool)
_var("VKSHMEM_WAIT_TIMEOUT", "seconds", "0",
     "Seconds after which wait_until, barriers and other waits raise WaitTimeoutError "
     "(0: wait for ever; Ctrl-C always interrupts).", _parse_seconds)
_var("VKSHMEM_COLLECTIVE_TIMEOUT", "seconds", "600",
     "Seconds after which a wait inside a barrier, collective or allocation (barrier_all, "
     "sync, broadcast, reduce, alloc, ...) raises WaitTimeoutError naming the call and the "
     "PE it waited for: a PE that skipped the call, or made another one, ends the job with an "
     "error instead of a hang (0: wait for ever; VKSHMEM_WAIT_TIMEOUT, if shorter, applies).",
     _parse_seconds)
_var("VKSHMEM_FAILURE_TIMEOUT", "seconds", "10",
     "Failure detection: a PE that dies is noticed at once (its liveness connection closes); "
     "one whose host goes silent is declared failed after this many seconds. Blocking calls "
     "then raise PeerFailedError (0: failure detection off).", _parse_seconds)
_var("VKSHMEM_CHECK_COLLECTIVES", "bool", "0",
     "Debugging: every TEAM_WORLD collective first compares its arguments (which collective, "
     "root, count, dtype, op) across PEs and raises InvalidArgumentError on a mismatch; costs "
     "one bootstrap all-gather per collective and turns the compiled fast paths off.",
     parse_bool)


def _parse_teams(text: str) -> int:
    value = int(text)
    if not 2 <= value <= 64:
        raise ValueError("must be between 2 and 64")
    return value


def _parse_scratch(text: str) -> int:
    value = parse_size(text)
    if value < 64 << 10:
        raise ValueError("must be at least 64K")
    return -(-value // 4096) * 4096


_var("VKSHMEM_TEAMS_MAX", "int", "32",
     "Teams that can exist at once on a PE (TEAM_WORLD and TEAM_SHARED included; 2..64).",
     _parse_teams)
_var("VKSHMEM_TEAM_SCRATCH", "size", "1M",
     "Symmetric scratch per team for collectives (reserved sparse: untouched pages cost "
     "nothing); larger collectives run in chunks of it.", _parse_scratch)
_var("VKSHMEM_LOG_LEVEL", "str", "warning",
     "Logging level of the 'vkshmem' logger: debug, info, warning, error.",
     parse_choice("debug", "info", "warning", "error"))
_var("VKSHMEM_AUTO_INIT", "bool", "1",
     "Importing vkshmem.shmem initialises the runtime (as shmem4py does); 0 waits for init().",
     parse_bool)


def _parse_chunk(text: str) -> int:
    if text.strip().lower() == "auto":
        return 0  # sized by the domain proxy from the heap and the number of PEs
    value = parse_size(text)
    if value < 4096:
        raise ValueError("must be at least 4K")
    return -(-value // 64) * 64


def _parse_positive(why: str) -> Callable[[str], float]:
    """A parser of numbers > 0 whose error says ``why``."""
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"must be a finite number > 0 ({why})")
        return value

    return parse


_parse_positive_seconds = _parse_positive("GPU waits always have a limit")


# The GPU variables the core reads itself (the domain proxy, the choice of domain, the API's
# all-reduce); the vulkan domain declares its own (vkshmem/gpu/env.py, DomainSpec.variables),
# and vkshmem-cuda those of its accelerations of it: vkshmem info lists them all.
_var("VKSHMEM_GPU_TIMEOUT", "seconds", "30",
     "Seconds any wait for GPU work (or for a peer's GPU proxy) may take before it raises "
     "GpuTimeoutError (> 0).", _parse_positive_seconds)
_var("VKSHMEM_GPU_PROVIDER", "str", "auto",
     "Which installed GPU memory domain domain='gpu' and 'auto' mean (e.g. vulkan, cuda; "
     "vkshmem info lists them). auto: the highest-priority one that can open on every PE.",
     str)
_var("VKSHMEM_GPU_NATIVE", "bool", "1",
     "Submit GPU copies and AMOs and wait for them through vkshmem's native helper (one C call "
     "with the GIL released), and serve the GPU proxy's same-node requests in C; 0 uses the "
     "Python paths (for comparison and debugging).",
     parse_bool)
_var("VKSHMEM_GPU_PROXY_CHUNK", "size", "auto",
     "GPU memory of peers that cannot import each other's memory (another device or node, or "
     "VKSHMEM_SHM=0) is reached through their GPU proxy thread, in pieces of this size, three "
     "in flight per pair of PEs; each PE reserves 6 x this x PEs of its host heap for it. "
     "auto: 4M, less where that would take more than an eighth of VKSHMEM_SYMMETRIC_SIZE "
     "(never below 256K unless that would take more than a quarter; never below 16K).",
     _parse_chunk)
_var("VKSHMEM_GPU_RING_REDUCE", "size", "128K",
     "All-reduces of a GPU (memory domain) array of at least this many bytes, between PEs that "
     "do not all map each other's heaps (the GPU proxy, a transport), run as a ring "
     "reduce-scatter + all-gather into the targets instead of chunks through the team's GPU "
     "scratch; 0 turns that off.", parse_size)


for _name, _doc in (("VKSHMEM_LAUNCHER", "Set by vkshmem run: host:port of its rendezvous."),
                   ("VKSHMEM_PE", "Set by vkshmem run: this PE's number."),
                   ("VKSHMEM_NPES", "Set by vkshmem run: the number of PEs."),
                   ("VKSHMEM_JOB_ID", "Set by vkshmem run: an id unique to the job.")):
    registry[_name] = Var(_name, str, "", _doc, "launcher")

RAIL_PATTERN = re.compile(r"^VKSHMEM_RAIL(\d+)$")
# The job's secret and where the env store listens: read by the bootstrap itself (see
# vkshmem/core/auth.py, bootstrap/exposure.py); registered so that vkshmem info lists them,
# with a secret's value never shown.
for _name, _doc in (
        ("VKSHMEM_JOB_SECRET_FD", "An inherited fd holding the job's secret (set by vkshmem "
         "run); wins over the two below."),
        ("VKSHMEM_JOB_SECRET_FILE", "A file (owned by you, mode 0600) holding the job's secret, "
         "for the env bootstrap."),
        ("VKSHMEM_JOB_SECRET", "The job's secret itself (16+ characters, the same on every PE), "
         "for the env bootstrap; required when its store listens beyond loopback."),
        ("VKSHMEM_BOOTSTRAP_BIND", "Where rank 0's env store listens (default: the address "
         "MASTER_ADDR resolves to; 0.0.0.0: every interface).")):
    registry[_name] = Var(_name, str, "", _doc, "secret" if "SECRET" in _name else "bootstrap")

registry["VKSHMEM_RAIL<n>"] = Var(
    "VKSHMEM_RAIL<n>", str, "",
    "Rail n (0, 1, ...): 'transport[:key=value:...]', e.g. VKSHMEM_RAIL0=hostproxy:addr=10.0.0.1."
    " Rails must be numbered from 0 without gaps.", "rail",
)


@dataclass(frozen=True)
class RailSpec:
    """A rail as configured: the transport that carries it and its options."""

    index: int
    transport: str
    options: Mapping[str, str]

    @classmethod
    def parse(cls, index: int, text: str) -> RailSpec:
        variable = f"VKSHMEM_RAIL{index}"
        name, *parts = text.strip().split(":")
        if not name:
            raise ConfigError(variable, f"{text!r} names no transport (use 'transport[:k=v...]')")
        options: dict[str, str] = {}
        for part in parts:
            key, eq, value = part.partition("=")
            if not eq or not key:
                raise ConfigError(variable, f"option {part!r} is not key=value")
            options[key.strip()] = value.strip()
        return cls(index, name.strip(), options)


class Config:
    """The values of every registered variable, read once from an environment mapping."""

    symmetric_size: int
    host_pin: bool
    bootstrap: str
    bootstrap_timeout: float
    bootstrap_port: str
    transports: tuple[str, ...]
    shm: bool
    domain_import: bool
    stripe_threshold: int
    plugins_allow: tuple[str, ...]
    plugins_deny: tuple[str, ...]
    plugins_strict: bool
    wait_timeout: float
    collective_timeout: float
    failure_timeout: float
    check_collectives: bool
    teams_max: int
    team_scratch: int
    log_level: str
    auto_init: bool
    gpu_timeout: float
    gpu_native: bool
    gpu_provider: str
    gpu_proxy_chunk: int
    gpu_ring_reduce: int
    rails: tuple[RailSpec, ...]

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.raw: dict[str, str] = {}
        for var in registry.values():
            if var.kind in ("rail", "launcher", "secret", "bootstrap"):
                text = environ.get(var.name, "")
                if var.kind == "secret" and text and var.name == "VKSHMEM_JOB_SECRET":
                    text = "(set, not shown)"
                if var.kind != "rail":
                    self.raw[var.name] = text
                continue
            text = environ.get(var.name)
            source = var.default if text is None else text
            try:
                value = var.parse(source)
            except ValueError as exc:
                raise ConfigError(var.name, f"bad value {source!r}: {exc}") from None
            self.raw[var.name] = source
            setattr(self, var.name[len("VKSHMEM_"):].lower(), value)
        self.rails = self._rails(environ)

    def _rails(self, environ: Mapping[str, str]) -> tuple[RailSpec, ...]:
        found: dict[int, str] = {}
        for key, value in environ.items():
            m = RAIL_PATTERN.match(key)
            if m:
                found[int(m.group(1))] = value
                self.raw[key] = value
        if sorted(found) != list(range(len(found))):
            raise ConfigError(
                "VKSHMEM_RAIL<n>",
                f"rails must be numbered 0..n-1 without gaps, got {sorted(found)}",
            )
        return tuple(RailSpec.parse(i, found[i]) for i in range(len(found)))

    def items(self) -> list[tuple[Var, str]]:
        """Every registered variable with its current value, for ``vkshmem info``."""
        out = []
        for var in registry.values():
            if var.kind == "rail":
                rails = [f"{k}={v}" for k, v in self.raw.items() if RAIL_PATTERN.match(k)]
                out.append((var, " ".join(sorted(rails))))
            else:
                out.append((var, self.raw[var.name]))
        return out


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Read every registered variable from ``environ`` (default: ``os.environ``)."""
    return Config(os.environ if environ is None else environ)
