"""put/get/iput/iget/put_nbi/get_nbi for every dtype, with views, slices and offsets."""

from __future__ import annotations

import numpy as np
from _common import DTYPES, check, data

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
N = 257

for i, dt in enumerate(DTYPES):
    dst = shmem.zeros(N, dt)
    src = data(dt, N, seed=1000 * i + me)
    # blocking put of the whole array to the right neighbour
    shmem.put(dst, src, right)
    shmem.barrier_all()
    check(np.array_equal(dst, data(dt, N, seed=1000 * i + left)), f"put {np.dtype(dt)}")
    # get the left neighbour's array back
    got = np.empty(N, dt)
    shmem.get(got, dst, left)
    check(np.array_equal(got, data(dt, N, seed=1000 * i + (left - 1) % n)), f"get {dt}")
    shmem.barrier_all()
    # a slice at an odd offset, with an explicit size, from a non-contiguous local source
    dst[:] = 0
    shmem.barrier_all()
    strided = np.repeat(src, 2)[::2]  # not contiguous
    shmem.put(dst[3:], strided[5:], right, size=100)
    shmem.barrier_all()
    expect = np.zeros(N, dt)
    expect[3:103] = data(dt, N, seed=1000 * i + left)[5:105]
    check(np.array_equal(dst, expect), f"put into slice {np.dtype(dt)}")
    # get into a non-contiguous local target
    out = np.zeros((50, 2), dt)
    shmem.get(out[:, 1], dst[3:53], left)
    left_expect = np.zeros(N, dt)
    left_expect[3:103] = data(dt, N, seed=1000 * i + (left - 1) % n)[5:105]
    check(np.array_equal(out[:, 1], left_expect[3:53]) and not out[:, 0].any(),
          f"get into strided local {np.dtype(dt)}")
    shmem.barrier_all()
    # strided iput / iget
    dst[:] = 0
    shmem.barrier_all()
    shmem.iput(dst, src, right, tst=3, sst=2, size=40)
    shmem.barrier_all()
    expect = np.zeros(N, dt)
    expect[0:120:3] = data(dt, N, seed=1000 * i + left)[0:80:2]
    check(np.array_equal(dst, expect), f"iput {np.dtype(dt)}")
    back = np.zeros(80, dt)
    shmem.iget(back, dst, right, tst=2, sst=3, size=40)
    right_expect = np.zeros(N, dt)
    right_expect[0:120:3] = src[0:80:2]
    check(np.array_equal(back[0::2], right_expect[0:120:3]) and not back[1::2].any(),
          f"iget {np.dtype(dt)}")
    # non-blocking forms, completed by quiet
    shmem.barrier_all()
    shmem.put_nbi(dst, src[::-1].copy(), right)
    shmem.quiet()
    shmem.barrier_all()
    nb = np.empty(N, dt)
    shmem.get_nbi(nb, dst, me)
    shmem.quiet()
    check(np.array_equal(nb, data(dt, N, seed=1000 * i + left)[::-1]), f"nbi {np.dtype(dt)}")
    shmem.barrier_all()
    shmem.free(dst)

# 2-D and Fortran-ordered symmetric arrays
grid = shmem.zeros((8, 16), np.float64, order="F")
mine = np.arange(128, dtype=np.float64).reshape(8, 16) + me
shmem.put(grid, np.asfortranarray(mine), right)
shmem.barrier_all()
check(np.array_equal(grid, np.arange(128).reshape(8, 16) + left), "2-D F-order put")

# 1 MiB transfer
big = shmem.zeros(1 << 17, np.float64)
payload = data(np.float64, 1 << 17, seed=77 + me)
shmem.put(big, payload, right)
shmem.barrier_all()
check(np.array_equal(big, data(np.float64, 1 << 17, seed=77 + left)), "1 MiB put")

# ptr: a direct view when the shm path reaches the PE
view = shmem.ptr(big, right)
if shmem._state.rt.routing.routes[right].name == "shm" or right == me:
    check(view is not None and np.array_equal(view, payload), "ptr view")
else:
    check(view is None, "ptr must be None where the shm path does not reach")
# a PE's own memory is always reachable, and TEAM_SHARED is exactly the PEs ptr reaches
# (OpenSHMEM's shmem_ptr / SHMEM_TEAM_SHARED), whatever VKSHMEM_SHM says
mine = shmem.ptr(big, me)
check(mine is not None and mine.ctypes.data == big.ctypes.data, "ptr to this PE")
team = shmem.TEAM_SHARED
members = [team.translate_pe(i, shmem.TEAM_WORLD) for i in range(team.n_pes())]
reach = [pe for pe in range(n) if shmem.ptr(big, pe) is not None]
check(reach == members, f"TEAM_SHARED {members} vs ptr reaching {reach}")
check(shmem.team_ptr(team, big, team.my_pe()) is not None, "team_ptr to this PE")
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"rma ok: {len(DTYPES)} dtypes, {n} PEs")
