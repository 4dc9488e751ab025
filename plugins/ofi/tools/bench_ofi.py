"""vkshmem over libfabric next to libfabric's own one-sided benchmarks, in one run, at 2 PEs.

Run: ``.venv/bin/python plugins/ofi/tools/bench_ofi.py [--providers 'shm,tcp;ofi_rxm']
[--fabtests DIR] [--main-python PATH] [--rounds R]`` (it launches everything itself). For each
round and provider, taking turns:

* vkshmem: this file under ``vkshmem run -n 2`` with ``VKSHMEM_SHM=0`` and the ofi transport on
  that provider (PE 0 measures against PE 1, which waits in a barrier), once with the rail
  option ``native=0`` (the core calls the transport's Python methods: the path before the C
  data path) and once with ``native=1`` (the default: the core's compiled hot path calls
  ``csrc/vko_native.c``); with ``--main-python``, also under another checkout's interpreter
  (e.g. the main branch's ``.venv/bin/python``);
* the provider's own figures (fabtests, server and client on loopback, RDM endpoints):
  ``fi_rma_pingpong -o write -S 8`` (its usec/xfer is half a round trip: doubled here, as
  put + quiet waits for the write's delivery), ``fi_rma_bw -o read -S 8 -W 1`` (one read at a
  time: a get), ``fi_rdm_atomic -o read -z uint64`` (a fetching atomic, one at a time: next to
  fetch_add) and ``fi_rma_bw -o write -S 1M`` (bandwidth, window 64).

Each cell is the median over the rounds of each round's median of ``--reps`` samples.
Debian 12 has no fabtests package: ``build_fabtests.sh`` beside this file builds them from a
libfabric 1.21 source tree against the system's 1.17; ``--fabtests`` names that folder (else
they are looked up on PATH, and left out where missing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The measurement itself is the UCX comparison's (same operations, same rows), reused as is.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from ucx_compare import ROWS, pe_main

#: row -> (fabtests program, arguments, column read, factor), the provider's own figure
FABTESTS = {
    "put 8 B + quiet": ("fi_rma_pingpong", ["-o", "write", "-S", "8"], "usec", 2.0),
    "get 8 B": ("fi_rma_bw", ["-o", "read", "-S", "8", "-W", "1"], "usec", 1.0),
    "fetch_add 8 B": ("fi_rdm_atomic", ["-o", "read", "-z", "uint64"], "usec", 1.0),
    "put 1 MiB": ("fi_rma_bw", ["-o", "write", "-S", "1048576"], "GB/s", 1.0),
}


def run_vkshmem(python: str, env_extra: dict[str, str], iters: int, reps: int,
                script: str = __file__) -> Any:
    """One 2-PE run of ``script --pe``; the RESULT of PE 0 (None when it failed: printed)."""
    env = {**os.environ, "VKSHMEM_SHM": "0", "VKSHMEM_SYMMETRIC_SIZE": "64M", **env_extra}
    cmd = [python, "-m", "vkshmem", "run", "-n", "2", "--timeout", "600", script,
           "--pe", "--iters", str(iters), "--reps", str(reps)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660)
    for line in r.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    print(f"vkshmem run failed ({r.returncode}): {env_extra}\n{r.stdout}\n{r.stderr}",
          file=sys.stderr)
    return None


def run_fabtest(exe: str, provider: str, args: list[str], iters: int, port: int,
                column: str) -> float | None:
    """Server and client of one fabtests program on loopback; the client's last figure
    (``usec``: usec/xfer, ``GB/s``: its MB/sec / 1000), or None."""
    base = [exe, "-p", provider, "-e", "rdm", "-I", str(iters), f"-E={port}", *args]
    server = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.4)
        r = subprocess.run([*base, "127.0.0.1"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    rows = [ln.split() for ln in r.stdout.splitlines() if re.search(r"\s\d+[km]?\s+\d", ln)]
    if r.returncode or not rows:
        return None
    fields = rows[-1]  # ... bytes iters total time MB/sec usec/xfer Mxfers/sec
    return float(fields[-2]) if column == "usec" else float(fields[-3]) / 1000


def find_tool(name: str, folder: str | None) -> str | None:
    if folder and (Path(folder) / name).is_file():
        return str(Path(folder) / name)
    return shutil.which(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=2000, help="operations per latency sample")
    ap.add_argument("--reps", type=int, default=5, help="samples per figure (median)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds taking turns (median)")
    ap.add_argument("--providers", default="shm,tcp;ofi_rxm", help="comma-separated providers")
    ap.add_argument("--fabtests", help="folder of fi_rma_pingpong etc. (build_fabtests.sh)")
    ap.add_argument("--main-python", help="also run vkshmem under this interpreter (another "
                    "checkout, e.g. the main branch's .venv/bin/python)")
    ap.add_argument("--json", help="also write every sample to this file")
    args = ap.parse_args()
    if args.pe:
        pe_main(args.iters, args.reps)
        return
    providers = args.providers.split(",")
    sides: dict[str, tuple[str, dict[str, str]] | None] = {}
    if args.main_python:
        sides["main"] = (args.main_python, {"VKSHMEM_TRANSPORTS": "ofi"})
    sides["native=0"] = (sys.executable, {"VKSHMEM_RAIL0": "ofi:native=0"})
    sides["native=1"] = (sys.executable, {"VKSHMEM_RAIL0": "ofi:native=1"})
    samples: dict[tuple[str, str, str], list[float]] = {}
    port = 47700
    for _ in range(args.rounds):
        for prov in providers:
            for side, spec in sides.items():
                assert spec is not None
                python, env = spec
                env = {k: (v + f":provider={prov}" if k == "VKSHMEM_RAIL0" else v)
                       for k, v in env.items()}
                if "VKSHMEM_RAIL0" not in env:
                    env["VKSHMEM_OFI_PROVIDER"] = prov
                got = run_vkshmem(python, env, args.iters, args.reps)
                for row, value in (got or {}).items():
                    samples.setdefault((prov, side, row), []).append(value)
            for row, (tool, targs, column, factor) in FABTESTS.items():
                exe = find_tool(tool, args.fabtests)
                iters = args.iters * 5 if column == "usec" else max(50, args.iters // 10)
                value = None
                for _ in range(2 if exe else 0):  # fi_rma_pingpong (1.21 on 1.17) hangs at times
                    value = run_fabtest(exe, prov, targs, iters, port, column)
                    port += 1
                    if value:
                        break
                if value:
                    samples.setdefault((prov, "fabtests", row), []).append(value * factor)
    if args.json:
        Path(args.json).write_text(json.dumps({"|".join(k): v for k, v in samples.items()}))
    print(f"2 PEs; median (best) of {args.rounds} rounds, each the median of {args.reps} "
          "samples; provider figures from fabtests (put: fi_rma_pingpong write round trip; "
          "get: fi_rma_bw read -W 1; fetch_add: fi_rdm_atomic read uint64; 1 MiB: fi_rma_bw "
          "write); 'slower by': native=1 against fabtests, medians (best against best)\n")
    for prov in providers:
        names = [*sides, "fabtests", "native=1 slower by"]
        print(f"| {prov} | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        for row, unit in ROWS:
            figs = [figures(samples.get((prov, s, row)), unit) for s in [*sides, "fabtests"]]
            out = [f"{m:.2f} ({b:.2f}) {unit}" if m else "-" for m, b in figs]
            (mine, mine_best), (ref, ref_best) = figs[-2], figs[-1]
            if mine and ref:
                slow = [r / m if unit == "GB/s" else m / r
                        for m, r in ((mine, ref), (mine_best, ref_best))]
                out.append(f"{slow[0]:.2f}x ({slow[1]:.2f}x)")
            else:
                out.append("-")
            print(f"| {row} | " + " | ".join(out) + " |")
        print()


def figures(values: list[float] | None, unit: str) -> tuple[float, float]:
    """(median, best) of one cell's per-round figures; (0, 0) without any."""
    if not values:
        return 0.0, 0.0
    return statistics.median(values), max(values) if unit == "GB/s" else min(values)

if __name__ == "__main__":
    main()
