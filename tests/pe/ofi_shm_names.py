"""libfabric's shm provider names each endpoint's file under /dev/shm after the job
(``vkshmem-<VKSHMEM_JOB_ID>-<pe>-...``, vkshmem.core.shmnames), not after the pid (whose files,
left by a killed process, collide with a later process that gets the pid back); then PE 1 is
killed, and ``vkshmem run`` removes what it left (tests/test_ofi_shm_names.py checks)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from _common import check

from vkshmem import shmem

me = shmem.my_pe()
job = os.environ["VKSHMEM_JOB_ID"]
mine = sorted(p.name for p in Path("/dev/shm").glob(f"vkshmem-{job}-{me}-*"))
check(bool(mine), f"an endpoint file named after the job: {mine}")
print(f"PE {me}: {mine}", flush=True)
shmem.barrier_all()
if me == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # its endpoint's file stays behind
shmem.barrier_all()  # PE 0: PeerFailedError
