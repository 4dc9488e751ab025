"""The GPU domain proxy next to the transport that carries it, in one job:

    VKSHMEM_SHM=0 vkshmem run -n 2 benchmarks/gpu_proxy.py [--json] [--reps 5] [--domain D]

(``--domain``: the GPU domain, default ``vulkan``, whose heaps only the proxy reaches across
GPUs; on a machine with one GPU per PE, or with ``VKSHMEM_DOMAIN_IMPORT=0`` on one GPU, the
shm path may stay on: the peers' GPU heaps are then reached through the proxy, which moves
pieces by DMA straight into the peer's mailbox; ``--staged`` turns that off, so pieces go
through host staging and the transport's copy). PE 0 measures against PE 1: GPU->GPU put and
get of 8 B (µs per call, complete on return), a fetch_add on the peer's GPU word, put and get
of 16 MiB (GB/s), and the same 16 MiB host->host over the carrying transport (put + quiet,
get): the ceiling the proxy is held to (issue 11: proxy >= 0.8x the transport's bandwidth).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from _timing import knobs, make_timer, report

from vkshmem import shmem

BIG = 16 << 20
me, n = shmem.my_pe(), shmem.n_pes()
if n != 2:
    raise SystemExit("gpu_proxy.py runs at exactly 2 PEs (vkshmem run -n 2)")
reps, scale = knobs()
DOMAIN = sys.argv[sys.argv.index("--domain") + 1] if "--domain" in sys.argv else "vulkan"
#: PE 0 alone times (no barriers between loops: PE 1 sleeps meanwhile)
timed = make_timer(0, reps, scale, lambda: None, lambda x: x)
g_dst = shmem.zeros(BIG, np.uint8, domain=DOMAIN)
g_src = shmem.zeros(BIG, np.uint8, domain=DOMAIN)
word = shmem.zeros(1, np.int64, domain=DOMAIN)
h_dst = shmem.zeros(BIG, np.uint8)
h_src = shmem.zeros(BIG, np.uint8)
done = shmem.zeros(1, np.int64)
heap = shmem._state.rt.domains.heaps[g_dst.domain.spec.name]
route = heap.route_names[1 - me]
carrier = shmem._state.rt.routing.route_transport[1 - me].spec.name
if route != "proxy":
    raise SystemExit(f"the {DOMAIN} route to the peer is {route!r}, not the proxy: run with "
                     "VKSHMEM_SHM=0 (or pick a domain the peers cannot map: --domain)")
if "--staged" in sys.argv and heap.proxy is not None:  # pieces through the transport's copy
    heap.proxy.direct = [None] * n
direct = heap.proxy is not None and any(heap.proxy.direct)
g_src.copy_from(np.arange(BIG, dtype=np.uint8))
shmem.barrier_all()


def host_put() -> None:
    shmem.put(h_dst, h_src, 1)
    shmem.quiet()


if me == 0:
    d8, s8 = g_dst[:8], g_src[:8]
    rows = {
        "put 8 B GPU->GPU": timed(lambda: shmem.put(d8, s8, 1), 200),
        "get 8 B GPU->GPU": timed(lambda: shmem.get(d8, s8, 1), 200),
        "fetch_add GPU word": timed(lambda: shmem.atomic_fetch_add(word, 1, 1), 200),
        "put 16 MiB GPU->GPU": timed(lambda: shmem.put(g_dst, g_src, 1), 5),
        "get 16 MiB GPU->GPU": timed(lambda: shmem.get(g_dst, g_src, 1), 5),
        f"put 16 MiB host ({carrier})": timed(host_put, 5),
        f"get 16 MiB host ({carrier})": timed(lambda: shmem.get(h_dst, h_src, 1), 5),
    }
    shmem.atomic_set(done, 1, 1)
    got = g_dst.to_numpy()
    if not np.array_equal(got, np.arange(BIG, dtype=np.uint8)):
        raise SystemExit("the proxied get returned wrong bytes")
    sizes = {k: BIG for k in rows if "16 MiB" in k}
    chunk = heap.proxy.chunk if heap.proxy is not None else 0
    report(rows, {"carrier": carrier, "chunk": chunk,
                  "shm": os.environ.get("VKSHMEM_SHM", "1"), "direct": direct},
           f"GPU proxy over {carrier}, {chunk >> 10} KiB pieces"
           f"{', by DMA into the peer mailbox' if direct else ''} ({' '.join(sys.argv[1:])})",
           sizes)
else:  # the target sleeps (a target spinning in a barrier would take a core from its proxy)
    while done[0] == 0:
        time.sleep(1e-3)
shmem.barrier_all()
