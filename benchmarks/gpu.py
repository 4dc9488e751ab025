"""GPU-domain latency and bandwidth: run with ``vkshmem run -n 2 benchmarks/gpu.py``.

PE 0 measures, against PE 1, for each pair of memories (CPU -> GPU, GPU -> CPU, GPU -> GPU,
CPU -> CPU for reference): 8-byte put (complete on return for GPU targets; + quiet for host
ones), 8-byte get, 1 MiB put bandwidth; and fetch_add on a GPU word. Same-device peers go
through imported memory; ``VKSHMEM_SHM=0`` measures the GPU proxy over a transport instead.
Prints one table (PE 0). ``--quick`` runs fewer iterations.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
peer = (me + 1) % n
quick = "--quick" in sys.argv
SMALL, BIG = (200, 20) if quick else (2000, 100)
MIB = 1 << 17  # float64 elements

mem = {
    "cpu": (shmem.zeros(1, np.int64), shmem.zeros(MIB, np.float64)),
    "gpu": (shmem.zeros(1, np.int64, domain="gpu"), shmem.zeros(MIB, np.float64, domain="gpu")),
}
local = {
    "cpu": (np.ones(1, np.int64), np.random.default_rng(0).standard_normal(MIB)),
    "gpu": (shmem.ones(1, np.int64, domain="gpu"), shmem.zeros(MIB, np.float64, domain="gpu")),
}
word = shmem.zeros(1, np.int64, domain="gpu")


def timed(fn: Callable[[], object], iters: int) -> float:
    """Seconds per call on PE 0 (the other PEs only take part in the barriers)."""
    for _ in range(min(10, iters)):
        if me == 0:
            fn()
    shmem.barrier_all()
    t0 = time.perf_counter()
    if me == 0:
        for _ in range(iters):
            fn()
    dt = time.perf_counter() - t0
    shmem.barrier_all()
    return dt / iters


def put_quiet(dst: object, src: object) -> Callable[[], None]:
    def run() -> None:
        shmem.put(dst, src, peer)
        shmem.quiet()

    return run


rows = []
for src_kind, dst_kind in (("cpu", "gpu"), ("gpu", "cpu"), ("gpu", "gpu"), ("cpu", "cpu")):
    d8, dbig = mem[dst_kind]
    s8, sbig = local[src_kind]
    lat = timed(put_quiet(d8, s8), SMALL)
    # get: data flows from the peer's dst_kind memory into local src_kind memory
    g8 = local[src_kind][0]
    get = timed(lambda g8=g8, d8=d8: shmem.get(g8, d8, peer), SMALL)
    bw = timed(put_quiet(dbig, sbig), BIG)
    rows.append((f"{src_kind} -> {dst_kind}", lat * 1e6, get * 1e6, 8 * MIB / bw / 1e9))
amo = timed(lambda: shmem.atomic_fetch_add(word, 1, peer), SMALL)

if me == 0:
    dom = word.domain
    path = shmem._state.rt.heaps[dom.spec.name].route_names[peer]
    print(f"\nvkshmem GPU domain at {n} PEs: {dom.device.name}, route to the peer {path!r}, "
          f"mapped shortcuts {'on' if dom.mapped and dom.memory.host_visible else 'off'}")
    print(f"{'pair':<12} {'put 8 B (us)':>13} {'get 8 B (us)':>13} {'put 1 MiB (GB/s)':>17}")
    for name, lat, get, bw in rows:
        print(f"{name:<12} {lat:>13.1f} {get:>13.1f} {bw:>17.2f}")
    print(f"fetch_add on a GPU word: {amo * 1e6:.1f} us")
shmem.barrier_all()
