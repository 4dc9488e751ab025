"""Locks: mutual exclusion under contention (a non-atomic counter stays exact), FIFO grant
order, test_lock (False = acquired), the Lock class and its context manager, timeout and
Ctrl-C while waiting (the ticket is withdrawn), and argument errors."""

from __future__ import annotations

import signal
import time

import numpy as np
from _common import check

from vkshmem import InvalidArgumentError, WaitTimeoutError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
ITERS = 60

# -- contention: get + put of a counter on PE 0 inside the lock ----------------------------------
lock = shmem.new_lock()
check(lock.dtype == np.int64 and lock.size == 1 and not lock.any(), "new_lock")
counter = shmem.zeros(1, np.int64)
tmp = np.zeros(1, np.int64)
shmem.barrier_all()
for _ in range(ITERS):
    shmem.set_lock(lock)
    shmem.get(tmp, counter, 0)
    time.sleep(0)  # let the others run: a broken lock loses increments
    tmp += 1
    shmem.put(counter, tmp, 0)
    shmem.clear_lock(lock)
shmem.barrier_all()
if me == 0:
    check(int(counter[0]) == ITERS * n, f"counter {counter[0]} != {ITERS * n}")

# -- the Lock class: context manager and non-blocking acquire, on a counter on the last PE ------
box = shmem.Lock()
if me == box.owner:  # start 2 tickets before the 32-bit counters wrap around
    box.lock[0] = np.int64(-(1 << 32) - 2)  # next = serving = 2**32 - 2
last = n - 1
counter[0] = 0
shmem.barrier_all()
for i in range(ITERS // 2):
    if i % 2:
        while not box.acquire(blocking=False):
            time.sleep(0)
        try:
            shmem.get(tmp, counter, last)
            shmem.put(counter, tmp + 1, last)
        finally:
            box.release()
    else:
        with box as held:
            check(held is box, "Lock.__enter__ returns the lock")
            shmem.get(tmp, counter, last)
            shmem.put(counter, tmp + 1, last)
shmem.barrier_all()
if me == last:
    check(int(counter[0]) == (ITERS // 2) * n, f"Lock counter {counter[0]}")
word = shmem.atomic_fetch(box.lock, box.owner) & ((1 << 64) - 1)
turns = ((ITERS // 2) * n - 2) & 0xFFFF_FFFF  # tickets taken, counted from the wrap
check(word == (turns << 32) | turns, f"Lock word after wrapping: {word:#x}")
shmem.barrier_all()

# -- test_lock: False means acquired ------------------------------------------------------------
if me == 0:
    check(shmem.test_lock(lock) is False, "test_lock on a free lock must acquire (False)")
    try:
        shmem.set_lock(lock)
    except InvalidArgumentError:
        pass
    else:
        check(False, "set_lock by the holding thread must be refused (it would deadlock)")
shmem.barrier_all()
if me != 0:
    check(shmem.test_lock(lock) is True, "test_lock on a held lock must return True")
    try:
        shmem.clear_lock(lock)
    except InvalidArgumentError:
        pass
    else:
        check(False, "clear_lock by a PE that does not hold the lock must be refused")
shmem.barrier_all()
if me == 0:
    shmem.clear_lock(lock)
shmem.barrier_all()
for pe in range(n):  # one at a time: each finds it free
    if pe == me:
        check(shmem.test_lock(lock) is False, f"test_lock, turn of PE {pe}")
        shmem.clear_lock(lock)
    shmem.barrier_all()

# -- FIFO: PE k queues only after PEs 1..k-1 did; the lock is granted in that order ------------
fifo = shmem.Lock()
order = shmem.zeros(n, np.int64)
slot = shmem.zeros(1, np.int64)
shmem.barrier_all()


def queued() -> int:
    """Tickets handed out so far (the high half of the lock word)."""
    return shmem.atomic_fetch(fifo.lock, fifo.owner) >> 32


if me == 0:
    fifo.acquire()
shmem.barrier_all()
if me:
    while queued() != me:  # PEs 0..me-1 hold or wait
        time.sleep(0.0002)
fifo_deadline = time.monotonic() + 30
while me == 0 and queued() != n:  # everyone is queued behind PE 0
    check(time.monotonic() < fifo_deadline, "PEs did not queue")
    time.sleep(0.0002)
if me:
    fifo.acquire()
k = shmem.atomic_fetch_inc(slot, 0)
shmem.atomic_set(order[k:k + 1], me, 0)
fifo.release()
shmem.barrier_all()
if me == 0:
    check(list(order) == list(range(n)), f"grant order {list(order)} is not FIFO")
shmem.barrier_all()

# -- giving up: timeout and Ctrl-C withdraw the ticket; the lock keeps working -----------------
# (PEs 0 and 1 take turns holding and waiting: one of them waits on the word in its own memory,
# the other polls it remotely, or through the shm mapping)


class Interrupted(Exception):
    pass


def interrupt(signum: int, frame: object) -> None:
    raise Interrupted


for holder in range(min(n, 2)) if n >= 2 else ():
    if me == holder:
        fifo.acquire()
    shmem.barrier_all()
    if me == 1 - holder:
        before = queued()
        waiter = shmem._state.rt.waiter
        saved = waiter.timeout
        waiter.timeout = 0.1
        try:
            fifo.acquire()
        except WaitTimeoutError as exc:
            check("VKSHMEM_WAIT_TIMEOUT" in str(exc), f"timeout message: {exc}")
        else:
            check(False, "set_lock must time out while the other PE holds the lock")
        finally:
            waiter.timeout = saved
        check(queued() == before, f"ticket not withdrawn after the timeout ({queued()})")
    # Interrupting only where the wait spins on mapped memory: an exception raised inside a
    # blocking hostproxy request (the remote poll) leaves that connection's reply unread.
    if me == 1 - holder and (fifo.owner == me or shmem.ptr(fifo.lock, fifo.owner) is not None):
        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        try:
            fifo.acquire()
        except Interrupted:
            pass
        else:
            check(False, "set_lock must be interruptible")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        check(queued() == before, f"ticket not withdrawn after the interrupt ({queued()})")
    shmem.barrier_all()
    if me == holder:
        fifo.release()
    shmem.barrier_all()
    with fifo:  # every PE still gets it
        pass
    shmem.barrier_all()

# -- argument errors ----------------------------------------------------------------------------
pair = shmem.zeros(2, np.int64)
for bad, what in [(np.zeros(1, np.int64), "local array"), (pair, "two elements"),
                  (pair.view(np.int32)[:1], "int32")]:
    try:
        shmem.set_lock(bad)
    except InvalidArgumentError:
        pass
    else:
        check(False, f"set_lock on a {what} must raise InvalidArgumentError")

shmem.barrier_all()
fifo.destroy()
box.destroy()
try:
    box.acquire()
except InvalidArgumentError:
    pass
else:
    check(False, "a destroyed Lock must refuse acquire")
shmem.del_lock(lock)
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"lock ok: {n} PEs")
