"""GPU-initiated put_signal next to the floor and the ceiling of the same GPU, in one job.

    vkshmem run -n 2 benchmarks/device_api.py [--json benchmarks/results/FILE.json] [--quick]

PE 0's kernel (``benchmarks/shaders/device_put_signal.comp``, compiled here with glslc)
puts ``bytes`` into PE 1's GPU heap with workgroup-scope ``vks_put_signal_block`` calls, each
workgroup adding 1 to PE 1's signal; PE 1's host polls the signal word. Rows, per size (8 B to
64 MiB, every power of 4, and 64 MiB):

- ``put_signal``: from PE 0's dispatch call to PE 1's host seeing the last signal (µs; both
  clocks are this host's CLOCK_MONOTONIC), and the bandwidth that makes;
- ``floor``: an empty kernel's dispatch to completion (``launch.wait()``) on PE 0;
- ``ceiling``: a kernel copying the same bytes inside PE 0's own heap, dispatch to completion.

Goals (issue 38): put_signal ≤ floor + 5 µs for small sizes, ≥ 0.8 x the ceiling's bandwidth
from 16 MiB. The route each PE's kernel takes to the other (direct or ring) is printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vkshmem import shmem
from vkshmem.gpu.shaders import compile_glsl

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "shaders" / "device_put_signal.comp"
SIZES = [8 << (2 * k) for k in range(12)] + [64 << 20]  # 8 B ... 32 MiB, 64 MiB
LANES = 256


def groups_for(nbytes: int) -> int:
    """Workgroups of a transfer: 64 KiB each past 64 KiB (at most 1024), else one."""
    return max(1, min(1024, nbytes // (64 << 10)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the rows to this file (PE 0)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test)")
    args = ap.parse_args()
    me, n = shmem.my_pe(), shmem.n_pes()
    if n != 2:
        sys.exit("run it with vkshmem run -n 2")
    biggest = max(SIZES)
    src = shmem.zeros(biggest // 4, np.uint32, domain="gpu")
    dst = shmem.zeros(biggest // 4, np.uint32, domain="gpu")
    sig = shmem.zeros(1, np.uint64, domain="gpu")
    stamps = shmem.zeros(4, np.float64)  # PE 0's dispatch times, put into PE 1
    mine = shmem.zeros(3, np.float64)  # this PE's medians
    both = shmem.zeros(6, np.float64)  # every PE's (fcollect)
    with tempfile.TemporaryDirectory() as tmp:
        kernels = [shmem.gpu_kernel(compile_glsl(SOURCE, Path(tmp) / f"k{m}.spv",
                                                 defines={"MODE": str(m)}), name=f"mode{m}")
                   for m in range(3)]
    init = src.domain.initiator
    route = "direct" if (1 - me) in init.direct_pes else "ring"
    try:
        view = sig.to_numpy(zero_copy=True)  # CPU-mapped: poll it directly
    except Exception:
        view = None
    signalled = 0

    def seen(target: int) -> None:
        if view is not None:
            deadline = time.monotonic() + 30
            while view[0] < target:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"signal {view[0]}, want {target}")
        else:
            shmem.signal_wait_until(sig, shmem.CMP.GE, target)

    def push(nbytes: int, groups: int, target: int) -> bytes:
        return shmem.pack_push(np.uint64(src.offset), np.uint64(dst.offset),
                               np.uint64(sig.offset), np.uint64(nbytes // groups),
                               np.uint32(target))

    rows = []
    for nbytes in SIZES:
        groups = groups_for(nbytes)
        rounds = 3 if args.quick else (30 if nbytes <= 1 << 20 else 8)
        lat, floor, ceil = [], [], []
        for r in range(rounds + 2):  # two warm-ups
            # put_signal: PE 0 dispatches, PE 1's host sees the signal
            shmem.barrier_all()
            if me == 0:
                t0 = time.perf_counter()
                kernels[1].dispatch(groups, push=push(nbytes, groups, 1)).wait()
                shmem.put(stamps[:1], np.array([t0]), 1)
            else:
                signalled += groups
                seen(signalled)
                t1 = time.perf_counter()
            shmem.barrier_all()
            if me == 1 and r >= 2:
                lat.append((t1 - float(stamps[0])) * 1e6)
            # floor and ceiling, PE 0 alone
            if me == 0:
                for k, out in ((0, floor), (2, ceil)):
                    t0 = time.perf_counter()
                    kernels[k].dispatch(groups, push=push(nbytes, groups, 0)).wait()
                    if r >= 2:
                        out.append((time.perf_counter() - t0) * 1e6)
        mine[:] = [statistics.median(x) if x else 0.0 for x in (lat, floor, ceil)]
        shmem.fcollect(both, mine)  # collective: [PE 0's 3, PE 1's 3]
        if me == 0:
            put_us, floor_us, ceil_us = both[3], both[1], both[2]
            rows.append({"op": "kernel put_signal", "bytes": nbytes, "groups": groups,
                         "put_signal_us": round(put_us, 2), "floor_us": round(floor_us, 2),
                         "ceiling_us": round(ceil_us, 2),
                         "put_signal_GBps": round(nbytes / put_us / 1e3, 3),
                         "ceiling_GBps": round(nbytes / ceil_us / 1e3, 3),
                         "route": route})
    init.check()
    view = None  # drop the mapping's view before the heap is released
    shmem.barrier_all()
    if me != 0:
        return
    print(f"{'bytes':>10} {'wgs':>5} {'put_signal us':>14} {'floor us':>9} {'+floor':>8} "
          f"{'ceiling us':>11} {'put GB/s':>9} {'ceil GB/s':>10} {'ratio':>6}")
    for row in rows:
        ratio = row["ceiling_us"] / row["put_signal_us"]  # bandwidth ratio
        print(f"{row['bytes']:>10} {row['groups']:>5} {row['put_signal_us']:>14.2f} "
              f"{row['floor_us']:>9.2f} {row['put_signal_us'] - row['floor_us']:>8.2f} "
              f"{row['ceiling_us']:>11.2f} {row['put_signal_GBps']:>9.3f} "
              f"{row['ceiling_GBps']:>10.3f} {ratio:>6.2f}")
    print(f"route PE 0 -> PE 1: {route}; device {src.domain.device.name}")
    if args.json:
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                     "--format=csv,noheader"], capture_output=True, text=True,
                                    timeout=30).stdout.strip()
        except OSError:
            driver = "unknown"
        args.json.write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "device": src.domain.device.name,
            "driver": driver, "domain": src.domain.spec.name,
            "command": "vkshmem run -n 2 benchmarks/device_api.py " + " ".join(sys.argv[1:]),
            "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
