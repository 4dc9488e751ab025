"""Repeated all-reduces of GPU arrays (``reduce_again`` in vkshmem/core/collectives/device.py):
an all-reduce that took one domain call between two barriers (the domain's in-place reduce of
mapped peers, or two PEs' pair round over a direct CUDA link) is kept under its arrays, and a
repeat with the same arrays, op, size and team goes straight to that call. Checks that the
repeat is exact on new data and that anything else (another op, another size, a destroyed
team, freed arrays) takes the full path with its own result or error. Run under ``vkshmem
run`` (see tests/test_gpu_multipe.py), which checks from the printed line where the first
call's path was kept."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.collectives import device as device_collectives
from vkshmem.core.collectives import device_ring
from vkshmem.core.errors import InvalidArgumentError

me, n = shmem.my_pe(), shmem.n_pes()
N = 65536  # float32: 256 KiB, at or above the ring's threshold (the pair round's too)
f32 = np.float32


def kept(dst: object, src: object) -> bool:
    entry = device_collectives._KEPT.get((id(dst), id(src)))
    return entry is not None and entry.target() is dst


src = shmem.array(np.full(N, me + 1, f32), domain="gpu")
dst = shmem.full(N + 4, 42, f32, domain="gpu")  # the count is N: the tail stays 42
total = n * (n + 1) // 2
shmem.sum_reduce(dst, src)
check(np.array_equal(dst.to_numpy()[:N], np.full(N, total, f32)), "first sum")
was_kept = kept(dst, src)

# the same call on doubled data: the kept path, exact, nothing past the count written
paired = device_ring._paired
for k in (2, 3):
    src.copy_from(np.full(N, k * (me + 1), f32))
    shmem.barrier_all()
    shmem.sum_reduce(dst, src)
    got = dst.to_numpy()
    check(np.array_equal(got[:N], np.full(N, k * total, f32)), f"repeated sum x{k}")
    check(np.array_equal(got[N:], np.full(4, 42, f32)), f"repeated sum x{k}: past the count")
if paired:  # a pair's round counts itself when kept too (tests/pe/gpu_ring_reduce.py)
    check(device_ring._paired == paired + 2, f"pair rounds {device_ring._paired - paired}")

# the same arrays with another op, then another size: each its own result
shmem.max_reduce(dst, src)
check(np.array_equal(dst.to_numpy()[:N], np.full(N, 3 * n, f32)), "max after a kept sum")
shmem.sum_reduce(dst, src, size=N // 2)
got = dst.to_numpy()
check(np.array_equal(got[:N // 2], np.full(N // 2, 3 * total, f32)), "sum of half")
check(np.array_equal(got[N // 2:N], np.full(N // 2, 3 * n, f32)), "sum of half: the rest")
shmem.sum_reduce(dst, src, size=N // 2)  # the kept one again
check(np.array_equal(dst.to_numpy(), got), "sum of half, repeated")
src.copy_from(np.full(N, 4 * (me + 1), f32))
shmem.barrier_all()
shmem.sum_reduce(dst, src, size=np.int64(N // 4))  # a numpy integer: the full path
got[:N // 4] = 4 * total
check(np.array_equal(dst.to_numpy(), got), "sum of a quarter (numpy size)")
src.copy_from(np.full(N, 3 * (me + 1), f32))
shmem.barrier_all()

# through a team handle that is then destroyed: the repeat is refused, not run
if n >= 2:
    team = shmem.TEAM_WORLD.split_strided(0, 1, n)
    for _ in range(2):
        shmem.sum_reduce(dst, src, team=team)
        check(np.array_equal(dst.to_numpy()[:N], np.full(N, 3 * total, f32)), "team sum")
    team.destroy()
    try:
        shmem.sum_reduce(dst, src, team=team)
    except InvalidArgumentError as exc:
        check("destroyed" in str(exc) or "TEAM_INVALID" in str(exc), f"error: {exc}")
    else:
        check(False, "an all-reduce over a destroyed team ran")

# freed arrays: new ones (whatever their ids) take their own path and results
shmem.free(dst)
dst = shmem.full(N, 7, f32, domain="gpu")
shmem.sum_reduce(dst, src)
shmem.sum_reduce(dst, src)
check(np.array_equal(dst.to_numpy(), np.full(N, 3 * total, f32)), "sum into a new target")
shmem.free(dst)
shmem.free(src)
print(f"PE {me} gpu_reduce_again ok (domain {src.domain.spec.name}, kept {was_kept}, pair "
      f"rounds {device_ring._paired})", flush=True)
