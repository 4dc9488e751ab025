"""The ring all-reduce of GPU arrays whose peers are not mapped
(vkshmem/core/collectives/device_ring.py):
exact results for sums (float32, int64), max and prod, a dtype the device cannot reduce
(longdouble: the numpy folds), counts below the threshold and uneven ones above it, the same
bytes on every PE, sources left unchanged, and in-place calls (the gather path). Whether the
ring ran is read from the module's private counters (and, over the Vulkan domain's direct CUDA
links between GPUs, that the last folds pushed their results in the same pass, and that two
PEs took the pair's round, vkshmem_cuda/vulkan_accel/pair.py, wherever a GPU kernel folds).
Run where PEs do not map each other's GPU heaps (VKSHMEM_DOMAIN_IMPORT=0: the GPU proxy;
VKSHMEM_SHM=0: a transport) under ``vkshmem run`` (see tests/test_gpu_multipe.py); a small
VKSHMEM_GPU_RING_REDUCE puts the small counts (shares left empty) on the ring too."""

from __future__ import annotations

import hashlib

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.collectives import device_ring

me, n = shmem.my_pe(), shmem.n_pes()
probe = shmem.zeros(1, np.uint8, domain="gpu")
rt = shmem._state.rt
heap = rt.domains.heaps[probe.domain.spec.name]
check(n == 1 or heap.route_names[(me + 1) % n] != "direct", f"routes {heap.route_names}")
least = rt.config.gpu_ring_reduce
BIG = 3 * 65536 + 7  # uneven: not a multiple of n, nor of the shares' alignment


def contribution(pe: int, dt: np.dtype, op: str, cnt: int) -> np.ndarray:
    """PE ``pe``'s source: values whose reduction is exact in ``dt``."""
    i = np.arange(cnt)
    if op == "prod":  # powers of two: float products stay exact
        return (2.0 ** ((i + pe) % 5 - 2)).astype(dt)
    rng = np.random.default_rng(pe)
    if op == "max" and dt.kind == "i":
        return rng.integers(-1 << 30, 1 << 30, cnt).astype(dt)
    if op == "max":
        return rng.standard_normal(cnt).astype(dt)
    if dt.kind == "i":
        return ((i % 1000) * (1 << 40) + pe * 7919 - (i % 3)).astype(dt)
    return ((i + 3 * pe) % 101).astype(dt)


def all_reduce(dt: np.dtype, op: str, cnt: int, in_place: bool = False) -> None:
    """One ``reduce`` of ``cnt`` elements: the exact result, the source unchanged, and the ring
    taken exactly where it applies."""
    mine = contribution(me, dt, op, cnt)
    src = shmem.array(mine, domain="gpu")
    dst = src if in_place else shmem.full(cnt + 5, 42, dt, domain="gpu")
    before = device_ring._taken
    shmem.reduce(dst, src, op, size=cnt)
    ufunc = {"sum": np.add, "max": np.maximum, "prod": np.multiply}[op]
    want = ufunc.reduce([contribution(pe, dt, op, cnt) for pe in range(n)], axis=0).astype(dt)
    got = dst.to_numpy()
    what = f"{op} {dt.name} x {cnt}{' in place' if in_place else ''}"
    check(np.array_equal(got[:cnt], want), f"{what}: wrong result")
    if not in_place:
        check(np.array_equal(got[cnt:], np.full(5, 42, dt)), f"{what}: wrote past the count")
        check(np.array_equal(src.to_numpy(), mine), f"{what}: the source changed")
    ring = n >= 2 and bool(least) and cnt * dt.itemsize >= least and not in_place
    check(device_ring._taken - before == int(ring), f"{what}: ring taken "
          f"{device_ring._taken - before} times, expected {int(ring)}")
    global device_rings
    device_rings += ring and dt != np.longdouble  # the ones a GPU kernel folds
    if dst is not src:
        shmem.free(dst)
    shmem.free(src)


device_rings = 0
SMALL = 1000  # below the default threshold (4000 bytes of float32)
for count in (5, 300, SMALL, BIG):
    all_reduce(np.dtype(np.float32), "sum", count)
all_reduce(np.dtype(np.int64), "sum", BIG)
all_reduce(np.dtype(np.int64), "sum", SMALL)
all_reduce(np.dtype(np.float32), "max", BIG)
all_reduce(np.dtype(np.float32), "prod", BIG)
all_reduce(np.dtype(np.int32), "max", BIG)
all_reduce(np.dtype(np.longdouble), "sum", BIG // 4)  # no GPU variant: folded by numpy
all_reduce(np.dtype(np.float32), "sum", BIG, in_place=True)

# rounding differs with the fold order: every PE must still end with the very same bytes
noisy = shmem.array(np.random.default_rng(100 + me).standard_normal(BIG).astype(np.float32),
                    domain="gpu")
out = shmem.zeros(BIG, np.float32, domain="gpu")
shmem.sum_reduce(out, noisy)
device_rings += n >= 2 and bool(least)
mine = out.to_numpy()
digest = shmem.array(np.frombuffer(hashlib.sha256(mine.tobytes()).digest()[:8], np.int64))
hi = shmem.zeros(1, np.int64)
lo = shmem.zeros(1, np.int64)
shmem.max_reduce(hi, digest)
shmem.min_reduce(lo, digest)
check(hi[0] == lo[0], "float32 sums differ in their bits between PEs")
exact = np.sum([np.random.default_rng(100 + pe).standard_normal(BIG).astype(np.float32)
                for pe in range(n)], axis=0, dtype=np.float64)
check(np.allclose(mine, exact, rtol=1e-5, atol=1e-5), "float32 sum of random data")
# the same call again on new data (a kept round, where the domain keeps one per call shape):
# doubling every input doubles every partial sum exactly
noisy.copy_from(2 * noisy.to_numpy())
shmem.barrier_all()
shmem.sum_reduce(out, noisy)
device_rings += n >= 2 and bool(least)
check(np.array_equal(out.to_numpy(), 2 * mine), "a repeated float32 sum on doubled data")
# a team of PEs 1 .. n-1 (its ranks are not the world's): the ring runs over its members only
if n >= 3:
    team = shmem.TEAM_WORLD.split_strided(1, 1, n - 1)
    cnt = BIG
    want = np.sum([contribution(pe, np.dtype(np.float32), "sum", cnt) for pe in range(1, n)],
                  axis=0).astype(np.float32)
    src = shmem.array(contribution(me, np.dtype(np.float32), "sum", cnt), domain="gpu")
    dst = shmem.zeros(cnt, np.float32, domain="gpu")
    if me:
        before = device_ring._taken
        shmem.sum_reduce(dst, src, team=team)
        check(np.array_equal(dst.to_numpy(), want), "team sum")
        check(device_ring._taken == before + 1, "the team's all-reduce took the ring")
        team.destroy()
    shmem.barrier_all()
    shmem.free(dst)
    shmem.free(src)

shmem.barrier_all()
right_link = heap.links[(me + 1) % n] if n > 1 else None
if n == 2 and right_link is not None and getattr(right_link, "direct", False):
    # 64 MiB and more: the pair's round in two halves on two streams (csrc/cudapair.c), an
    # odd count (uneven shares and halves); a sum, a max, then the sum again on new data
    for op in ("sum", "max", "sum"):
        all_reduce(np.dtype(np.float32), op, (64 << 20) // 4 + 4001)
pushed = device_ring._fused + device_ring._paired  # a pair's round pushes its folds too
if right_link is not None and getattr(right_link, "direct", False):  # a CUDA link, mapped
    check(pushed > 0, "no fold was pushed through the direct link")
    if n == 2:  # two members over a direct link: the pair's round wherever a kernel folds
        check(device_ring._paired == device_rings, f"{device_ring._paired} pair rounds, "
              f"expected {device_rings}")
print(f"PE {me} folds pushed through a link: {pushed}", flush=True)
print(f"PE {me} pair rounds: {device_ring._paired}", flush=True)
print(f"PE {me} gpu_ring_reduce ok (ring taken {device_ring._taken} times, "
      f"threshold {least})", flush=True)
