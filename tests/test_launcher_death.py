"""PEs end promptly when part of the job dies: under ``env``, every survivor of a killed rank 0
(which hosted the store) exits within 1 s of raising PeerFailedError; under ``mpirun``, the PEs
end within seconds when mpirun itself is killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bootstrap import _mpirun_cmd, clean_env

pytestmark = pytest.mark.timeout(180)

SURVIVOR = """
import os, signal, sys, time
from vkshmem import shmem
me = shmem.my_pe()
shmem.barrier_all()
if me == 0:
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    while True:
        shmem.barrier_all()
        time.sleep(0.005)
except Exception as exc:
    print(f"raised {type(exc).__name__} {time.monotonic():.6f}", flush=True)
    raise
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("n", [2, 4])
def test_env_survivors_of_rank_0_exit_within_a_second(tmp_path: Path, n: int) -> None:
    script = tmp_path / "survivor.py"
    script.write_text(SURVIVOR)
    port = _free_port()
    procs = []
    for rank in range(n):
        env = clean_env(RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port), VKSHMEM_JOB_SECRET="s" * 32,
                        VKSHMEM_SYMMETRIC_SIZE="16M")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    ended: dict[int, float] = {}
    deadline = time.monotonic() + 120
    while len(ended) < n and time.monotonic() < deadline:
        for rank, p in enumerate(procs):
            if rank not in ended and p.poll() is not None:
                ended[rank] = time.monotonic()
        time.sleep(0.005)
    for p in procs:
        if p.poll() is None:
            p.kill()
    outs = [p.communicate(timeout=30) for p in procs]
    assert procs[0].returncode == -signal.SIGKILL, outs[0]
    for rank in range(1, n):
        out, err = outs[rank]
        lines = [ln for ln in out.splitlines() if ln.startswith("raised ")]
        assert lines and "PeerFailedError" in lines[0], out + err
        raised = float(lines[0].split()[-1])
        assert rank in ended, f"rank {rank} did not end"
        assert ended[rank] - raised < 1.0, \
            f"rank {rank} took {ended[rank] - raised:.2f} s to exit after raising\n{err}"


LINGER = """
import os, sys, time
from vkshmem import shmem
shmem.barrier_all()
open(sys.argv[1] + f".{shmem.my_pe()}", "w").write(str(os.getpid()))
try:
    time.sleep(120)
finally:
    print("finally ran", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_pes_end_when_mpirun_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "linger.py"
    script.write_text(LINGER)
    marks = tmp_path / "pid"
    cmd = [*_mpirun_cmd(2), sys.executable, str(script), str(marks)]
    shm_before = set(Path("/dev/shm").glob("sm_segment.*"))  # Open MPI's own segments
    launcher = subprocess.Popen(cmd, env=clean_env(VKSHMEM_BOOTSTRAP="mpi"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(pids) < 2:
            pids = [int(p.read_text()) for p in tmp_path.glob("pid.*") if p.read_text()]
            time.sleep(0.1)
        assert len(pids) == 2, "the PEs did not start"
        launcher.kill()  # SIGKILL: mpirun cannot end its PEs itself
        launcher.wait(timeout=30)
        gone = time.monotonic() + 6
        while time.monotonic() < gone and any(_alive(p) for p in pids):
            time.sleep(0.05)
        left = [p for p in pids if _alive(p)]
        assert not left, f"PEs {left} still run 6 s after mpirun died"
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
        # a killed mpirun leaves its shared-memory segments behind: not vkshmem's, but this
        # test made them
        for seg in set(Path("/dev/shm").glob("sm_segment.*")) - shm_before:
            seg.unlink(missing_ok=True)
