"""Where a GPU-heap put_signal + signal_wait_until ping-pong spends its time (issue 39, item
2). Run by hand on an NVIDIA machine, once per domain:

    VKSHMEM_GPU_PROVIDER=cuda vkshmem run -n 2 tests/gpu/signal_pingpong_probe.py

PE 0 times each piece alone against PE 1 (a 128-byte put GPU->GPU, the signal's update, a
read of its own signal, a satisfied signal_wait_until), then the ping-pong itself, and prints
the top of a cProfile of PE 0's side of the ping-pong."""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
other = 1 - me
buf = shmem.zeros(128, np.uint8, domain="gpu")
src = shmem.zeros(128, np.uint8, domain="gpu")
host_src = np.ones(128, np.uint8)
sig = shmem.new_signal(domain="gpu")
ROUNDS = 300


def each(label: str, fn: Callable[[], object], iters: int = 300) -> None:
    shmem.barrier_all()
    if me == 0:
        fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        print(f"{label:<44} {(time.perf_counter() - t0) / iters * 1e6:9.2f} us")
    shmem.barrier_all()


each("put 128 B gpu->gpu (peer)", lambda: shmem.put(buf, src, other))
each("put 128 B cpu->gpu (peer)", lambda: shmem.put(buf, host_src, other))
each("signal_set on the peer's GPU word", lambda: shmem.signal_set(sig, 0, other))
each("signal_fetch (own GPU word)", lambda: shmem.signal_fetch(sig))
each("signal_wait_until, already true", lambda: shmem.signal_wait_until(sig, shmem.CMP_GE, 0))
each("quiet", shmem.quiet)
each("put_signal 128 B (peer), SET", lambda: shmem.put_signal(buf, src, other, sig, 0,
                                                              shmem.SIGNAL_SET))
shmem.signal_set(sig, 0, me)
shmem.barrier_all()


def ping(base: int) -> float:
    shmem.barrier_all()
    t0 = time.perf_counter()
    for r in range(base + 1, base + ROUNDS + 1):
        if me == 1:
            shmem.signal_wait_until(sig, shmem.CMP_GE, r)
        shmem.put_signal(buf, src, other, sig, r, shmem.SIGNAL_SET)
        if me == 0:
            shmem.signal_wait_until(sig, shmem.CMP_GE, r)
    dt = time.perf_counter() - t0
    shmem.barrier_all()
    return dt / ROUNDS / 2 * 1e6


if me < 2:
    print(f"[{me}] ping-pong half round trip: {min(ping(k * ROUNDS) for k in range(3)):.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    ping(3 * ROUNDS)
    prof.disable()
    if me == 0:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        print(out.getvalue())
shmem.barrier_all()
