"""``stream=`` where no domain enqueues on the stream (the Vulkan domain, host arrays): every
call synchronizes the user's stream object (its ``synchronize()``), then makes the blocking
call, with the blocking call's results; objects that are no stream are refused with the list
of what is accepted; fetching AMOs refuse ``stream=``. Runs on lavapipe
(tests/test_gpu_multipe.py)."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.errors import InvalidArgumentError

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n


class UserStream:
    """The user's stream object: what a stream library offers (here it only counts)."""

    def __init__(self) -> None:
        self.synced = 0

    def synchronize(self) -> None:
        self.synced += 1


s = UserStream()


def synced(before: int, what: str) -> None:
    check(s.synced > before, f"{what}: the stream was not synchronized")


g = shmem.zeros(16, np.int64, domain="gpu")
src = shmem.full(16, me + 1, np.int64, domain="gpu")
h = shmem.zeros(16, np.int64)
print(f"PE {me} gpu_stream on the {g.domain.spec.name} domain", flush=True)

# RMA: GPU<->GPU, host->GPU, GPU->host, the _nbi forms
k = s.synced
shmem.put(g[:4], src[:4], right, stream=s)
shmem.put(g[4:8], np.full(4, 10 + me, np.int64), right, stream=s)
shmem.put_nbi(g[8:12], src[:4], right, stream=s)
synced(k, "put")
shmem.barrier_all(stream=s)
got = g.to_numpy()
check(np.array_equal(got[:4], np.full(4, left + 1)), f"put on a stream: {got[:4]}")
check(np.array_equal(got[4:8], np.full(4, 10 + left)), f"host put on a stream: {got[4:8]}")
check(np.array_equal(got[8:12], np.full(4, left + 1)), f"put_nbi on a stream: {got[8:12]}")
out = np.zeros(4, np.int64)
shmem.get(out, g[:4], right, stream=s)
check(np.array_equal(out, np.full(4, me + 1)), f"get on a stream: {out}")
loc = shmem.zeros(4, np.int64, domain="gpu")
shmem.get_nbi(loc, g[4:8], right, stream=s)
shmem.quiet(stream=s)
check(np.array_equal(loc.to_numpy(), np.full(4, 10 + me)), "get_nbi + quiet on a stream")
shmem.put(h[:4], np.arange(4, dtype=np.int64) + me, right, stream=s)  # host arrays
shmem.sync_all(stream=s)
shmem.fence(stream=s)
check(np.array_equal(h[:4], np.arange(4) + left), f"host put on a stream: {h[:4]}")

# signals and AMOs
sig = shmem.new_signal(domain="gpu")
data = shmem.zeros(4, np.float64, domain="gpu")
shmem.put_signal(data, np.full(4, me + 0.5), right, sig, me + 1, shmem.SIGNAL_SET, stream=s)
seen = shmem.signal_wait_until(sig, shmem.CMP.EQ, left + 1, stream=s)
check(seen == left + 1, f"signal_wait_until on a stream's fallback returns the value: {seen}")
check(np.array_equal(data.to_numpy(), np.full(4, left + 0.5)), "put_signal's data")
shmem.barrier_all()
shmem.signal_add(sig, 2, right, stream=s)
shmem.signal_set(sig, 7, me, stream=s)  # races with the neighbour's add: not checked
shmem.barrier_all(stream=s)
ctr = shmem.zeros(1, np.int64, domain="gpu")
shmem.atomic_add(ctr, 3, 0, stream=s)
shmem.atomic_inc(ctr, 0, stream=s)
shmem.atomic_op(ctr, 1, shmem.AMO.ADD, 0, stream=s)
shmem.barrier_all(stream=s)
if me == 0:
    check(int(ctr.to_numpy()[0]) == 5 * n, f"AMOs on a stream: {ctr.to_numpy()[0]} != {5 * n}")
shmem.barrier_all()
for fetching in (lambda: shmem.atomic_fetch_add(ctr, 1, 0, stream=s),
                 lambda: shmem.atomic_fetch(ctr, 0, stream=s),
                 lambda: shmem.atomic_compare_swap(ctr, 0, 1, 0, stream=s)):
    try:
        fetching()
        check(False, "a fetching AMO took stream=")
    except InvalidArgumentError as exc:
        check("without stream=" in str(exc), f"fetching AMO's error: {exc}")

# collectives
b = shmem.zeros(4, np.int64, domain="gpu")
shmem.broadcast(b, src[:4], 0, stream=s)
check(np.array_equal(b.to_numpy(), np.full(4, 1)), f"broadcast on a stream: {b.to_numpy()}")
fc = shmem.zeros(2 * n, np.int64, domain="gpu")
shmem.fcollect(fc, src[:2], stream=s)
check(np.array_equal(fc.to_numpy(), np.repeat(np.arange(1, n + 1), 2)), "fcollect on a stream")
col = shmem.zeros(2 * n, np.int64, domain="gpu")
shmem.collect(col, src[:2], stream=s)
check(np.array_equal(col.to_numpy(), np.repeat(np.arange(1, n + 1), 2)), "collect on a stream")
a2a_src = shmem.array(np.arange(n, dtype=np.int64) + 100 * me, domain="gpu")
a2a = shmem.zeros(n, np.int64, domain="gpu")
shmem.alltoall(a2a, a2a_src, stream=s)
check(np.array_equal(a2a.to_numpy(), np.arange(n) * 100 + me), f"alltoall: {a2a.to_numpy()}")
red = shmem.zeros(4, np.int64, domain="gpu")
shmem.sum_reduce(red, src[:4], stream=s)
check(np.array_equal(red.to_numpy(), np.full(4, n * (n + 1) // 2)), "sum_reduce on a stream")
shmem.reduce(red, src[:4], shmem.OP.MAX, stream=s)
check(np.array_equal(red.to_numpy(), np.full(4, n)), "reduce(MAX) on a stream")
shmem.TEAM_WORLD.sync(stream=s)
shmem.sync(stream=s)

# what is no stream
for bad in (object(), "stream", 3.5):
    try:
        shmem.put(g[:4], src[:4], right, stream=bad)
        check(False, f"stream={bad!r} was accepted")
    except InvalidArgumentError as exc:
        check("synchronize()" in str(exc) and "torch.cuda.Stream" in str(exc),
              f"the error names what stream= takes: {exc}")
if g.domain.spec.name != "cuda":  # no domain here takes a raw CUDA handle
    try:
        shmem.quiet(stream=7)
        check(False, "an int stream was accepted where no domain takes CUDA streams")
    except InvalidArgumentError as exc:
        check("int handle" in str(exc), f"the int handle's error: {exc}")
shmem.barrier_all()
print(f"PE {me} synchronized the stream {s.synced} times", flush=True)
print(f"PE {me} gpu_stream ok", flush=True)
