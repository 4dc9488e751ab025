"""``vkshmem run``: exit codes, failure handling, output forwarding, signals, the CLI."""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from vkshmem import _cli

PE_DIR = Path(__file__).parent / "pe"
FAIL = str(PE_DIR / "boot_fail.py")
SUB_TIMEOUT = 30
_JOB_VARS = re.compile(r"^(VKSHMEM_|RANK$|WORLD_SIZE$|MASTER_|SLURM_|OMPI_|PMIX_|PMI_)")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _JOB_VARS.match(k)}
    env["VKSHMEM_PLUGINS_ALLOW"] = "builtin"  # bootstrap only: no transport plugin needed
    env.update(extra)
    return env


def vkshmem_run(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vkshmem", "run", *args], capture_output=True,
                          text=True, timeout=SUB_TIMEOUT, env=clean_env(), cwd=cwd)


def ready_pids(stdout: str) -> list[int]:
    return [int(m) for m in re.findall(r"ready (\d+)", stdout)]


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie, waiting for a parent that does not reap, is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_dead(pids: list[int], limit: float) -> list[int]:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def wait_ready(proc: subprocess.Popen[bytes], n: int, limit: float = 20) -> list[int]:
    """Read the launcher's stdout until n PEs said ready; return their pids."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b""
    end = time.monotonic() + limit
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while len(ready_pids(buf.decode())) < n:
            assert time.monotonic() < end, f"PEs not ready: {buf!r}"
            if sel.select(0.2):
                buf += proc.stdout.read() or b""
    return ready_pids(buf.decode())


# --------------------------------------------------------------------------------------------
# Normal runs, output, environment
# --------------------------------------------------------------------------------------------

def test_success_and_prefixed_output() -> None:
    proc = vkshmem_run("-n", "2", FAIL, "ok")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    for r in range(2):
        assert f"[pe {r}] hello from {r} of 2" in out
        assert f"[pe {r}] no newline from {r}" in out  # a last line without newline
        assert f"[pe {r}] err line from {r}" in proc.stderr.splitlines()
    assert "vkshmem run:" not in proc.stderr


def test_no_prefix() -> None:
    proc = vkshmem_run("-n", "2", "--no-prefix", FAIL, "ok")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted(
        [f"hello from {r} of 2" for r in range(2)] + [f"no newline from {r}" for r in range(2)])
    assert "[pe" not in proc.stdout + proc.stderr


def test_environment_contract() -> None:
    runs = [vkshmem_run("-n", "3", "--no-prefix", FAIL, "env") for _ in range(2)]
    job_ids = []
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
        envs = sorted((json.loads(line) for line in proc.stdout.splitlines()),
                      key=lambda e: int(e["VKSHMEM_PE"]))
        assert [e["VKSHMEM_PE"] for e in envs] == ["0", "1", "2"]
        assert {e["VKSHMEM_NPES"] for e in envs} == {"3"}
        assert {e["PYTHONUNBUFFERED"] for e in envs} == {"1"}
        assert len({e["VKSHMEM_JOB_ID"] for e in envs}) == 1
        assert len({e["VKSHMEM_LAUNCHER"] for e in envs}) == 1
        assert re.fullmatch(r"127\.0\.0\.1:\d+", envs[0]["VKSHMEM_LAUNCHER"])
        job_ids.append(envs[0]["VKSHMEM_JOB_ID"])
    assert job_ids[0] != job_ids[1]


def test_processes_left_behind_by_pes_are_ended() -> None:
    start = time.monotonic()
    proc = vkshmem_run("-n", "2", FAIL, "leave-child")
    assert proc.returncode == 0, proc.stderr
    pids = ready_pids(proc.stdout)
    assert len(pids) == 2
    assert wait_dead(pids, 2) == []
    assert time.monotonic() - start < 10


def test_script_arguments_and_double_dash() -> None:
    proc = vkshmem_run("-n", "1", "--no-prefix", "--", FAIL, "argv", "-n", "5", "--x")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["-n", "5", "--x"]


def test_module_mode(tmp_path: Path) -> None:
    (tmp_path / "vkshmem_test_mod.py").write_text(
        "import os, sys\nprint(os.environ['VKSHMEM_PE'], sys.argv[1:])\n")
    proc = vkshmem_run("-n", "2", "--no-prefix", "-m", "vkshmem_test_mod", "--flag", "-n", "3",
                       cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"{r} ['--flag', '-n', '3']" for r in range(2)]


def test_console_script() -> None:
    exe = Path(sys.executable).parent / "vkshmem"
    if not exe.exists():
        pytest.skip("the vkshmem console script is not installed next to this interpreter")
    proc = subprocess.run([str(exe), "run", "-n", "2", FAIL, "ok"], capture_output=True,
                          text=True, timeout=SUB_TIMEOUT, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "[pe 1] hello from 1 of 2" in proc.stdout


# --------------------------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------------------------

def test_exit_code_of_the_failing_pe_is_propagated() -> None:
    proc = vkshmem_run("-n", "4", FAIL, "exit", "3")
    assert proc.returncode == 3
    assert "PE 3 exited with code 3" in proc.stderr


def test_a_raising_pe_ends_the_others() -> None:
    start = time.monotonic()
    proc = vkshmem_run("-n", "4", FAIL, "raise")
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    assert "PE 1 exited with code 1 (ValueError: boom from pe 1)" in proc.stderr, proc.stderr
    assert "[pe 1] ValueError: boom from pe 1" in proc.stderr
    assert "ending the other PEs (0, 2, 3)" in proc.stderr
    pids = ready_pids(proc.stdout)
    assert len(pids) == 3
    assert wait_dead(pids, 1) == []
    assert elapsed < 30  # bounded: start-up of 4 PEs on a loaded 2-core machine takes seconds


def test_a_pe_killed_by_a_signal() -> None:
    proc = vkshmem_run("-n", "3", FAIL, "signal")
    assert proc.returncode == 128 + signal.SIGKILL
    assert "PE 1 was killed by signal 9 (SIGKILL" in proc.stderr, proc.stderr
    assert wait_dead(ready_pids(proc.stdout), 1) == []


def test_a_reported_failure_names_the_reason() -> None:
    proc = vkshmem_run("-n", "3", FAIL, "report")
    assert proc.returncode == 7  # the reporter's own exit code
    assert "PE 1 failed: RuntimeError: custom reason 42" in proc.stderr, proc.stderr
    assert "[pe 1] PE 1 is about to fail" in proc.stderr
    assert wait_dead(ready_pids(proc.stdout), 1) == []


def test_a_reporter_that_hangs_is_ended_after_the_grace_period() -> None:
    start = time.monotonic()
    proc = vkshmem_run("-n", "2", "--grace", "0.5", FAIL, "report-hang")
    assert proc.returncode == 1
    assert "PE 1 failed: RuntimeError: reported, then hung" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 10
    assert wait_dead(ready_pids(proc.stdout), 1) == []


def test_global_exit_status() -> None:
    proc = vkshmem_run("-n", "3", FAIL, "abort")
    assert proc.returncode == 5
    assert "PE 1 called global_exit(5)" in proc.stderr, proc.stderr
    assert wait_dead(ready_pids(proc.stdout), 1) == []


@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_pe_rejoins_the_store_after_closing(n: int) -> None:
    """Re-initialisation (OpenSHMEM 1.6) at the bootstrap: each PE closes and opens again."""
    proc = vkshmem_run("-n", str(n), FAIL, "rejoin")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(n):
        assert f"rejoined {rank} generation 1" in proc.stdout, proc.stdout


def test_a_rejoin_after_a_dropped_connection_ends_the_job() -> None:
    """A PE whose connection died without a goodbye is refused when it opens again, and the
    launcher ends the job for it even though its process lives on."""
    start = time.monotonic()
    proc = vkshmem_run("-n", "3", FAIL, "drop-rejoin")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"PE 1 failed: PE 1 cannot join again: its previous connection "
                     r"\(generation 0, process \d+\) ended without a goodbye", proc.stderr), \
        proc.stderr
    assert time.monotonic() - start < 15
    assert wait_dead(ready_pids(proc.stdout), 1) == []


def test_a_pe_that_exits_instead_of_rejoining_is_named_at_once() -> None:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "vkshmem", "run", "-n", "3", FAIL,
                           "rejoin-exit"], capture_output=True, text=True, timeout=SUB_TIMEOUT,
                          env=clean_env(VKSHMEM_BOOTSTRAP_TIMEOUT="25"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "PE 1 will not take part: its process exited after it finalized (generation 0); " \
           "it did not initialise again" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 15  # not the bootstrap timeout


def test_a_pe_killed_between_finalize_and_init_ends_the_job() -> None:
    proc = vkshmem_run("-n", "3", FAIL, "rejoin-die")
    assert proc.returncode == 128 + signal.SIGKILL, proc.stdout + proc.stderr
    assert "PE 1 was killed by signal 9 (SIGKILL" in proc.stderr, proc.stderr
    assert wait_dead(ready_pids(proc.stdout), 1) == []


def test_timeout() -> None:
    start = time.monotonic()
    proc = vkshmem_run("-n", "2", "--timeout", "1", FAIL, "sleep")
    assert proc.returncode == 124
    assert "ran past --timeout 1 s" in proc.stderr, proc.stderr
    assert 0.9 < time.monotonic() - start < 10
    assert wait_dead(ready_pids(proc.stdout), 1) == []


def test_pes_ignoring_sigterm_get_sigkill() -> None:
    start = time.monotonic()
    proc = vkshmem_run("-n", "2", "--timeout", "1", "--grace", "0.5", FAIL, "stubborn")
    assert proc.returncode == 124
    assert "did not end within 0.5 s of SIGTERM; sent SIGKILL" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 10
    assert wait_dead(ready_pids(proc.stdout), 1) == []


# --------------------------------------------------------------------------------------------
# Signals to the launcher
# --------------------------------------------------------------------------------------------

def _start_launcher(n: int, mode: str = "sleep") -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "vkshmem", "run", "-n", str(n), FAIL, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_the_launcher_ends_every_pe(sig: signal.Signals, code: int) -> None:
    launcher = _start_launcher(3)
    try:
        pids = wait_ready(launcher, 3)
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=SUB_TIMEOUT)
        assert launcher.returncode == code
        assert f"interrupted by {sig.name}" in err.decode()
        assert wait_dead(pids, 1) == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_pes_die_with_a_killed_launcher() -> None:
    launcher = _start_launcher(2)
    try:
        pids = wait_ready(launcher, 2)
        launcher.kill()
        launcher.wait(SUB_TIMEOUT)
        assert wait_dead(pids, 5) == [], "PEs outlived their launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for stream in (launcher.stdout, launcher.stderr):
            if stream is not None:
                stream.close()


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["-n", "0", "x.py"], "at least 1"),
    (["-n", "two", "x.py"], "not a whole number"),
    (["x.py"], "-n/--npes"),
    (["-n", "2"], "nothing to run"),
    (["-n", "2", "no_such_script.py"], "not found"),
    (["-n", "2", "--timeout", "0", FAIL], "more than 0"),
])
def test_bad_arguments(args: list[str], message: str) -> None:
    proc = vkshmem_run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr


def test_help_is_helpful() -> None:
    top = subprocess.run([sys.executable, "-m", "vkshmem", "--help"], capture_output=True,
                         text=True, timeout=SUB_TIMEOUT)
    assert top.returncode == 0
    assert "vkshmem run -n 4 script.py" in top.stdout and "info" in top.stdout
    run = subprocess.run([sys.executable, "-m", "vkshmem", "run", "--help"],
                         capture_output=True, text=True, timeout=SUB_TIMEOUT)
    assert run.returncode == 0
    for needle in ("examples:", "VKSHMEM_LAUNCHER", "VKSHMEM_PE", "VKSHMEM_NPES",
                   "VKSHMEM_JOB_ID", "VKSHMEM_BOOTSTRAP_TIMEOUT", "exit status", "124",
                   "--timeout", "--no-prefix", "-m MODULE", "mpirun"):
        assert needle in run.stdout, needle
    bare = subprocess.run([sys.executable, "-m", "vkshmem"], capture_output=True, text=True,
                          timeout=SUB_TIMEOUT)
    assert bare.returncode == 2 and "usage:" in bare.stderr


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "-n", "2", "s.py", "-m", "x"], ["run", "-n", "2", "s.py", "-m", "x"]),
    (["run", "-n", "2", "-m", "mod", "-n", "1"], ["run", "-n", "2", "--module", "mod", "--",
                                                  "-n", "1"]),
    (["run", "-mmod", "a"], ["run", "--module", "mod", "--", "a"]),
    (["run", "--module=mod", "--", "a"], ["run", "--module=mod", "--", "a"]),
    (["run", "--timeout", "5", "-m", "mod"], ["run", "--timeout", "5", "--module", "mod", "--"]),
    (["info", "-m", "x"], ["info", "-m", "x"]),
])
def test_module_arguments_are_split_before_parsing(argv: list[str],
                                                   expected: list[str]) -> None:
    assert _cli._split_module(argv) == expected


def test_info_imports_its_module_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []

    def fake_main(args: argparse.Namespace) -> int:
        seen.append(args)
        return 3

    monkeypatch.setitem(sys.modules, "vkshmem._info",
                        types.SimpleNamespace(main=fake_main))  # type: ignore[arg-type]
    import vkshmem

    monkeypatch.setattr(vkshmem, "_info", sys.modules["vkshmem._info"], raising=False)
    assert _cli.main(["info", "-n", "2"]) == 3
    assert seen[0].npes == 2
    assert _cli.main(["info"]) == 3
    assert seen[1].npes == 1
