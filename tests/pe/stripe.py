"""Two rails: large puts/gets are split across both, small ones stay on one rail per PE."""

from __future__ import annotations

import numpy as np
from _common import check, data

from vkshmem import shmem

rt = shmem._state.rt
me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
check(len(rt.routing.rails) == 2, f"two rails configured, got {len(rt.routing.rails)}")
big = shmem.zeros(1 << 18, np.float64)  # 2 MiB: above the stripe threshold
payload = data(np.float64, 1 << 18, seed=me)
stripes = rt.routing.stripes[right]
if rt.routing.routes[right].name != "shm":
    check(stripes is not None and len(stripes) == 2, "the peer is reached on both rails")
before = [t.server_stats()["requests"] for t in rt.routing.transports
          if hasattr(t, "server_stats")]
for _ in range(3):
    shmem.put(big, payload, right)
shmem.barrier_all()
check(np.array_equal(big, data(np.float64, 1 << 18, seed=left)), "striped put")
out = np.empty_like(big)
shmem.get(out, big, right)
check(np.array_equal(out, payload), "striped get")
small = shmem.zeros(4, np.int64)
shmem.put(small, np.arange(4, dtype=np.int64) + me, right)
shmem.fence()
shmem.atomic_add(small[:1], 10, right)
shmem.barrier_all()
check(int(small[0]) == left + 10 and (small[1:] == np.arange(1, 4) + left).all(), "small")
after = [t.server_stats()["requests"] for t in rt.routing.transports if hasattr(t, "server_stats")]
if rt.routing.routes[left].name != "shm" and len(after) == 2:
    grew = [a - b for a, b in zip(after, before, strict=True)]
    check(all(g > 0 for g in grew), f"both rails served requests: {grew}")
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in rt.routing.routes})}")
print(f"stripe ok: {n} PEs")
