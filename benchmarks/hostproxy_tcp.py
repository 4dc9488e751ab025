"""vkshmem over hostproxy next to a raw TCP request/response round trip, in one run.

Run: ``.venv/bin/python benchmarks/hostproxy_tcp.py [--before OTHER_PYTHON] [--rounds N]``.
Each round runs, one after the other (so all meet the same load):

* the reference: a C program (compiled here with ``cc``) of two processes pinned to cores 0
  and 1, the client sending a 32-byte request on loopback TCP (``TCP_NODELAY``, blocking
  sockets) and the server answering with 16 bytes + the payload (8 B or 64 KiB), as a hostproxy
  GET is answered; per round trip;
* ``vkshmem bench --transport hostproxy -b rma,amo,barrier -s 8,64K --json`` of this interpreter's
  vkshmem (``after``) and, with ``--before``, of another checkout's interpreter (``before``:
  e.g. ``/work/main/.venv/bin/python``).

It prints, per row, the median over rounds of each round's median, then the best round (the
least disturbed by other load on a shared machine), with ``after / TCP`` (the issue's target:
at most 2). ``put_lat`` is ``put`` + ``quiet`` (the put, then a FLUSH answered by the
target), ``get_lat`` a ``get``, the AMO rows as ``vkshmem bench`` describes them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

C_SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static int full(int fd, char *p, size_t n, int out) {
    while (n) {
        ssize_t r = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, MSG_WAITALL);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t size = strtoul(argv[1], NULL, 10);
    long iters = atol(argv[2]), samples = atol(argv[3]), cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al))
        return 1;
    char *buf = calloc(1, 32 + 16 + size);
    pid_t child = fork();
    if (child == 0) { /* the server: answer each 32-byte request with 16 + size bytes */
        if (cpus > 1) pin(1);
        int fd = accept(ls, NULL, NULL);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        while (full(fd, buf, 32, 0) == 0 && full(fd, buf, 16 + size, 1) == 0) {}
        _exit(0);
    }
    pin(0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (void *)&a, sizeof a)) return 1;
    for (long s = -1; s < samples; s++) { /* sample -1: warm-up */
        double t0 = now();
        for (long i = 0; i < iters; i++)
            if (full(fd, buf, 32, 1) || full(fd, buf, 16 + size, 0)) return 1;
        if (s >= 0) printf("%.4f\n", (now() - t0) / iters * 1e6);
    }
    close(fd);
    waitpid(child, NULL, 0);
    return 0;
}
"""

BENCH = ["-m", "vkshmem", "bench", "--transport", "hostproxy", "-b", "rma,amo,barrier", "-s",
         "8,64K"]
SIZES = (8, 65536)


def build(tmp: Path) -> Path:
    """Compile the reference program into ``tmp``."""
    src, exe = tmp / "tcp_rtt.c", tmp / "tcp_rtt"
    src.write_text(C_SOURCE)
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    subprocess.run([shutil.which(cc) or "cc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def tcp_rtt(exe: Path, size: int) -> float:
    """Median µs per raw TCP round trip (32-byte request, 16 + ``size`` bytes back)."""
    iters = 5000 if size <= 64 else 1000
    out = subprocess.run([str(exe), str(size), str(iters), "5"], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return statistics.median(float(x) for x in out.split())


def bench(python: str, tmp: Path) -> dict[tuple[str, int], float]:
    """``vkshmem bench`` of interpreter ``python``: (benchmark, size) -> median µs."""
    path = tmp / "bench.json"
    # run from tmp: ``python -m`` puts the working directory first on the path, and a checkout
    # there would be imported instead of that interpreter's vkshmem
    subprocess.run([python, *BENCH, "--json", str(path)], check=True, capture_output=True,
                   timeout=600, env={**os.environ, "VKSHMEM_SHM": "0"}, cwd=tmp)
    doc = json.loads(path.read_text())
    return {(row["benchmark"], row["size"]): row["values"]["vkshmem"]["median"]
            for row in doc["rows"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="interpreter of the vkshmem to compare with (before)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    args = ap.parse_args()
    tcp: dict[int, list[float]] = {s: [] for s in SIZES}
    sides = {"after": sys.executable, **({"before": args.before} if args.before else {})}
    got: dict[str, dict[tuple[str, int], list[float]]] = {s: {} for s in sides}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build(tmp)
        for r in range(args.rounds):
            for size in SIZES:
                tcp[size].append(tcp_rtt(exe, size))
            for side, python in sides.items():
                for key, us in bench(python, tmp).items():
                    got[side].setdefault(key, []).append(us)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    # each row: the median over rounds, and the best round (the least disturbed by other load)
    for label, pick in (("median", statistics.median), ("best", min)):
        ref = {s: pick(v) for s, v in tcp.items()}
        cols = [s for s in ("before", "after") if s in sides]
        print(f"\n{label} of {args.rounds} rounds; raw TCP round trip: 8 B {ref[8]:.1f} µs, "
              f"64 KiB {ref[65536]:.1f} µs")
        print("| benchmark | size | " + " | ".join(f"{c} µs" for c in cols)
              + " | raw TCP µs | after / TCP |")
        print("|---|---:|" + "---:|" * (len(cols) + 2))
        for key in got["after"]:
            name, size = key
            vals = [pick(got[c][key]) for c in cols]
            base = ref[65536 if size > 64 else 8]  # (barrier: against the 8-byte round trip)
            print(f"| {name} | {size} | " + " | ".join(f"{v:.1f}" for v in vals)
                  + f" | {base:.1f} | {vals[-1] / base:.2f} |")

if __name__ == "__main__":
    main()
