"""The GPU domain proxy next to the transport that carries it, in one job, at every size:

    VKSHMEM_SHM=0 VKSHMEM_TRANSPORTS=hostproxy vkshmem run -n 2 benchmarks/gpu_proxy.py \
        [--json PATH] [--quick] [--rounds 5] [--domain D] [--staged] [--top BYTES]

``--domain``: the GPU domain (default ``vulkan``), whose heaps only the proxy reaches across
GPUs; on a machine with one GPU per PE, or with ``VKSHMEM_DOMAIN_IMPORT=0`` on one GPU, the shm
path may stay on (the carrying "transport" is then the shm path: a copy through the mapped
host heap) and the proxy moves pieces by DMA straight into the peer's mailbox; ``--staged``
turns that off, so pieces go through host staging and the transport's copy.

PE 0 measures against PE 1 (which sleeps meanwhile, so its proxy thread has a core): at 8 B ...
512 KiB (every power of 4) and 1 MiB ... 256 MiB (every power of 2), sizes past the heaps
skipped (``--top 64M`` lowers the largest; 256 MiB needs ``VKSHMEM_GPU_SYMMETRIC_SIZE=320M``),
a blocking put and get GPU->GPU through the proxy (complete on return) next to the carrying
transport's own put + quiet and get of the same bytes host->host, timed alternately in the
same rounds; and an 8-byte ``fetch_add`` on the peer's GPU word next to the transport's own
8-byte get round trip. Issue 39 item 4 holds the proxy to >= 0.8x the transport's bandwidth
from 1 MiB and small ops within 1.5x its small-op round trip. Rows below 1 MiB are
microseconds per call, from 1 MiB GB/s; each the median of ``--rounds`` rounds. ``--json``
writes ``{"op", "pair", "bytes", "vkshmem", "transport", "unit"}`` rows with the date, the
host, the settings and the command (the docs' performance page reads them).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem

MIB = 1 << 20
argv = sys.argv
quick = "--quick" in argv
#: 8 B ... 512 KiB (every power of 4), then 1 MiB ... 256 MiB, every power of 2 (the issue's
#: bandwidth rows start at 1 MiB); quick: up to 4 MiB
SIZES = [8 << (2 * k) for k in range(9)] + [MIB << k for k in range(3 if quick else 9)]
ROUNDS = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else (3 if quick else 5)
#: seconds a timed loop aims at (its calls: that over a warm call's time, 2 to MAX_ITERS)
BUDGET = 0.02 if quick else 0.06
MAX_ITERS = 400
DOMAIN = argv[argv.index("--domain") + 1] if "--domain" in argv else "vulkan"

me, n = shmem.my_pe(), shmem.n_pes()
if n != 2:
    raise SystemExit("gpu_proxy.py runs at exactly 2 PEs (vkshmem run -n 2)")
rt = shmem._state.rt  # a benchmark reads its routes and heaps
word = shmem.zeros(1, np.int64, domain=DOMAIN)
heap = rt.domains.heaps[word.domain.spec.name]
route = heap.route_names[1 - me]
carrier = rt.routing.route_transport[1 - me].spec.name
if route != "proxy":
    raise SystemExit(f"the {DOMAIN} route to the peer is {route!r}, not the proxy: run with "
                     "VKSHMEM_SHM=0 (or VKSHMEM_DOMAIN_IMPORT=0, or a domain the peers cannot "
                     "map: --domain)")
proxy = heap.proxy
if "--staged" in argv and proxy is not None:  # pieces through the transport's copy
    proxy.direct = [None] * n
direct = proxy is not None and any(proxy.direct)
#: the proxy sends device pieces straight from the GPU heap's CPU mapping (no staging copy)
mapped = getattr(getattr(proxy, "dops", None), "view", None) is not None
free_host = rt.host.allocator.largest_free()
top = SIZES[-1]
if "--top" in argv:  # bytes, or with a K/M/G suffix
    text = argv[argv.index("--top") + 1].upper().rstrip("B")
    top = int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
top = max([s for s in SIZES if s <= top and s + MIB <= heap.heap.largest_free()
           and s + MIB <= free_host] or [8])
SIZES = [s for s in SIZES if s <= top]
g = shmem.zeros(top, np.uint8, domain=DOMAIN)  # source here, destination there
h = shmem.zeros(top, np.uint8)
done = shmem.zeros(1, np.int64)
shmem.barrier_all()


def iters_for(fn: Callable[[], object]) -> int:
    """Calls per timed loop: about BUDGET seconds' worth, from one warm call."""
    fn()
    t0 = time.perf_counter()
    fn()
    return int(min(MAX_ITERS, max(2, BUDGET / max(time.perf_counter() - t0, 1e-7))))


def pair_timed(a: Callable[[], object], b: Callable[[], object]) -> tuple[float, float]:
    """Seconds per call of ``a`` and ``b``: the medians of ROUNDS rounds, each round timing
    a loop of ``a`` then a loop of ``b`` (so drift affects both alike)."""
    ia, ib = iters_for(a), iters_for(b)
    ta, tb = [], []
    for _ in range(ROUNDS):
        for fn, k, out in ((a, ia, ta), (b, ib, tb)):
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            out.append((time.perf_counter() - t0) / k)
    return sorted(ta)[ROUNDS // 2], sorted(tb)[ROUNDS // 2]


rows: list[dict[str, object]] = []


def row(op: str, pair: str, nbytes: int, mine: float, theirs: float) -> None:
    """One row: µs per call below 1 MiB, GB/s from 1 MiB."""
    big = nbytes >= MIB

    def value(t: float) -> float:
        return round(nbytes / t / 1e9 if big else t * 1e6, 3)

    rows.append({"op": op, "pair": pair, "bytes": nbytes, "vkshmem": value(mine),
                 "transport": value(theirs), "unit": "GB/s" if big else "us"})


def sweep() -> None:
    for s in SIZES:
        gs, hs = g[:s], h[:s]

        def host_put(hs: object = hs) -> None:
            shmem.put(hs, hs, 1)
            shmem.quiet()

        row("put", "GPU->GPU", s, *pair_timed(lambda gs=gs: shmem.put(gs, gs, 1), host_put))
        row("get", "GPU->GPU", s, *pair_timed(lambda gs=gs: shmem.get(gs, gs, 1),
                                              lambda hs=hs: shmem.get(hs, hs, 1)))
    h8 = h[:8]
    row("fetch_add", "GPU word", 8, *pair_timed(lambda: shmem.atomic_fetch_add(word, 1, 1),
                                                lambda: shmem.get(h8, h8, 1)))


def check() -> None:
    """The proxied put and get move the right bytes (the largest size, both ways)."""
    pattern = (np.arange(top, dtype=np.uint64) * 2654435761 >> 7).astype(np.uint8)
    g.copy_from(pattern)
    shmem.put(g, g, 1)
    g.copy_from(np.zeros(top, np.uint8))
    shmem.get(g, g, 1)
    if not np.array_equal(g.to_numpy(), pattern):
        raise SystemExit("the proxied put/get moved wrong bytes")


#: what the launcher sets for each PE (not the run's settings)
LAUNCHER_VARS = ("VKSHMEM_JOB_", "VKSHMEM_LAUNCHER", "VKSHMEM_NPES", "VKSHMEM_PE")


def settings() -> list[str]:
    return [f"{k}={v}" for k, v in sorted(os.environ.items())
            if k.startswith("VKSHMEM_") and not k.startswith(LAUNCHER_VARS)]


def host() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       "?")
    except OSError:
        pass
    return (f"{platform.node() or 'host'} ({os.cpu_count()} CPUs, {cpu}, "
            f"{platform.system()} {platform.machine()}), load average "
            f"{os.getloadavg()[0]:.2f} at the start")


if me == 0:
    start_host = host()
    check()
    sweep()
    check()
    shmem.atomic_set(done, 1, 1)
    chunk = proxy.chunk if proxy is not None else 0
    from vkshmem.core.proxy import mailbox  # the piece sizes of this version
    piece = min(chunk, getattr(mailbox, "CPU_PIECE", chunk)) if mapped or direct else chunk
    dev = getattr(heap.domain, "device", None)
    what = (f"GPU proxy ({DOMAIN} domain{', device ' + dev.name if dev is not None else ''}) "
            f"over {carrier}, pieces of at most {piece >> 10} KiB ({chunk >> 10} KiB chunk)"
            f"{', copied straight into the peer mailbox' if direct else ''}"
            f"{', sent from the CPU mapping' if mapped and not direct else ''}"
            f"{', staged' if not (direct or mapped) else ''}")
    print(f"\n{what}; median of {ROUNDS} rounds")
    print(f"{'op':<10} {'pair':<9} {'bytes':>10} {'proxy':>10} {carrier:>10} {'unit':>5} "
          f"{'ratio':>6}")
    for r in rows:
        v, t = float(r["vkshmem"]), float(r["transport"])  # type: ignore[arg-type]
        ratio = (v / t if r["unit"] == "GB/s" else t / v) if v and t else 0.0
        print(f"{r['op']:<10} {r['pair']:<9} {r['bytes']:>10} {v:>10} {t:>10} "
              f"{r['unit']:>5} {ratio:>6.2f}")
    if "--json" in argv:
        path = argv[argv.index("--json") + 1]
        stats = proxy.stats if proxy is not None else {}
        with open(path, "w") as f:
            json.dump({"date": datetime.datetime.now(datetime.timezone.utc)
                       .strftime("%Y-%m-%d %H:%M UTC"),
                       "machine": start_host, "header": what,
                       "setting": f"2 PEs, median of {ROUNDS} rounds; proxy counters "
                                  f"{dict(stats)}",
                       "ratio": "vkshmem/transport for GB/s rows, transport/vkshmem for us "
                                "rows (above 1: the proxy is faster); the fetch_add row's "
                                "transport column is the transport's own 8-byte get",
                       "command": " ".join([*settings(), "vkshmem run -n 2",
                                            "benchmarks/gpu_proxy.py", *argv[1:]]),
                       "rows": rows}, f, indent=1)
else:  # the target sleeps (a target spinning in a barrier would take a core from its proxy)
    while done[0] == 0:
        time.sleep(1e-3)
shmem.barrier_all()
