"""The ucx transport with the core's heap allocated by UCX (rail option heap=, see
plugins/ucx/README.md): which segments UCX allocated, contended AMOs that mix UCX's
shared-memory atomics (peers) with the core's own CPU atomics (this PE), puts, gets, a Python-path
put_nbi completed by the quiet in C, and the heap's bytes surviving finalize (the range goes
back to the core's memfd). Expects VKSHMEM_SHM=0 and VKSHMEM_TRANSPORTS=ucx; UCX_HEAP_WANT
names the segments UCX must have allocated ("0,1" or "")."""

from __future__ import annotations

import os

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem._api import state

ROUNDS = 300

shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
rt = state.rt
(ucx,) = rt.routing.transports
want = [int(s) for s in os.environ["UCX_HEAP_WANT"].split(",") if s]
got = ucx.stats()["ucx_allocated_segments"]
check(got == want, f"UCX allocated segments {got}, expected {want}")

counter = shmem.zeros(1, np.int64)
board = shmem.zeros(n, np.int64)
shmem.barrier_all()
for _ in range(ROUNDS):  # every PE adds to every PE's counter, this PE's own included
    for pe in range(n):
        shmem.atomic_add(counter, 1, (me + pe) % n)
for pe in range(n):  # one blocking put, one Python-path put_nbi per peer
    shmem.put(board[me:me + 1], np.array([100 + me], np.int64), pe)


class Sub(np.ndarray):
    """An ndarray subclass: the compiled path leaves it to the Python one."""


nbi = np.array([1000 + me], np.int64).view(Sub)
shmem.put_nbi(board[me:me + 1], nbi, (me + 1) % n)  # Python path: the buffer is held
shmem.quiet()
check(not ucx._held, "put_nbi's buffer still held after quiet")
shmem.barrier_all()
check(counter[0] == ROUNDS * n, f"counter {counter[0]} after {ROUNDS * n} adds")
prev = (me - 1) % n
expect = [1000 + pe if pe == prev else 100 + pe for pe in range(n)]
check(board.tolist() == expect, f"board {board.tolist()}, expected {expect}")
seen = np.zeros(n, np.int64)
for pe in range(n):  # read every PE's board back
    shmem.get(seen, board, pe)
    theirs = [1000 + q if q == (pe - 1) % n else 100 + q for q in range(n)]
    check(seen.tolist() == theirs, f"board of PE {pe} read as {seen.tolist()}, not {theirs}")
shmem.barrier_all()
old = shmem.atomic_fetch_add(counter, 5, (me + 1) % n)
check(old >= ROUNDS * n, f"fetch_add returned {old}")
shmem.barrier_all()
check(counter[0] == ROUNDS * n + 5, f"counter {counter[0]} after the fetch_add")
print(f"routes: {sorted({r.name for r in rt.routing.routes})}")
shmem.finalize()
# the arrays still view the heap: its bytes are the memfd's again, with every write kept
check(counter[0] == ROUNDS * n + 5 and board.tolist() == expect, "heap changed at finalize")
print("ucx_heap ok")
