"""OpenSHMEM 1.6 re-initialisation after the last ``finalize``: allocate and communicate,
finalize, ``init`` again, allocate and communicate again (RMA, an AMO, a reduction, a team
split), three times over, asserting each time that data really moved between the PEs.

Every PE re-initialises, in the same order (OpenSHMEM's rule for collective calls). Under
``vkshmem run`` (bootstrap ``local``), torchrun-style variables (``env``) and ``mpirun``
(``mpi``) alike. Prints ``routes: [...]`` and ``reinit ok: N PEs`` on success.
"""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import InvalidArgumentError, shmem

ROUNDS = 3


def communicate(k: int) -> list[str]:
    """Symmetric allocation and traffic of runtime number ``k``; returns the routes taken."""
    me, n = shmem.my_pe(), shmem.n_pes()
    right, left = (me + 1) % n, (me - 1) % n
    check(shmem.query_initialized(), f"runtime {k}: initialised")
    # A put to the right neighbour, then a get from the left one.
    dst = shmem.zeros(1000, np.int64)
    src = np.arange(1000, dtype=np.int64) * (k + 1) + 1000 * me
    shmem.put(dst, src, right)
    shmem.barrier_all()
    want = np.arange(1000, dtype=np.int64) * (k + 1) + 1000 * left
    check(np.array_equal(dst, want), f"runtime {k}: put from PE {left}: {dst[:4]}")
    got = np.zeros(1000, np.int64)
    shmem.get(got, dst, left)
    want_left = np.arange(1000, dtype=np.int64) * (k + 1) + 1000 * ((left - 1) % n)
    check(np.array_equal(got, want_left), f"runtime {k}: get from PE {left}: {got[:4]}")
    # An atomic add from every PE onto PE 0.
    counter = shmem.zeros(1, np.int64)
    shmem.atomic_add(counter, me + 1 + k, 0)
    shmem.barrier_all()
    if me == 0:
        total = sum(pe + 1 + k for pe in range(n))
        check(int(counter[0]) == total, f"runtime {k}: atomic adds {int(counter[0])} != {total}")
    # A reduction over TEAM_WORLD and one over a team split off it.
    vals = shmem.full(4, me + 10 * k, np.int64)
    sums = shmem.zeros(4, np.int64)
    shmem.sum_reduce(sums, vals)
    check((sums == sum(range(n)) + 10 * k * n).all(), f"runtime {k}: sum_reduce {sums}")
    team = shmem.TEAM_WORLD.split_strided(0, 1, n)
    check(team.my_pe() == me and team.n_pes() == n, f"runtime {k}: split team")
    team.destroy()
    routes = sorted({r.name for r in shmem._state.rt.routing.routes})
    for arr in (sums, vals, counter, dst):
        shmem.free(arr)
    return routes


routes = communicate(0)
for k in range(1, ROUNDS):
    kept = shmem.TEAM_WORLD.split_strided(0, 1, shmem.n_pes())  # dies with the runtime
    shmem.finalize()  # matches the import's init: the last finalize
    check(not shmem.query_initialized(), f"finalize {k}: still initialised")
    shmem.init()
    try:
        shmem.sync(kept)
    except InvalidArgumentError as exc:
        check("finalized" in str(exc), f"unclear error for a stale team: {exc}")
    else:
        check(False, "a team of a finalized runtime must be refused")
    again = communicate(k)
    check(again == routes, f"runtime {k} takes the routes {again}, runtime 0 took {routes}")
print(f"routes: {routes}")
print(f"reinit ok: {shmem.n_pes()} PEs")
