"""Multi-PE failure detection: one PE (the victim) dies while the others block.

Environment (set by tests/test_liveness.py):

``LV_HOW``
    ``kill`` (the victim SIGKILLs itself) or ``raise`` (an uncaught exception).
``LV_OP``
    what the survivors block in: ``barrier`` (barrier_all), ``wait_until`` (on a local word
    nobody sets), ``get`` (gets from the victim, in a loop: they must raise once the failure is
    known instead of returning its stale memory), ``collective`` (sum_reduce over the world
    team) or ``lock`` (set_lock on a lock the victim holds).
``LV_VICTIM``
    the victim's rank (taken modulo the number of PEs; default: the last PE).

Every PE prints ``PID <rank> <pid>``; a survivor prints ``DETECTED pe=<rank> failed=<pe>
after=<seconds since the victim's death> reason=<reason>`` and lets the PeerFailedError end it
(a non-zero exit), or prints ``NOT DETECTED`` and exits 3.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

from vkshmem import PeerFailedError, shmem

DELAY = 0.3  # the victim dies this long after the common barrier
LIMIT = 20.0  # a survivor gives up (NOT DETECTED) after this long


def main() -> None:
    how = os.environ.get("LV_HOW", "kill")
    op = os.environ.get("LV_OP", "barrier")
    me, n = shmem.my_pe(), shmem.n_pes()
    victim = int(os.environ.get("LV_VICTIM", str(n - 1))) % n
    print(f"PID {me} {os.getpid()}", flush=True)
    ivar = shmem.zeros(1, np.int64)
    src = shmem.full(64, me, np.int64)
    dst = shmem.zeros(64, np.int64)
    lock = shmem.new_lock()
    if me == victim and op == "lock":
        shmem.set_lock(lock)
    shmem.barrier_all()
    start = time.monotonic()
    if me == victim:
        time.sleep(DELAY)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"planned failure of PE {me}")
    if op == "lock":
        time.sleep(0.05)
    try:
        if op == "barrier":
            shmem.barrier_all()
        elif op == "wait_until":
            shmem.wait_until(ivar, shmem.CMP.EQ, 1)
        elif op == "collective":
            shmem.sum_reduce(dst, src)
        elif op == "lock":
            shmem.set_lock(lock)
        elif op == "get":
            local = np.zeros(64, np.int64)
            while time.monotonic() - start < LIMIT:
                shmem.get(local, src, victim)
                assert int(local[0]) == victim, local[:4]
                time.sleep(0.002)
        else:
            raise SystemExit(f"unknown LV_OP {op!r}")
    except PeerFailedError as exc:
        after = time.monotonic() - start - DELAY
        print(f"DETECTED pe={me} failed={exc.pe} after={after:.3f} reason={exc.reason}",
              flush=True)
        raise
    print(f"NOT DETECTED pe={me} op={op}", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main()
