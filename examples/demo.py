"""vkshmem demo: a ring exchange and a distributed counter with atomics, then the same on the
symmetric GPU heap (Vulkan; lavapipe where there is no GPU) and a reduction on the GPU.

Run it with ``vkshmem run -n 4 examples/demo.py`` (or plain ``python examples/demo.py`` for one
PE). Each PE prints what it did.
"""

from __future__ import annotations

import numpy as np

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
routes = sorted({r.name for r in shmem._state.rt.routing.routes})
print(f"PE {me} of {n}: up, reaching its peers through {', '.join(routes)}")

# 1. Ring exchange: every PE puts a message into its right neighbour's symmetric array.
inbox = shmem.zeros(4, np.int64)
shmem.put(inbox, np.array([me, me * 10, me * 100, 42], np.int64), right)
shmem.barrier_all()
print(f"PE {me}: put [{me}, {me * 10}, {me * 100}, 42] into PE {right}; "
      f"received {inbox.tolist()} from PE {left}")

# 2. A distributed counter on PE 0: every PE takes tickets with atomic fetch-and-increment.
counter = shmem.zeros(1, np.int64)
tickets = [shmem.atomic_fetch_inc(counter, 0) for _ in range(5)]
print(f"PE {me}: took tickets {tickets} from the counter on PE 0")
shmem.barrier_all()

# 3. Every PE reads the final count with an atomic fetch; all tickets were distinct.
total = shmem.atomic_fetch(counter, 0)
all_tickets = shmem.zeros(5 * n, np.int64)
for pe in range(n):
    shmem.put(all_tickets[5 * me:5 * me + 5], np.array(tickets, np.int64), pe)
shmem.barrier_all()
distinct = len(set(all_tickets.tolist())) == 5 * n
print(f"PE {me}: counter on PE 0 = {total} (expected {5 * n}); "
      f"tickets distinct across PEs: {distinct}")
if total != 5 * n or not distinct:
    raise SystemExit(f"PE {me}: the distributed counter is wrong")

# 4. GPU memory: the ring again, CPU -> GPU into the neighbour's Vulkan heap, GPU -> GPU back,
#    a counter that is a shader atomic, and an all-reduce computed on the GPU.
try:
    gbox = shmem.zeros(4, np.int64, domain="gpu")
except Exception as exc:  # no Vulkan driver or binding: say so, the CPU part has run
    print(f"PE {me}: no GPU domain here ({exc})")
    raise SystemExit(0) from None
dev = gbox.domain.device
shmem.put(gbox, np.array([me, 1, 2, 3], np.int64), right)
shmem.barrier_all()
echo = shmem.zeros(4, np.int64, domain="gpu")
shmem.get(echo, gbox, right)  # GPU -> GPU: our own message, back from the right neighbour
gcount = shmem.zeros(1, np.int64, domain="gpu")
for _ in range(3):
    shmem.atomic_fetch_inc(gcount, 0)
vec = shmem.array(np.full(8, me + 1, np.float32), domain="gpu")
shmem.sum_reduce(vec, vec)
shmem.barrier_all()
got, back, count = gbox.to_numpy().tolist(), echo.to_numpy().tolist(), int(gcount[0])
print(f"PE {me} on {dev.name}: GPU inbox {got} (from PE {left}), echo {back}, "
      f"reduced {vec.to_numpy()[0]:g} (expected {n * (n + 1) / 2:g})")
if got[0] != left or back[0] != me or vec.to_numpy()[0] != n * (n + 1) / 2 or (
        me == 0 and count != 3 * n):
    raise SystemExit(f"PE {me}: the GPU part is wrong")
if me == 0:
    print(f"PE 0: GPU counter = {count} (expected {3 * n})")
