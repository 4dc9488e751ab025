"""What ``vkshmem bench`` measures: the benchmarks, their groups, sizes, iteration counts and
the plan that every side (vkshmem, mpi4py, shmem4py, ucx_perftest) follows.

A *plan* is a list of items (benchmark, message size, iterations, warm-up), the number of
timed samples per item and the window of the bandwidth tests. It travels to the PE programs
as a JSON file, so both sides of a comparison run exactly the same measurements. PE 0 of a
side reports each item as one line ``MARK {json}`` on its standard output.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "AMOS",
    "BENCHES",
    "DEFAULT_SIZES",
    "GROUPS",
    "MARK",
    "META",
    "Bench",
    "Item",
    "Plan",
    "format_size",
    "make_plan",
    "parse_benches",
    "parse_size",
    "parse_sizes",
    "stats",
]

#: The prefix of a result line on PE 0's standard output.
MARK = "@@vkshmem-bench "
#: The prefix of the line that describes the side (implementation, library, routes).
META = "@@vkshmem-bench-meta "

#: Message sizes used when ``--sizes`` is not given.
DEFAULT_SIZES = "8,64,512,4K,32K,256K,1M,4M"
#: Message-rate benchmarks only run at sizes up to this (above, the rate is bandwidth / size).
RATE_MAX_SIZE = 64 * 1024
#: Above this size the iteration and warm-up counts shrink in proportion (as OSU's do).
LARGE = 64 * 1024
MAX_SIZE = 1 << 30

UNITS = {"lat": "us", "bw": "GB/s", "rate": "Mmsg/s"}


@dataclass(frozen=True)
class Bench:
    """One benchmark: ``kind`` is ``lat`` (microseconds per operation), ``bw`` (GB/s,
    10^9 bytes per second) or ``rate`` (million messages per second)."""

    name: str
    group: str
    kind: str
    sized: bool
    doc: str

    @property
    def unit(self) -> str:
        return UNITS[self.kind]

    def size_of(self, size: int) -> int:
        """The message size this benchmark really moves when asked for ``size`` bytes."""
        if not self.sized:
            return 8 if self.group == "amo" else 0
        if self.name == "reduce":  # float64 elements
            return max(8, size - size % 8)
        return size


#: Every AMO, on a 64-bit integer word of the peer (non-fetching ones followed by quiet).
AMOS = ("fetch", "set", "swap", "compare_swap", "inc", "fetch_inc", "add", "fetch_add",
        "and", "fetch_and", "or", "fetch_or", "xor", "fetch_xor")

_LIST = [
    Bench("put_lat", "rma", "lat", True, "blocking put + quiet, PE 0 to PE 1"),
    Bench("get_lat", "rma", "lat", True, "blocking get, PE 0 from PE 1"),
    Bench("put_bw", "bw", "bw", True, "put_nbi, a window of them then quiet"),
    Bench("get_bw", "bw", "bw", True, "get_nbi, a window of them then quiet"),
    Bench("put_rate", "rate", "rate", True, f"put_nbi message rate (sizes <= "
          f"{RATE_MAX_SIZE >> 10} KiB), windowed"),
    Bench("get_rate", "rate", "rate", True, f"get_nbi message rate (sizes <= "
          f"{RATE_MAX_SIZE >> 10} KiB), windowed"),
    *(Bench(a, "amo", "lat", False, f"atomic_{a} on an int64 of PE 1"
            + ("" if a.startswith(("fetch", "swap", "compare")) else " + quiet"))
      for a in AMOS),
    Bench("put_signal", "signal", "lat", True,
          "put_signal ping-pong PE 0 <-> PE 1 (half the round trip)"),
    Bench("barrier", "coll", "lat", False, "barrier_all"),
    Bench("broadcast", "coll", "lat", True, "broadcast from PE 0 (size = bytes)"),
    Bench("reduce", "coll", "lat", True, "sum_reduce of float64 to all (size = bytes)"),
    Bench("fcollect", "coll", "lat", True, "fcollect (size = bytes per PE)"),
    Bench("alltoall", "coll", "lat", True, "alltoall (size = bytes per PE pair)"),
]
BENCHES: dict[str, Bench] = {b.name: b for b in _LIST}
GROUPS: dict[str, list[str]] = {}
for _b in _LIST:
    GROUPS.setdefault(_b.group, []).append(_b.name)
GROUPS["all"] = list(BENCHES)


def parse_size(text: str) -> int:
    """``8``, ``4K``, ``1M``, ``2MiB``, ``64B`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 8, 4K, 1M, 2MiB)")
    value = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]
    if not 1 <= value <= MAX_SIZE:
        raise ValueError(f"size {text!r} must be between 1 byte and 1G")
    return value


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes; ``A:B`` stands for the powers of two from A to B
    (``8:4M`` = 8, 16, ..., 4M). Sorted, without repeats."""
    out: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            raise ValueError(f"empty size in {text!r}")
        if ":" in part:
            lo_text, hi_text = part.split(":", 1)
            lo, hi = parse_size(lo_text), parse_size(hi_text)
            if lo > hi:
                raise ValueError(f"range {part!r} goes down ({lo} > {hi})")
            while lo <= hi:
                out.add(lo)
                lo *= 2
        else:
            out.add(parse_size(part))
    return sorted(out)


def parse_benches(text: str) -> list[str]:
    """Benchmark and group names (comma-separated) -> benchmark names, in table order."""
    chosen: set[str] = set()
    for word in (w.strip() for w in text.split(",")):
        if word in GROUPS:
            chosen.update(GROUPS[word])
        elif word in BENCHES:
            chosen.add(word)
        else:
            raise ValueError(
                f"unknown benchmark {word!r}; groups: {', '.join(GROUPS)}; benchmarks: "
                f"{', '.join(BENCHES)} (vkshmem bench --list describes them)")
    return [b for b in BENCHES if b in chosen]


def format_size(size: int) -> str:
    """4096 -> ``4 KiB``; 0 -> ``-``."""
    if size == 0:
        return "-"
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


@dataclass
class Item:
    """One measurement: ``iters`` timed operations per sample after ``warmup`` untimed."""

    bench: str
    size: int
    iters: int
    warmup: int


@dataclass
class Plan:
    """Everything a side needs to run the same measurements as the other sides."""

    items: list[Item]
    samples: int = 5
    window: int = 64
    domain: str = "host"
    bind: bool = True
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def max_size(self) -> int:
        return max([8, *(i.size for i in self.items)])

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw = json.loads(text)
        raw["items"] = [Item(**i) for i in raw["items"]]
        return cls(**raw)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_json(Path(path).read_text())


def _scaled(count: int, size: int) -> int:
    if size <= LARGE or count == 0:
        return count
    return max(min(count, 10), count * LARGE // size)


def make_plan(benches: list[str], sizes: list[int], iters: int, warmup: int, samples: int,
              window: int, domain: str = "host", bind: bool = True) -> Plan:
    """The plan for ``benches`` at ``sizes``: unsized benchmarks run once, message-rate
    benchmarks only up to :data:`RATE_MAX_SIZE`; above 64 KiB iterations and warm-up shrink
    in proportion to the size (at least 10 iterations)."""
    items: list[Item] = []
    for name in benches:
        b = BENCHES[name]
        if not b.sized:
            items.append(Item(name, b.size_of(0), iters, warmup))
            continue
        seen: set[int] = set()
        for size in sizes:
            if b.kind == "rate" and size > RATE_MAX_SIZE:
                continue
            real = b.size_of(size)
            if real not in seen:
                seen.add(real)
                items.append(Item(name, real, _scaled(iters, real), _scaled(warmup, real)))
    return Plan(items, samples, window, domain, bind)


def stats(kind: str, size: int, per_op: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of samples of seconds per operation, in the unit of ``kind``:
    microseconds (lat), GB/s (bw) or million messages per second (rate)."""
    if kind == "lat":
        values = [t * 1e6 for t in per_op]
    else:
        scale = size / 1e9 if kind == "bw" else 1e-6
        values = [scale / t if t > 0 else float("inf") for t in per_op]
    return statistics.median(values), min(values), max(values)
