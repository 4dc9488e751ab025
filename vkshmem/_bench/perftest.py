"""UCX's own benchmark, ``ucx_perftest``, as a side of ``vkshmem bench --compare``.

Found in the PyPI ``libucx`` wheel (``libucx/bin``; the one vkshmem-ucx builds against) or on
PATH (Debian's ``ucx-utils``). Each plan item it has a test for runs as one server and one
client process on this host (2 PEs only; pinned to two cores with ``-c`` as the PEs are),
with the plan's iterations x samples and warm-up; UCX picks its transports from ``UCX_TLS``
as usual:

============  =======================================  ================================
benchmark     test                                     figure read
============  =======================================  ================================
put_lat       ``ucp_put_lat`` (ping-pong)              50th percentile latency (half RTT)
get_lat       ``ucp_get -O 1``                         50th percentile latency
put_bw/rate   ``ucp_put_bw -O window``                 overall bandwidth / message rate
get_bw/rate   ``ucp_get -O window``                    overall bandwidth / message rate
fetch_add,    ``ucp_fadd``, ``ucp_swap``,              50th percentile latency
swap, cswap,  ``ucp_cswap``, ``ucp_add`` (``-O 1``)
add
============  =======================================  ================================
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .sides import BenchError, Outcome, Skipped
from .spec import Plan

__all__ = ["TESTS", "find_perftest", "run_perftest"]

#: benchmark -> (ucx_perftest test, extra arguments, figure: lat | bw | rate)
TESTS: dict[str, tuple[str, list[str], str]] = {
    "put_lat": ("ucp_put_lat", [], "lat"),
    "get_lat": ("ucp_get", ["-O", "1"], "lat"),
    "put_bw": ("ucp_put_bw", ["-O", "{window}"], "bw"),
    "put_rate": ("ucp_put_bw", ["-O", "{window}"], "rate"),
    "get_bw": ("ucp_get", ["-O", "{window}"], "bw"),
    "get_rate": ("ucp_get", ["-O", "{window}"], "rate"),
    "fetch_add": ("ucp_fadd", ["-O", "1"], "lat"),
    "swap": ("ucp_swap", ["-O", "1"], "lat"),
    "compare_swap": ("ucp_cswap", ["-O", "1"], "lat"),
    "add": ("ucp_add", ["-O", "1"], "lat"),
}


def find_perftest() -> tuple[list[str], dict[str, str], str]:
    """(command, extra environment, label) of ``ucx_perftest``, or :class:`Skipped`."""
    spec = importlib.util.find_spec("libucx")
    if spec is not None and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        exe = root / "bin" / "ucx_perftest"
        if exe.is_file():
            version = "?"
            for dist in ("libucx-cu12", "libucx-cu13", "libucx-cu11", "libucx"):
                try:
                    version = importlib.metadata.version(dist)
                    break
                except importlib.metadata.PackageNotFoundError:
                    continue
            # its RUNPATH names the wheel's build machine: show it the wheel's libraries
            lib = os.pathsep.join(filter(None, [str(root / "lib"),
                                                os.environ.get("LD_LIBRARY_PATH", "")]))
            return [str(exe)], {"LD_LIBRARY_PATH": lib}, f"ucx_perftest {version} (wheel)"
    exe_path = shutil.which("ucx_perftest")
    if exe_path:
        return [exe_path], {}, "ucx_perftest (PATH)"
    raise Skipped("ucx_perftest not found (pip install libucx-cu12, or Debian's ucx-utils)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _final(stdout: str) -> list[float] | None:
    for line in stdout.splitlines():
        if line.startswith("Final:"):
            return [float(x) for x in line.split()[1:]]
    return None


def run_one(cmd: list[str], env: dict[str, str], args: list[str], timeout: float,
            cores: tuple[str, str] | None = None) -> list[float] | None:
    """One test: server and client on this host; the client's ``Final:`` figures (iterations,
    latency 50%/avg/overall us, bandwidth avg/overall MB/s, rate avg/overall msg/s)."""
    deadline = time.monotonic() + timeout
    for attempt in range(5):  # the client fails at once when the server is not listening yet
        port = str(_free_port())
        pin_s, pin_c = (["-c", cores[0]], ["-c", cores[1]]) if cores else ([], [])
        server = subprocess.Popen([*cmd, "-p", port, *pin_s], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            time.sleep(0.2 + 0.3 * attempt)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r = subprocess.run([*cmd, "localhost", "-p", port, *pin_c, *args], env=env,
                               capture_output=True, text=True, timeout=left,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None
        finally:
            server.kill()
            server.wait()
        fig = _final(r.stdout)
        if fig is not None:
            return fig
    return None


def run_perftest(plan: Plan, npes: int, timeout: float,
                 on_result: Callable[[str, int], None]) -> Outcome:
    """Every plan item ``ucx_perftest`` has a test for; the others are absent from the
    results. Raises :class:`Skipped` when it is missing or ``npes`` is not 2."""
    if npes != 2:
        raise Skipped(f"ucx_perftest runs 2 processes, the job has {npes} PEs")
    cmd, extra, label = find_perftest()
    env = {**os.environ, **extra}
    out = Outcome("ucx_perftest", meta={"impl": "ucx_perftest", "label": label,
                                        "library": f"UCX_TLS={env.get('UCX_TLS', '(auto)')}",
                                        "npes": 2, "domain": "host"})
    deadline = time.monotonic() + timeout
    failed: list[str] = []
    cpus = sorted(os.sched_getaffinity(0))
    cores = (str(cpus[0]), str(cpus[1])) if plan.bind and len(cpus) >= 2 else None
    for item in plan.items:
        if item.bench not in TESTS:
            continue
        test, extra_args, figure = TESTS[item.bench]
        args = ["-t", test, "-s", str(item.size), "-n", str(item.iters * plan.samples),
                "-w", str(item.warmup),
                *(a.format(window=plan.window) for a in extra_args)]
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError(f"ucx_perftest: not done after {timeout:g} s (--timeout)")
        fig = run_one(cmd, env, args, left, cores)
        if fig is None or len(fig) < 8:
            failed.append(f"{item.bench} {item.size}")
        else:
            _iters, lat50, _avg, _overall, _bw_avg, bw, _rate_avg, rate = fig[:8]
            if figure == "lat":
                per_op = lat50 * 1e-6
            elif figure == "bw":
                per_op = item.size / (bw * (1 << 20)) if bw > 0 else float("inf")
            else:
                per_op = 1.0 / rate if rate > 0 else float("inf")
            out.results[(item.bench, item.size)] = [per_op]
        on_result(item.bench, item.size)
    if failed:
        out.meta["failed"] = ", ".join(failed)
    return out
