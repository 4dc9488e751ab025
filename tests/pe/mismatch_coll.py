"""With VKSHMEM_CHECK_COLLECTIVES=1, TEAM_WORLD collectives whose arguments differ across PEs
(another root, op, count or dtype, or another collective altogether) raise the same
InvalidArgumentError on every PE, and the job goes on: the next correct collective works."""

from __future__ import annotations

import os

import numpy as np
from _common import check

from vkshmem import InvalidArgumentError, shmem

assert os.environ.get("VKSHMEM_CHECK_COLLECTIVES") == "1"
me, n = shmem.my_pe(), shmem.n_pes()
t = shmem.zeros(8 * n, np.int64)
tf = shmem.zeros(8 * n, np.float64)
s = np.arange(8 * n, dtype=np.int64) + me
odd = me % 2 == 1  # the PEs that differ (none at 1 PE)

CASES = {
    "broadcast root": lambda: shmem.broadcast(t, s[:4], 1 if odd else 0),
    "reduce op": lambda: shmem.reduce(t, s[:4], "max" if odd else "sum"),
    "fcollect count": lambda: shmem.fcollect(t, s[:3 if odd else 2]),
    "alltoall count": lambda: shmem.alltoall(t, s, 2 if odd else 1),
    "scan count": lambda: shmem.sum_inscan(t, s, 3 if odd else 4),
    "reduce dtype": lambda: (shmem.sum_reduce(tf, s[:4].astype(np.float64)) if odd
                             else shmem.sum_reduce(t, s[:4])),
    "another collective": lambda: (shmem.fcollect(t, s[:1]) if odd
                                   else shmem.broadcast(t, s[:1], 0)),
}
ones = np.ones(4, np.int64)
for name, call in CASES.items():
    try:
        call()
    except InvalidArgumentError as exc:
        check(n > 1 and "collective mismatch" in str(exc) and "PE 1 called" in str(exc),
              f"{name}: {exc}")
    else:
        check(n == 1, f"{name}: a mismatch across {n} PEs was not detected")
    shmem.sum_reduce(t[:4], ones)  # the job goes on
    check((t[:4] == n).all(), f"after {name}: sum_reduce gave {t[:4]}")
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"mismatch_coll ok: {n} PEs")
