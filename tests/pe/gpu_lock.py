"""Locks whose word lies in GPU memory (``new_lock(domain='gpu')``, ``Lock(domain='gpu')``):
mutual exclusion under contention (a non-atomic counter in GPU memory on another PE stays
exact), several locks spread over owners, test_lock (False = acquired, True while another
PE holds it), the Lock class, a timed-out wait that withdraws its ticket, and the argument
errors. The same script runs with the peers' heaps imported, through the domain proxy
(VKSHMEM_DOMAIN_IMPORT=0) and over hostproxy (VKSHMEM_SHM=0)."""

from __future__ import annotations

import time

import numpy as np
from _common import check

from vkshmem import InvalidArgumentError, WaitTimeoutError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
ITERS = 40

# -- contention: get + put of a GPU counter on the last PE inside a GPU lock --------------------
lock = shmem.new_lock(domain="gpu")
check(lock.dtype == np.int64 and lock.size == 1 and not lock.to_numpy().any(), "new_lock")
counter = shmem.zeros(1, np.int64, domain="gpu")
tmp = np.zeros(1, np.int64)
last = n - 1
shmem.barrier_all()
for _ in range(ITERS):
    shmem.set_lock(lock)
    shmem.get(tmp, counter, last)
    time.sleep(0)  # let the others run: a broken lock loses increments
    tmp += 1
    shmem.put(counter, tmp, last)
    shmem.clear_lock(lock)
shmem.barrier_all()
if me == last:
    got = int(counter.to_numpy()[0])
    check(got == ITERS * n, f"counter {got} != {ITERS * n}")

# -- several locks (owners spread over the PEs), the Lock class, non-blocking acquire -------------
boxes = [shmem.Lock(domain="gpu") for _ in range(3)]
owners = sorted({b.owner for b in boxes})
counts = shmem.zeros(3, np.int64)  # host counters on PE 0, one per lock
shmem.barrier_all()
for i in range(ITERS // 2):
    k = (i + me) % 3
    box = boxes[k]
    if i % 2:
        while not box.acquire(blocking=False):
            time.sleep(0)
        try:
            shmem.get(tmp, counts[k:k + 1], 0)
            shmem.put(counts[k:k + 1], tmp + 1, 0)
        finally:
            box.release()
    else:
        with box:
            shmem.get(tmp, counts[k:k + 1], 0)
            shmem.put(counts[k:k + 1], tmp + 1, 0)
shmem.barrier_all()
if me == 0:
    check(int(counts.sum()) == (ITERS // 2) * n, f"Lock counters {counts}")

# -- test_lock while another PE holds it; a wait that times out withdraws its ticket ----------
probe = shmem.new_lock(domain="gpu")
held = shmem.zeros(1, np.int64)
shmem.barrier_all()
if me == 0:
    check(not shmem.test_lock(probe), "test_lock on a free lock acquires it (returns False)")
    shmem.atomic_set(held, 1, last)  # tells the last PE that the lock is held
if me == last and n > 1:
    shmem.wait_until(held, shmem.CMP.EQ, 1)
    check(shmem.test_lock(probe), "test_lock while PE 0 holds the lock returns True")
    rt = shmem._state.rt
    saved, rt.waiter.timeout = rt.waiter.timeout, 0.2
    try:
        shmem.set_lock(probe)
        raise AssertionError(f"PE {me}: set_lock on a held lock did not time out")
    except WaitTimeoutError as exc:
        check("did not happen within" in str(exc), str(exc))
    finally:
        rt.waiter.timeout = saved
shmem.barrier_all()
if me == 0:
    shmem.clear_lock(probe)
shmem.barrier_all()
shmem.set_lock(probe)  # the withdrawn ticket does not block the queue
shmem.clear_lock(probe)
shmem.barrier_all()

# -- argument errors ---------------------------------------------------------------------------
for bad, why in ((shmem.zeros(2, np.int64, domain="gpu"), "one 64-bit integer word"),
                 (shmem.zeros(1, np.int32, domain="gpu"), "one 64-bit integer word")):
    try:
        shmem.set_lock(bad)
        raise AssertionError(f"PE {me}: set_lock({bad!r}) did not raise")
    except InvalidArgumentError as exc:
        check(why in str(exc), str(exc))
try:
    shmem.clear_lock(lock)
    raise AssertionError(f"PE {me}: clear_lock of a lock not held did not raise")
except InvalidArgumentError as exc:
    check("does not hold" in str(exc), str(exc))
shmem.barrier_all()
for b in boxes:
    b.destroy()
shmem.del_lock(lock)
shmem.del_lock(probe)
print(f"PE {me}: gpu locks owned by {owners} ok", flush=True)
print("gpu_lock ok", flush=True)
shmem.finalize()
