"""Where an ofi operation's microseconds go: its steps timed in C next to the same operations
through vkshmem's API, at 2 PEs, in one run.

Run: ``.venv/bin/python plugins/ofi/tools/probe_ofi.py [--providers 'shm,tcp;ofi_rxm']
[--variants 'busy_us=2000,busy_us=0']``. For each provider and rail-option variant it runs
this file under ``vkshmem run -n 2`` (``VKSHMEM_SHM=0``, the ofi transport on that provider);
PE 0 times, towards PE 1 (which waits in a barrier, served by its progress thread):

* ``vko_probe`` (csrc/vko_probe.c), n repetitions timed in C: an empty CQ read (the waiting
  caller's progress call), a read of the remote-access counter (what the progress thread
  adds to each round on polling providers), put 8 B (posted only), put 8 B + quiet, get 8 B,
  fetch_add 8 B, add 8 B + quiet; with the CQ reads the caller made per operation;
* the same operations through vkshmem's API (the core's compiled hot path into the C data
  path), so that the difference is what the API adds.

Each figure is the median of ``--reps`` samples of ``--iters`` operations.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import timeit

from bench_ofi import run_vkshmem

STEPS = ["empty CQ read", "counter read", "put 8 B + quiet", "put 8 B (posted)", "get 8 B",
         "fetch_add 8 B", "add 8 B + quiet"]


def pe_main(iters: int, reps: int) -> None:
    import numpy as np
    from vkshmem_ofi._ofi import ffi, lib

    from vkshmem import shmem

    me = shmem.my_pe()
    t = shmem._state.rt.routing.route_transport[1]
    word = shmem.zeros(1, np.int64)
    one, out8 = np.ones(1, np.int64), np.empty(1, np.int64)
    out = ffi.new("uint64_t[3]")
    api = {
        "put 8 B + quiet": lambda: (shmem.put(word, one, 1), shmem.quiet()),
        "put 8 B (posted)": lambda: shmem.put(word, one, 1),
        "get 8 B": lambda: shmem.get(out8, word, 1),
        "fetch_add 8 B": lambda: shmem.atomic_fetch_add(word, 1, 1),
        "add 8 B + quiet": lambda: (shmem.atomic_add(word, 1, 1), shmem.quiet()),
    }
    result: dict[str, dict[str, float]] = {}
    for what, step in enumerate(STEPS):
        c_ns, polls, api_ns = [], [], []
        for _ in range(reps):
            shmem.barrier_all()
            if me == 0:
                rc = lib.vko_probe(t._e, 1, what, iters, out)
                if rc == 0:
                    c_ns.append(out[0] / iters)
                    polls.append(out[1] / iters)
                if step in api:
                    timeit.timeit(api[step], number=100)  # warm-up
                    shmem.quiet()
                    api_ns.append(timeit.timeit(api[step], number=iters) * 1e9 / iters)
                    shmem.quiet()
            shmem.barrier_all()
        if me == 0:
            result[step] = {"c_us": statistics.median(c_ns) / 1e3 if c_ns else -1,
                            "polls": statistics.median(polls) if polls else -1,
                            "api_us": statistics.median(api_ns) / 1e3 if api_ns else -1}
    if me == 0:
        result["_stats"] = {k: v for k, v in t.stats().items()
                            if k in ("native_calls", "busy_windows", "remote_ops")}
        print("RESULT " + json.dumps(result), flush=True)


def run(provider: str, variant: str, iters: int, reps: int) -> dict[str, dict[str, float]]:
    rail = f"ofi:provider={provider}" + (f":{variant.replace('+', ':')}" if variant else "")
    res = run_vkshmem(sys.executable, {"VKSHMEM_RAIL0": rail}, iters, reps, __file__)
    if res is None:
        raise SystemExit(f"{rail}: the run failed")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--providers", default="shm,tcp;ofi_rxm")
    ap.add_argument("--variants", default="busy_us=2000,busy_us=0",
                    help="rail-option sets to compare, comma-separated ('+' joins options)")
    args = ap.parse_args()
    if args.pe:
        pe_main(args.iters, args.reps)
        return
    for prov in args.providers.split(","):
        for variant in args.variants.split(","):
            res = run(prov, variant, args.iters, args.reps)
            stats = res.pop("_stats")
            print(f"\n{prov}, {variant or 'defaults'} ({stats}; load average "
                  f"{os.getloadavg()[0]:.1f})")
            print("| step | in C (µs) | CQ reads by the caller / op | through the API (µs) |")
            print("|---|---:|---:|---:|")
            for step, v in res.items():
                cells = [f"{v['c_us']:.2f}" if v["c_us"] >= 0 else "-",
                         f"{v['polls']:.1f}" if v["polls"] >= 0 else "-",
                         f"{v['api_us']:.2f}" if v["api_us"] >= 0 else "-"]
                print(f"| {step} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
