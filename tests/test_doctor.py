"""``vkshmem doctor``: real 2-PE jobs over every installed transport and domain, a check made
to fail for real (an unknown libfabric provider), a check past its time limit, and the exit
status rules (a failed check, a named check that cannot run, an unknown name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vkshmem.core.config import load
from vkshmem.core.plugins.loader import load_plugins


def doctor(*args: str, env: dict[str, str] | None = None,
           timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vkshmem", "doctor", *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def rows(r: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in json.loads(r.stdout)["results"]}


def test_everything_installed_works() -> None:
    r = doctor("--json")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(r)
    installed = load_plugins(load())
    here = [t for t, spec in installed.transports.items()
            if spec.available is None or spec.available()]
    for name in ["shm", *here, "env"]:
        assert got[name]["status"] == "ok", got[name]
        assert "put 8 B + quiet" in got[name]["detail"], got[name]
    for name in set(installed.transports) - set(here):  # e.g. verbs without an RDMA device
        assert got[name]["status"] == "unavailable" and got[name]["detail"], got[name]
    if "vulkan" in installed.domains:  # CI: lavapipe, with the validation layer installed
        for name in ("vulkan", "vulkan-import", "validation"):
            assert got[name]["status"] == "ok", got[name]
        assert "direct, direct" in got["vulkan"]["detail"]
    for row in got.values():
        assert row["hint"], row  # every row names what would change it
    # progress went to stderr, one line per check that ran
    assert "[1/" in r.stderr and "shm (same-node load/store) ... ok" in r.stderr


def test_a_broken_transport_fails_and_says_what_to_change() -> None:
    if "ofi" not in load_plugins(load()).transports:
        pytest.skip("vkshmem-ofi is not installed")
    r = doctor("ofi", "shm", env={"VKSHMEM_OFI_PROVIDER": "no-such-provider"})
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    ofi = next(i for i, line in enumerate(lines) if line.startswith("transport ofi"))
    assert " fail " in lines[ofi] and "no-such-provider" in lines[ofi], r.stdout
    assert "VKSHMEM_OFI_PROVIDER" in lines[ofi + 1], r.stdout  # the hint line
    assert any(line.startswith("shm ") and " ok " in line for line in lines), r.stdout
    assert "not working: ofi" in r.stdout


def test_a_check_past_its_time_limit_fails_and_leaves_nothing() -> None:
    before = set(os.listdir("/proc"))
    r = doctor("shm", "--json", "--timeout", "0.3", timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert rows(r)["shm"]["status"] == "fail"
    assert "timed out" in rows(r)["shm"]["detail"]
    left = []
    for pid in set(os.listdir("/proc")) - before:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_doctor_pe.py" in f.read():
                    left.append(pid)
        except OSError:
            pass
    assert not left, f"probe processes left behind: {left}"


def test_named_checks_must_run() -> None:
    if "cuda" in load_plugins(load()).domains:
        pytest.skip("vkshmem-cuda is installed here")
    r = doctor("cuda", "--json", "-q")
    assert r.returncode == 1 and r.stderr == ""
    assert rows(r)["cuda"]["status"] == "missing"
    assert "pip install 'vkshmem[cuda]'" in rows(r)["cuda"]["hint"]
    r = doctor("no-such-check")
    assert r.returncode == 2 and "unknown check(s) no-such-check" in r.stderr
