"""What ``device_api.py`` (Vulkan kernels) and ``device_api_cuda.py`` (CUDA kernels) share:
the sizes, the rounds of one size (a kernel's put_signal timed from PE 0's launch to PE 1's
host seeing the signal, and PE 0's floor and ceiling kernels), the table and the JSON file."""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vkshmem import shmem

__all__ = ["SIZES", "groups_for", "measure", "report", "start"]

SIZES = [8 << (2 * k) for k in range(12)] + [64 << 20]  # 8 B ... 32 MiB, 64 MiB


def groups_for(nbytes: int) -> int:
    """Workgroups (blocks) of a transfer: 64 KiB each past 64 KiB (at most 1024), else one."""
    return max(1, min(1024, nbytes // (64 << 10)))


def start(doc: str) -> tuple[argparse.Namespace, Any, Any]:
    """Collective: the command line (``--json``, ``--quick``; ``doc``: the script's docstring)
    and the source and target GPU arrays of the largest size; exits unless 2 PEs run."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the rows to this file (PE 0)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test)")
    args = ap.parse_args()
    if shmem.n_pes() != 2:
        sys.exit("run it with vkshmem run -n 2")
    biggest = max(SIZES)
    src = shmem.zeros(biggest // 4, np.uint32, domain="gpu")
    dst = shmem.zeros(biggest // 4, np.uint32, domain="gpu")
    return args, src, dst


def measure(quick: bool, run: Callable[[int, int, int], None],
            seen: Callable[[int], None], route: str) -> list[dict[str, Any]]:
    """Collective (2 PEs): the rows of every size. ``run(mode, nbytes, groups)`` launches PE
    0's kernel and waits for it (mode 0: empty, 1: put_signal to PE 1, each group adding 1 to
    its signal, 2: the same bytes copied locally); ``seen(total)`` returns on PE 1 once its
    signal reached ``total``."""
    me = shmem.my_pe()
    stamps = shmem.zeros(4, np.float64)  # PE 0's launch times, put into PE 1
    mine = shmem.zeros(3, np.float64)  # this PE's medians
    both = shmem.zeros(6, np.float64)  # every PE's (fcollect)
    signalled = 0
    rows = []
    for nbytes in SIZES:
        groups = groups_for(nbytes)
        rounds = 3 if quick else (30 if nbytes <= 1 << 20 else 8)
        lat: list[float] = []
        floor: list[float] = []
        ceil: list[float] = []
        for r in range(rounds + 2):  # two warm-ups
            shmem.barrier_all()
            if me == 0:
                t0 = time.perf_counter()
                run(1, nbytes, groups)
                shmem.put(stamps[:1], np.array([t0]), 1)
            else:
                signalled += groups
                seen(signalled)
                t1 = time.perf_counter()
            shmem.barrier_all()
            if me == 1 and r >= 2:
                lat.append((t1 - float(stamps[0])) * 1e6)
            if me == 0:  # floor and ceiling, PE 0 alone
                for mode, out in ((0, floor), (2, ceil)):
                    t0 = time.perf_counter()
                    run(mode, nbytes, groups)
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
    return rows


def report(rows: list[dict[str, Any]], device: str, domain: str, path: Path | None,
           command: str, note: str = "") -> None:
    """Print the table (PE 0) and, with ``path``, write the rows with the date, the device,
    the driver and the command."""
    print(f"{'bytes':>10} {'groups':>6} {'put_signal us':>14} {'floor us':>9} {'+floor':>8} "
          f"{'ceiling us':>11} {'put GB/s':>9} {'ceil GB/s':>10} {'ratio':>6}")
    for row in rows:
        ratio = row["ceiling_us"] / row["put_signal_us"]  # bandwidth ratio
        print(f"{row['bytes']:>10} {row['groups']:>6} {row['put_signal_us']:>14.2f} "
              f"{row['floor_us']:>9.2f} {row['put_signal_us'] - row['floor_us']:>8.2f} "
              f"{row['ceiling_us']:>11.2f} {row['put_signal_GBps']:>9.3f} "
              f"{row['ceiling_GBps']:>10.3f} {ratio:>6.2f}")
    print(f"route PE 0 -> PE 1: {rows[0]['route'] if rows else '?'}; device {device} ({domain})")
    if path is None:
        return
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=30).stdout.strip()
    except OSError:
        driver = "unknown"
    data = {"date": datetime.date.today().isoformat(), "device": device, "driver": driver,
            "domain": domain, "command": command + " " + " ".join(sys.argv[1:]), "rows": rows}
    if note:
        data["note"] = note
    path.write_text(json.dumps(data, indent=1) + "\n")
