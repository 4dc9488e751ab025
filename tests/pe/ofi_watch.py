"""The wake board (vkshmem/core/csrc/fast_watch.c, struct vk_watch in _native.h): where every
byte arriving at a PE comes through transports whose progress pokes the board (``WATCH=1``:
the ofi transport with a manual-progress provider, ``VKSHMEM_SHM=0``), a long wait_until
sleeps on its futex and a peer's AMO landing ends the sleep through the target's progress (the
board's ``woken`` count); elsewhere (``WATCH=0``: the shm path, hostproxy) the board is not
used. Either way, a store no transport applies (a thread of this PE writing the word itself)
ends the wait within its slice: no wait hangs on a poke that never comes; and two threads
waiting at once (one holds the board, the other polls) both return."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core import fast

me, n = shmem.my_pe(), shmem.n_pes()
want = os.environ["WATCH"] == "1"
flag = shmem.zeros(1, np.int64)
before = fast.watch_stats()
check((before["transports"] > 0) == want, f"the board watches {before} (WATCH={int(want)})")

ROUNDS = 4
for r in range(1, ROUNDS + 1):  # PE 0 sets the others' flags 50 ms after they began waiting
    shmem.barrier_all()
    if me == 0:
        time.sleep(0.05)
        for pe in range(1, n):
            shmem.atomic_set(flag, r, pe)
        shmem.quiet()
    else:
        shmem.wait_until(flag, shmem.CMP.EQ, r)
        check(int(flag[0]) == r, f"round {r}: flag {flag[0]}")
shmem.barrier_all()
after = fast.watch_stats()
sleeps, woken = after["sleeps"] - before["sleeps"], after["woken"] - before["woken"]
if me != 0 and want:  # ~48 slices of 1 ms per round after 2 ms of yields, not 50 us naps
    check(after["arms"] > before["arms"], f"no wait armed the board: {after}")
    check(1 <= sleeps <= ROUNDS * 200, f"{sleeps} futex sleeps in {ROUNDS} waits of 50 ms")
    check(woken >= 2, f"{woken} of {ROUNDS} waits were ended by the target's progress")
if not want:
    check(after["arms"] == before["arms"] and sleeps == 0, f"the board was used: {after}")


def store_later(word: np.ndarray) -> None:
    time.sleep(0.03)
    word[0] = 7  # a plain store: no transport sees it, no poke comes


word = shmem.zeros(1, np.int64)
shmem.barrier_all()
writer = threading.Thread(target=store_later, args=(word,))
start = time.monotonic()
writer.start()
shmem.wait_until(word, shmem.CMP.EQ, 7)
took = time.monotonic() - start
writer.join()
check(took < 2.0, f"a wait on a word stored by this PE's thread took {took:.3f} s")
shmem.barrier_all()

# two threads of a PE waiting at once: one holds the board, the other polls; both return
pair = shmem.zeros(2, np.int64)
shmem.barrier_all()
if me != 0:
    waiters = [threading.Thread(target=shmem.wait_until, args=(pair[i:i + 1], shmem.CMP.EQ, 1))
               for i in range(2)]
    for w in waiters:
        w.start()
shmem.barrier_all()
if me == 0:
    time.sleep(0.02)
    for pe in range(1, n):
        for i in range(2):
            shmem.atomic_set(pair[i:i + 1], 1, pe)
    shmem.quiet()
else:
    for w in waiters:
        w.join(10)
        check(not w.is_alive(), "a second thread's wait did not end")
shmem.barrier_all()
shmem.free(pair)
shmem.free(word)
shmem.free(flag)
print(f"ofi watch ok (PE {me}: {sleeps} sleeps, {woken} woken, own store {took * 1e3:.0f} ms)",
      flush=True)
