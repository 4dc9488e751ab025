"""Names of the shared-memory files under ``/dev/shm`` that a job's plugins create (libfabric's
shm provider names each endpoint's file after the endpoint): ``vkshmem-<job>-<pe>-...``, so
that ``vkshmem run`` can remove what a killed PE left behind (its signal handlers never ran)
when the job ends, and so that a file left by another job never collides with a new one (the
provider's default names reuse process ids)."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from pathlib import Path

__all__ = ["JOB_SHM_PREFIX", "job_shm_name", "remove_job_shm"]

JOB_SHM_PREFIX = "vkshmem-"
SHM_DIR = Path("/dev/shm")
_SERIAL = itertools.count()


def job_shm_name(pe: int) -> str:
    """A name for a shared-memory file of PE ``pe`` that no other process uses: the job's id
    (``VKSHMEM_JOB_ID``, set by ``vkshmem run``; else this process's id and a random token),
    the PE, this process and a serial number."""
    job = os.environ.get("VKSHMEM_JOB_ID") or f"{os.getpid()}-{secrets.token_hex(4)}"
    return f"{JOB_SHM_PREFIX}{job}-{pe}-{os.getpid()}-{next(_SERIAL)}"


def remove_job_shm(job_id: str) -> int:
    """Remove the files of job ``job_id`` left under ``/dev/shm``; how many there were."""
    removed = 0
    if not job_id or not SHM_DIR.is_dir():
        return 0
    for path in SHM_DIR.glob(f"{JOB_SHM_PREFIX}{job_id}-*"):
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
    return removed
