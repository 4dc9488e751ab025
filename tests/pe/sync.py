"""wait_until/test families (CMP as enum, string, operator), fence ordering, barriers."""

from __future__ import annotations

import operator

import numpy as np
from _common import check

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n

flag = shmem.zeros(1, np.int64)
data = shmem.zeros(64, np.int32)

# put + fence + flag: the receiver sees the data once it sees the flag
for rnd in range(1, 21):
    shmem.put(data, np.full(64, rnd * 100 + me, np.int32), right)
    shmem.fence()
    shmem.atomic_set(flag, rnd, right)
    shmem.wait_until(flag, shmem.CMP.GE, rnd)
    check((data == rnd * 100 + left).all(), f"data before flag, round {rnd}")
    shmem.barrier_all()

for cmp, value in ((shmem.CMP_EQ, 20), ("ge", 20), (">=", 3), (operator.gt, 19), ("NE", 0),
                   ("le", 20), ("lt", 21)):
    shmem.wait_until(flag, cmp, value)
    check(shmem.test(flag, cmp, value), f"test {cmp}")
check(not shmem.test(flag, "eq", 99), "test false")

# vector forms: n flags on every PE, one per source PE
flags = shmem.zeros(n, np.int32)
shmem.barrier_all()
shmem.atomic_set(flags[me:me + 1], me + 1, right)
idx = shmem.wait_until_any(flags, shmem.CMP.NE, 0)
check(idx is not None and flags[idx] != 0, "wait_until_any")
shmem.barrier_all()
shmem.wait_until_all(flags[left:left + 1], "eq", left + 1)
some = shmem.wait_until_some(flags, "gt", 0)
check(some == [left], f"wait_until_some {some}")
check(shmem.test_any(flags, "gt", 0) == left, "test_any")
check(shmem.test_some(flags, "gt", 0) == [left], "test_some")
status = np.ones(n, np.int32)
status[left] = 0
check(shmem.test_all(flags, "gt", 0, status=status), "test_all with status")
check(shmem.wait_until_any(flags, "gt", 0, status=np.ones(n)) is None, "all excluded")
expect = np.zeros(n, np.int32)
expect[left] = left + 1
shmem.wait_until_all_vector(flags, "eq", expect)
check(shmem.test_all_vector(flags, "eq", expect), "test_all_vector")
got = shmem.wait_until_any_vector(flags, "eq", expect)
check(got is not None and flags[got] == expect[got], "wait_until_any_vector")
check(shmem.wait_until_some_vector(flags, "eq", expect) == list(range(n)), "some_vector")
check(shmem.test_any_vector(flags, "ne", expect) is None, "test_any_vector")
check(shmem.test_some_vector(flags, "ne", expect) == [], "test_some_vector")

# fairness (OpenSHMEM 1.5/1.6): a series of *_any calls returns every satisfied index, not
# the lowest for ever; excluded and unsatisfied ones never
many = shmem.ones(5, np.int32)
many[2] = 0
keep = np.array([0, 0, 0, 0, 1], np.int32)  # status: index 4 excluded
for name, call in (
        ("test_any", lambda: shmem.test_any(many, "eq", 1, status=keep)),
        ("wait_until_any", lambda: shmem.wait_until_any(many, "eq", 1, status=keep)),
        ("test_any_vector", lambda: shmem.test_any_vector(many, "eq", np.ones(5), keep)),
        ("wait_until_any_vector",
         lambda: shmem.wait_until_any_vector(many, "eq", np.ones(5), keep))):
    seen = [call() for _ in range(9)]
    check(set(seen) == {0, 1, 3}, f"{name} fair: {seen}")
shmem.free(many)
# waits and tests on freed or private (non-symmetric) words raise, as RMA does
from vkshmem import InvalidArgumentError, NotAllocatedError  # noqa: E402

for name, call in (("wait_until", lambda a: shmem.wait_until(a[:1], "eq", 7)),
                   ("test", lambda a: shmem.test(a[:1], "eq", 7)),
                   ("wait_until_all", lambda a: shmem.wait_until_all(a, "eq", 7)),
                   ("test_any", lambda a: shmem.test_any(a, "eq", 7))):
    for what, arr, err in (("freed", many, NotAllocatedError),
                           ("private", np.zeros(5, np.int32), InvalidArgumentError)):
        try:
            call(arr)
        except err:
            pass
        else:
            check(False, f"{name} on a {what} array must raise {err.__name__}")

# barriers keep everyone in step: each round every PE increments PE 0's counter once
ctr = shmem.zeros(1, np.int64)
for rnd in range(1, 31):
    shmem.atomic_inc(ctr, 0)
    shmem.barrier_all()
    if me == 0:
        check(int(ctr[0]) == rnd * n, f"barrier round {rnd}: {ctr[0]}")
    shmem.barrier_all()
shmem.sync_all()

# a wait that times out raises instead of hanging
import os  # noqa: E402

from vkshmem import WaitTimeoutError  # noqa: E402

rt = shmem._state.rt
old = rt.waiter.timeout
rt.waiter.timeout = 0.2
try:
    shmem.wait_until(flag, "eq", -1)
except WaitTimeoutError as exc:
    check("VKSHMEM_WAIT_TIMEOUT" in str(exc), "timeout names the variable")
else:
    check(False, "wait_until must time out")
rt.waiter.timeout = old
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"sync ok: {n} PEs, pid {os.getpid()}")
