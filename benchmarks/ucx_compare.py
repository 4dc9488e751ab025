"""vkshmem over UCX next to UCX's own ``ucx_perftest``, at 2 PEs on this machine.

Run: ``.venv/bin/python benchmarks/ucx_compare.py`` (it launches everything itself). For each
UCX path (shared memory: ``UCX_TLS=posix,cma,self``; tcp on loopback: ``UCX_TLS=tcp,self``)
it runs this file under ``vkshmem run -n 2`` with ``VKSHMEM_SHM=0 VKSHMEM_TRANSPORTS=ucx``
(PE 0 measures against PE 1, which waits in a barrier), then ``ucx_perftest`` (server and
client processes) with the same ``UCX_TLS``, and prints one table:

* put 8 B + quiet: vkshmem's ``put`` + ``quiet`` (a full round trip: the flush is acknowledged)
  vs ``ucp_put_lat`` (ping-pong; perftest reports half the round trip);
* get 8 B: ``get`` vs ``ucp_get -O 1``;
* fetch_add 8 B: ``atomic_fetch_add`` vs ``ucp_fadd -O 1`` (one outstanding: per-op latency);
* put 1 MiB bandwidth: ``put`` + ``quiet`` per MiB vs ``ucp_put_bw -O 1``.

What differs besides Python: perftest's buffers are allocated by UCX (``ucp_mem_map`` with
ALLOCATE), so over shared memory it stores straight into the peer's mapping and uses CPU atomics
on it. With ``VKSHMEM_SHM=0`` the plugin lets UCX allocate vkshmem's heap in place too (rail
option ``heap=auto``) and does the same through UCX's mapping (``direct=on``); with
``heap=core`` the heap is the core's memfd that UCX only registers, so puts go through cma
(process_vm_writev) and atomics through UCX's software path, served by the target's progress
thread. perftest busy-polls both sides; vkshmem's target sleeps until woken. ``vkshmem bench
--transport ucx --compare ucx_perftest`` measures more of the same in one run.

``ucx_perftest`` is the one in the libucx-cu12 wheel (same UCX as the plugin, usually); if
Debian's ``ucx-utils`` is installed (``/usr/bin/ucx_perftest``, UCX 1.13) its figures are added
as another column (``--no-system`` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

PATHS = {"sm": "posix,cma,self", "tcp": "tcp,self"}
ROWS = [("put 8 B + quiet", "us"), ("get 8 B", "us"), ("fetch_add 8 B", "us"),
        ("put 1 MiB", "GB/s")]
PERFTEST = {  # row -> ucx_perftest arguments (and which column of its Final line to read)
    "put 8 B + quiet": (["-t", "ucp_put_lat", "-s", "8"], "lat"),
    "get 8 B": (["-t", "ucp_get", "-s", "8", "-O", "1"], "lat"),
    "fetch_add 8 B": (["-t", "ucp_fadd", "-s", "8", "-O", "1"], "lat"),
    "put 1 MiB": (["-t", "ucp_put_bw", "-s", "1048576", "-O", "1"], "bw"),
}


# -- the PE side (under vkshmem run) ---------------------------------------------------------

def pe_main(iters: int, reps: int) -> None:
    """Measure PE 0 -> PE 1 and print one RESULT line (PE 0)."""
    import numpy as np

    from vkshmem import shmem

    me = shmem.my_pe()
    small = shmem.zeros(1, np.int64)
    src8 = np.ones(1, np.int64)
    dst8 = np.empty(1, np.int64)
    big = shmem.zeros(1 << 17, np.float64)  # 1 MiB
    src_big = np.random.default_rng(0).standard_normal(1 << 17)

    def put_quiet() -> None:
        shmem.put(small, src8, 1)
        shmem.quiet()

    def put_big() -> None:
        shmem.put(big, src_big, 1)
        shmem.quiet()

    tests = {
        "put 8 B + quiet": (put_quiet, iters),
        "get 8 B": (lambda: shmem.get(dst8, small, 1), iters),
        "fetch_add 8 B": (lambda: shmem.atomic_fetch_add(small, 1, 1), iters),
        "put 1 MiB": (put_big, max(20, iters // 25)),
    }
    out: dict[str, float] = {}
    for name, (fn, n) in tests.items():
        samples = []
        for _ in range(reps):
            shmem.barrier_all()
            if me == 0:
                for _ in range(min(200, n)):
                    fn()
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples.append((time.perf_counter() - t0) / n)
            shmem.barrier_all()
        if me == 0:
            per_op = statistics.median(samples)
            out[name] = (1 << 20) / per_op / 1e9 if name == "put 1 MiB" else per_op * 1e6
    if me == 0:
        print("RESULT " + json.dumps(out), flush=True)


def run_vkshmem(tls: str, iters: int, reps: int) -> dict[str, float]:
    env = {**os.environ, "VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": tls,
           "VKSHMEM_SYMMETRIC_SIZE": "64M",
           "VKSHMEM_UCX_TRUSTED_NETWORK": "1"}  # tcp on loopback: this host only
    cmd = [sys.executable, "-m", "vkshmem", "run", "-n", "2", "--timeout", "600", __file__,
           "--pe", "--iters", str(iters), "--reps", str(reps)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660)
    for line in r.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"vkshmem run failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")


# -- ucx_perftest ----------------------------------------------------------------------------

def wheel_perftest() -> tuple[list[str], dict[str, str], str] | None:
    """(command, extra environment, label) of the wheel's ucx_perftest, if it is there."""
    try:
        import libucx
    except ImportError:
        return None
    root = Path(libucx.__file__).parent
    exe = root / "bin" / "ucx_perftest"
    if not exe.is_file():
        return None
    # its RUNPATH points at the wheel's build machine: show it the wheel's libraries
    env = {"LD_LIBRARY_PATH": os.pathsep.join(
        filter(None, [str(root / "lib"), os.environ.get("LD_LIBRARY_PATH", "")]))}
    return [str(exe)], env, f"ucx_perftest {libucx.__version__} (wheel)"


def system_perftest() -> tuple[list[str], dict[str, str], str] | None:
    exe = Path("/usr/bin/ucx_perftest")
    if not exe.is_file():
        return None
    version = "system"
    try:
        info = subprocess.run(["ucx_info", "-v"], capture_output=True, text=True, timeout=30)
        m = re.search(r"Version (\S+)", info.stdout)
        version = m.group(1) if m else version
    except OSError:
        pass
    return [str(exe)], {}, f"ucx_perftest {version} (Debian)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_perftest(cmd: list[str], extra_env: dict[str, str], tls: str, args: list[str],
                 kind: str, iters: int) -> float | None:
    """One ucx_perftest test (server + client); latency in us or bandwidth in GB/s."""
    env = {**os.environ, **extra_env, "UCX_TLS": tls}
    n = str(iters if kind == "lat" else max(100, iters // 25))
    for _ in range(5):  # the client fails at once if the server does not listen yet
        port = str(free_port())
        server = subprocess.Popen([*cmd, "-p", port], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            r = subprocess.run([*cmd, "localhost", "-p", port, "-n", n, "-w", "1000", *args],
                               env=env, capture_output=True, text=True, timeout=300)
        finally:
            server.kill()
            server.wait()
        for line in r.stdout.splitlines():
            if line.startswith("Final:"):
                f = line.split()[1:]  # iters, latency typical/avg/overall, MB/s avg/overall..
                return float(f[2]) if kind == "lat" else float(f[4]) * (1 << 20) / 1e9
    return None


# -- the driver ------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=5000, help="operations per latency sample")
    ap.add_argument("--reps", type=int, default=3, help="samples per figure (median)")
    ap.add_argument("--no-system", action="store_true", help="skip Debian's ucx_perftest")
    args = ap.parse_args()
    if args.pe:
        pe_main(args.iters, args.reps)
        return

    from vkshmem_ucx._transport import build_info, ucx_version

    columns: dict[str, dict[tuple[str, str], float | None]] = {}
    label = f"vkshmem-ucx (UCX {'.'.join(map(str, ucx_version()))})"
    columns[label] = {}
    for path, tls in PATHS.items():
        for row, value in run_vkshmem(tls, args.iters, args.reps).items():
            columns[label][(row, path)] = value
    tools = [wheel_perftest()] + ([] if args.no_system else [system_perftest()])
    for tool in filter(None, tools):
        cmd, env, name = tool
        columns[name] = {}
        for path, tls in PATHS.items():
            for row, (pargs, kind) in PERFTEST.items():
                columns[name][(row, path)] = run_perftest(cmd, env, tls, pargs, kind,
                                                          4 * args.iters)
    names = list(columns)
    width = max(14, *(len(n) for n in names))
    print(f"\n2 PEs on this host, {os.cpu_count()} CPUs; vkshmem-ucx {build_info()}")
    print(f"{'figure':28s}" + "".join(f" {n:>{width}s}" for n in names))
    for path in PATHS:
        for row, unit in ROWS:
            cells = []
            for n in names:
                v = columns[n].get((row, path))
                cells.append(f" {'-' if v is None else f'{v:.2f}':>{width}s}")
            print(f"{f'{row} [{path}] ({unit})':28s}" + "".join(cells))
    print("\nlatencies: vkshmem put+quiet is a full round trip, ucp_put_lat half of one; "
          "perftest's\nshared-memory buffers are UCX-allocated (direct stores, CPU atomics), "
          "and so is vkshmem's heap\n(rail option heap=auto with VKSHMEM_SHM=0; with heap=core "
          "it is registered memfd memory:\ncma copies, software atomics via the target's "
          "progress thread).")


if __name__ == "__main__":
    main()
