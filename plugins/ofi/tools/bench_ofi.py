"""vkshmem over libfabric next to libfabric's own ping-pong, at 2 PEs on this machine.

Run: ``.venv/bin/python plugins/ofi/tools/bench_ofi.py [--providers 'tcp;ofi_rxm,shm']`` (it
launches everything itself). For each provider it runs this file under ``vkshmem run -n 2``
with ``VKSHMEM_SHM=0 VKSHMEM_TRANSPORTS=ofi VKSHMEM_OFI_PROVIDER=<provider>`` (PE 0 measures
against PE 1, which waits in a barrier), then ``fi_pingpong`` (Debian ``libfabric-bin``; server
and client on loopback) on the same provider with an RDM endpoint, and prints one table:

* put 8 B + quiet, get 8 B, fetch_add 8 B: microseconds per operation (one outstanding);
* put 1 MiB: ``put`` + ``quiet`` per MiB, in GB/s;
* ``fi_pingpong`` 8 B: microseconds per transfer (half a round trip of two-sided messages);
  ``fi_pingpong`` 1 MiB: MB/s as it reports it, converted to GB/s.

Debian 12 has no fabtests package, so ``fi_rma_pingpong``/``fi_rma_bw`` (one-sided) are not
available; ``fi_pingpong`` (two-sided messages) is the provider's own figure here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The measurement itself is the UCX comparison's (same operations, same rows), reused as is.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from ucx_compare import ROWS, pe_main


def run_vkshmem(provider: str, iters: int, reps: int) -> dict[str, float]:
    """One 2-PE run over ``provider``; the RESULT of PE 0."""
    env = {**os.environ, "VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ofi",
           "VKSHMEM_OFI_PROVIDER": provider, "VKSHMEM_SYMMETRIC_SIZE": "64M"}
    cmd = [sys.executable, "-m", "vkshmem", "run", "-n", "2", "--timeout", "600", __file__,
           "--pe", "--iters", str(iters), "--reps", str(reps)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660)
    for line in r.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"vkshmem run failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")


def run_pingpong(provider: str, size: int, iters: int, port: int) -> tuple[float, float] | None:
    """``fi_pingpong`` on ``provider`` (RDM): (usec/xfer, MB/s), or None without the tool."""
    exe = shutil.which("fi_pingpong")
    if exe is None:
        return None
    args = [exe, "-p", provider, "-e", "rdm", "-I", str(iters), "-S", str(size)]
    server = subprocess.Popen([*args, "-B", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        r = subprocess.run([*args, "-P", str(port), "127.0.0.1"], capture_output=True,
                           text=True, timeout=120)
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    lines = [ln.split() for ln in r.stdout.splitlines() if re.match(r"^\d+[km]?\s", ln)]
    if r.returncode or not lines:
        return None
    fields = lines[-1]
    return float(fields[6]), float(fields[5])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=2000, help="operations per latency sample")
    ap.add_argument("--reps", type=int, default=3, help="samples per figure (median)")
    ap.add_argument("--providers", default="tcp;ofi_rxm,shm", help="comma-separated providers")
    args = ap.parse_args()
    if args.pe:
        pe_main(args.iters, args.reps)
        return
    port = 47700
    print(f"| 2 PEs, median of {args.reps} | " + " | ".join(
        f"vkshmem-ofi {p} | fi_pingpong {p}" for p in args.providers.split(",")) + " |")
    results = {}
    for prov in args.providers.split(","):
        ours = run_vkshmem(prov, args.iters, args.reps)
        pp8 = run_pingpong(prov, 8, args.iters, port)
        pp1m = run_pingpong(prov, 1 << 20, max(20, args.iters // 25), port + 1)
        port += 2
        results[prov] = (ours, pp8, pp1m)
    for name, unit in ROWS:
        cells = []
        for ours, pp8, pp1m in results.values():
            theirs = "-"
            if name == "put 8 B + quiet" and pp8:
                theirs = f"{pp8[0]:.1f} us (8 B msg)"
            elif name == "put 1 MiB" and pp1m:
                theirs = f"{pp1m[1] / 1000:.2f} GB/s (1 MiB msg)"
            cells += [f"{ours[name]:.2f} {unit}", theirs]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
