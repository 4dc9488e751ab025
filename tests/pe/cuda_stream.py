"""``stream=`` on the cuda domain (tests/test_cuda_plugin.py, on a machine with NVIDIA GPUs):
torch and CuPy kernels (each where importable; a cuda-bindings stream always) write a source on
one stream, vkshmem puts it with a signal on that stream, the peer's signal_wait_until on its
own stream orders a torch/CuPy read after it; the calls return while an earlier kernel still
runs (no CPU synchronize) where the peer is mapped, and synchronize the stream where it is not
(``VKSHMEM_DOMAIN_IMPORT=0``); AMOs, barriers and every collective on a stream give the
blocking calls' values; a stream wait that times out raises WaitTimeoutError at quiet."""

from __future__ import annotations

import time

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.errors import WaitTimeoutError

try:
    import torch
except ImportError:
    torch = None
try:
    import cupy
except ImportError:
    cupy = None
from cuda.bindings import driver as cu

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt
N = 4096

src = shmem.zeros(N, np.float32, domain="cuda")
d1 = shmem.zeros(N, np.float32, domain="cuda")
d2 = shmem.zeros(N, np.float32, domain="cuda")
sig = shmem.new_signal(domain="cuda")
heap = rt.domains.heaps["cuda"]
enq = heap.direct[right] is not None  # the peer's heap mapped: enqueued, else the fallback
world = heap.maps_all(tuple(range(n)))
ordinal = heap.domain.device.ordinal  # streams must be this PE's GPU's (made current here)
if torch is not None:
    torch.cuda.set_device(ordinal)
if cupy is not None:
    cupy.cuda.Device(ordinal).use()
print(f"PE {me} cuda_stream routes: {heap.route_names}; torch {torch is not None}, "
      f"cupy {cupy is not None}", flush=True)


def raw_stream() -> int:
    _e, s = cu.cuStreamCreate(1)
    return int(s)


def synchronize(s: object) -> None:
    if hasattr(s, "synchronize"):
        s.synchronize()
    else:  # a handle or a cuda.bindings CUstream
        cu.cuStreamSynchronize(cu.CUstream(int(s)))  # type: ignore[call-overload]


# (name, producer stream, consumer stream, fill(array, value, stream), read(array, stream))
kinds: list[tuple[str, object, object, object, object]] = []
if torch is not None:
    def t_fill(a: object, v: float, s: object) -> None:
        with torch.cuda.stream(s):
            torch.from_dlpack(a).fill_(v)

    def t_read(a: object, s: object) -> np.ndarray:
        with torch.cuda.stream(s):
            out = torch.from_dlpack(a).clone()
        s.synchronize()
        return out.cpu().numpy()

    kinds.append(("torch", torch.cuda.Stream(), torch.cuda.Stream(), t_fill, t_read))
if cupy is not None:
    def c_fill(a: object, v: float, s: object) -> None:
        with s:
            cupy.from_dlpack(a).fill(v)

    def c_read(a: object, s: object) -> np.ndarray:
        with s:
            out = cupy.from_dlpack(a).copy()
        s.synchronize()
        return cupy.asnumpy(out)

    kinds.append(("cupy", cupy.cuda.Stream(non_blocking=True),
                  cupy.cuda.Stream(non_blocking=True), c_fill, c_read))


def r_fill(a: object, v: float, s: object) -> None:  # no kernel library: a put from the host
    shmem.put(a, np.full(N, v, np.float32), me, stream=s)


def r_read(a: object, s: object) -> np.ndarray:
    synchronize(s)
    return a.to_numpy()  # type: ignore[attr-defined]


kinds.append(("cuda-bindings", raw_stream(), cu.CUstream(raw_stream()), r_fill, r_read))

rounds = 0
for name, s, s2, fill, read in kinds:
    for _ in range(3):
        rounds += 1
        fill(src, float((me + 1) * rounds), s)
        shmem.put(d1, src, right, stream=s)
        shmem.put_signal(d2, src, right, sig, rounds, shmem.SIGNAL_SET, stream=s)
        shmem.signal_wait_until(sig, shmem.CMP.GE, rounds, stream=s2)
        got = read(d2, s2)
        check(np.all(got == (left + 1) * rounds), f"{name}: put_signal then a read ordered "
              f"after signal_wait_until(stream=): {got[:4]} != {(left + 1) * rounds}")
        shmem.barrier_all(stream=s)
        synchronize(s)
        got = d1.to_numpy()
        check(np.all(got == (left + 1) * rounds), f"{name}: put(stream=) {got[:4]}")
        shmem.barrier_all()  # every PE has read before the next round writes
    print(f"PE {me} {name} streams ok", flush=True)

# no CPU synchronize: the call returns while a long kernel before it still runs
word = shmem.zeros(1, np.int64, domain="cuda")
if torch is not None:
    s = torch.cuda.Stream()
    shmem.atomic_add(word, 1, right, stream=s)  # the kernel is compiled before the timing
    s.synchronize()
    for call in (lambda: shmem.put(d1, src, right, stream=s),
                 lambda: shmem.atomic_add(word, 1, right, stream=s)):
        with torch.cuda.stream(s):
            torch.cuda._sleep(int(5e8))
        t0 = time.perf_counter()
        call()
        busy = not s.query()
        check(busy == enq, f"after the call the stream is {'busy' if busy else 'idle'} "
              f"({(time.perf_counter() - t0) * 1e3:.1f} ms; peer mapped: {enq})")
        s.synchronize()
    shmem.barrier_all()

# AMOs and signals on a stream
s = kinds[0][1]
ctr = shmem.zeros(1, np.int64, domain="cuda")
shmem.atomic_add(ctr, 3, 0, stream=s)
shmem.atomic_inc(ctr, 0, stream=s)
shmem.atomic_or(ctr, 0, 0, stream=s)
shmem.signal_add(sig, 5, right, stream=s)
shmem.barrier_all(stream=s)
synchronize(s)
if me == 0:
    check(int(ctr.to_numpy()[0]) == 4 * n, f"AMOs on a stream: {ctr.to_numpy()[0]}")
check(int(shmem.signal_fetch(sig)) == rounds + 5, f"signal_add: {shmem.signal_fetch(sig)}")
shmem.barrier_all()

# get on a stream, GPU <- GPU and pinned host <- GPU (the host heap is pinned)
g = shmem.zeros(N, np.float32, domain="cuda")
hh = shmem.zeros(N, np.float32)
shmem.get(g, d1, right, stream=s)
shmem.get(hh, d1, right, stream=s)
synchronize(s)
check(np.all(g.to_numpy() == (me + 1) * rounds) and np.all(hh == (me + 1) * rounds),
      f"get(stream=): {g.to_numpy()[:4]}, {hh[:4]}")
shmem.barrier_all()

# collectives on a stream
v = shmem.array(np.arange(8, dtype=np.float32) + me, domain="cuda")
out = shmem.zeros(8 * n, np.float32, domain="cuda")
shmem.broadcast(out[:8], v, 0, stream=s)
synchronize(s)
check(np.array_equal(out.to_numpy()[:8], np.arange(8)), "broadcast(stream=)")
shmem.sync_all(stream=s)
shmem.fcollect(out, v, stream=s)
synchronize(s)
check(np.array_equal(out.to_numpy(), np.concatenate([np.arange(8) + p for p in range(n)])),
      "fcollect(stream=)")
a2a_src = shmem.array(np.arange(2 * n, dtype=np.float32) + 100 * me, domain="cuda")
a2a = shmem.zeros(2 * n, np.float32, domain="cuda")
shmem.alltoall(a2a, a2a_src, stream=s)
synchronize(s)
want = np.concatenate([[100 * p + 2 * me, 100 * p + 2 * me + 1] for p in range(n)])
check(np.array_equal(a2a.to_numpy(), want), f"alltoall(stream=): {a2a.to_numpy()}")
red = shmem.zeros(8, np.float32, domain="cuda")
shmem.sum_reduce(red, v, stream=s)
shmem.max_reduce(out[:8], v, stream=s)
synchronize(s)
check(np.array_equal(red.to_numpy(), np.arange(8) * n + n * (n - 1) / 2), "sum_reduce(stream=)")
check(np.array_equal(out.to_numpy()[:8], np.arange(8) + n - 1), "max_reduce(stream=)")
shmem.TEAM_WORLD.sync(stream=s)
shmem.quiet(stream=s)
synchronize(s)
shmem.barrier_all()

# barriers on a stream: what one costs here (PEs sharing one GPU are time-sliced)
t0 = time.perf_counter()
for _ in range(20):
    shmem.barrier_all(stream=s)
synchronize(s)
per = (time.perf_counter() - t0) / 20 * 1e6
print(f"PE {me} barrier_all(stream=) {per:.0f} us each ({'kernel' if world else 'fallback'})",
      flush=True)

# a stream wait that times out (VKSHMEM_WAIT_TIMEOUT) surfaces at quiet
never = shmem.new_signal(domain="cuda")
shmem.barrier_all()
shmem.signal_wait_until(never, shmem.CMP.EQ, 12345, stream=s)
synchronize(s)  # returns once the wait kernel gave up
try:
    shmem.quiet()
    check(False, "a timed-out stream wait did not raise")
except WaitTimeoutError as exc:
    check("signal_wait_until" in str(exc) and "12345" in str(exc)
          and "VKSHMEM_WAIT_TIMEOUT" in str(exc), f"the timeout's message: {exc}")
shmem.quiet()  # raised once
shmem.barrier_all()
print(f"PE {me} cuda_stream ok", flush=True)
