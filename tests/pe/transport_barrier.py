"""barrier_all, sync_all and a split team's sync over a transport with a C data path (UCX,
hostproxy): TEAM_WORLD is a NativeTeam (its barrier in C, its remote adds through the
transport's vk_native_ops), and the barriers still separate rounds: in round r every PE puts r
into its right neighbour's slot, and after the barrier every slot must read r. Expects
VKSHMEM_SHM=0 and one transport in VKSHMEM_TRANSPORTS."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import shmem

ROUNDS = 200

shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
right = (me + 1) % n
rt = shmem._state.rt
check(shmem.TEAM_WORLD.state.native is not None, "TEAM_WORLD has no NativeTeam")

slot = shmem.zeros(1, np.int64)
mine = np.zeros(1, np.int64)
for r in range(1, ROUNDS + 1):
    mine[0] = r
    shmem.put(slot, mine, right)
    shmem.barrier_all()
    check(int(slot[0]) == r, f"round {r}: slot {slot[0]} after the barrier")
    shmem.sync_all()  # nobody puts round r + 1 before everyone read round r

# a counter every PE adds to, read after sync_all (AMOs are complete once fetched: quiet first)
count = shmem.zeros(1, np.int64)
shmem.barrier_all()
for _ in range(20):
    shmem.atomic_add(count, 1, right)
shmem.barrier_all()
check(int(count[0]) == 20, f"count {count[0]}")

# a split team (even PEs) has its own native barrier
evens = shmem.TEAM_WORLD.split_strided(0, 2)
if me % 2 == 0:
    check(evens.state.native is not None, "the split team has no NativeTeam")
    for _ in range(50):
        evens.sync()
shmem.barrier_all()
print(f"routes: {sorted({t.name for t in rt.routing.routes})}")
print("transport_barrier ok")
