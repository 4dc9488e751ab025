"""The shm provider's endpoint files are named after the job and removed by ``vkshmem run``
when the job ends, also those of a PE killed with SIGKILL (tests/pe/ofi_shm_names.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_multipe import MODES, launch

pytest.importorskip("vkshmem_ofi")


def _ours() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("vkshmem-*")}


def test_shm_endpoint_files_named_after_the_job_and_removed() -> None:
    before = _ours()
    r = launch("ofi_shm_names", 2, MODES["ofi-shm"], timeout=60)
    assert r.returncode != 0, r.stdout  # PE 1 was killed
    assert "PE 1 " in r.stderr and ("SIGKILL" in r.stderr or "signal 9" in r.stderr), r.stderr
    assert r.stdout.count("vkshmem-") >= 2, r.stdout  # both PEs saw their named files
    assert _ours() - before == set(), "files left in /dev/shm after the job"
