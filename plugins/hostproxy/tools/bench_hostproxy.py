"""Single-process latency/bandwidth check of the hostproxy transport (PE 0 -> PE 1, loopback).

Usage: ``python plugins/hostproxy/tools/bench_hostproxy.py [--spin US] [--iters N]``. Both PEs live
in this process; PE 1's requests are served by its native server thread, so this measures the
client's Python path, two loopback TCP hops and the server, not a multi-process job.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import time
from collections.abc import Callable

from vkshmem_hostproxy import HostProxyTransport

from vkshmem.plugin import AmoOp, PeerInfo, SegmentInfo
from vkshmem.testing import context

SIZE = 64 << 20


def _segment() -> tuple[mmap.mmap, SegmentInfo, int]:
    fd = os.memfd_create("bench")
    os.ftruncate(fd, SIZE)
    m = mmap.mmap(fd, SIZE)
    probe = ctypes.c_char.from_buffer(m)
    address = ctypes.addressof(probe)
    del probe
    return m, SegmentInfo(0, "host", address, SIZE, fd, memoryview(m)), fd


def _time(fn: Callable[[], None], iters: int, repeats: int = 5) -> tuple[float, float]:
    """Best and median over ``repeats`` of the mean seconds per call."""
    fn()
    best = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best.append((time.perf_counter() - start) / iters)
    return min(best), statistics.median(best)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spin", type=int, default=0, help="server spin, microseconds")
    ap.add_argument("--iters", type=int, default=20000)
    args = ap.parse_args()
    opts = {"addr": "127.0.0.1", "spin": str(args.spin)}
    segs, trs, peers = [], [], {}
    for pe in range(2):
        ctx = context(pe, 2, 0, opts)  # what the core gives PE pe of a 2-PE job on one node
        tr = HostProxyTransport(ctx)
        m, info, fd = _segment()
        segs.append((m, info, fd))
        trs.append(tr)
        peers[pe] = PeerInfo(pe, "node0", True, tr.address(), {0: tr.register(info)})
    for tr in trs:
        tr.connect(peers)
    t = trs[0]
    eight = memoryview(bytearray(8))

    def put_quiet() -> None:
        t.put(1, 0, 0, eight)
        t.quiet()

    rows = [
        ("put 8 B + quiet", put_quiet),
        ("get 8 B", lambda: t.get(1, 0, 0, eight)),
        ("fetch_add 8 B", lambda: t.amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, True)),
        ("add (no fetch)", lambda: t.amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, False)),
    ]
    print(f"spin={args.spin} us, {args.iters} iterations, best / median of 5")
    for name, fn in rows:
        best, med = _time(fn, args.iters)
        print(f"  {name:<18} {best * 1e6:7.2f} us  {med * 1e6:7.2f} us")
    t.quiet()
    for size in (64 << 10, 1 << 20, 16 << 20):
        buf = memoryview(bytearray(size))
        count = max(4, (256 << 20) // size)

        def burst(buf: memoryview = buf, count: int = count) -> None:
            for _ in range(count):
                t.put(1, 0, 0, buf)
            t.quiet()

        best, _ = _time(burst, 1, 3)
        gbest, _ = _time(lambda buf=buf: t.get(1, 0, 0, buf), max(4, count // 4), 3)
        print(f"  put bw {size >> 10:>6} KiB  {count * size / best / 1e9:6.2f} GB/s   "
              f"get bw {size / gbest / 1e9:6.2f} GB/s")
    for tr in trs:
        tr.close()
    for m, info, fd in segs:
        info.buffer.release()
        m.close()
        os.close(fd)


if __name__ == "__main__":
    main()
