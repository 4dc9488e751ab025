"""The Vulkan domain's links to same-node peers on other GPUs (vkshmem_cuda/vulkan_accel/link.py):
GPU->GPU puts and gets of sizes from one byte to more pieces than the bounce holds (slots
reused), at odd offsets, every PE at once; CPU->GPU puts and GPU->CPU gets; a put then a
fetching AMO (the AMO through the proxy sees the link's put); the nbi forms. On one GPU (or
lavapipe) the same checks run over the direct route and the script says it saw no link;
tests/test_gpu_multipe.py asserts links where CUDA sees two GPUs, and which kind: the peer's
heap mapped here (a CUDA heap, VKSHMEM_GPU_CUDA_HEAP=1) or a bounce buffer (a Vulkan heap),
and, for a CUDA heap in the BAR type, that the small copies were CPU copies through this PE's
own mapping of the peer's heap (vkshmem/gpu/domain/peermap.py)."""

from __future__ import annotations

import numpy as np
from _common import check, check_fetch_sees_put

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
N = 72 << 20  # nine 8 MiB pieces (VKSHMEM_GPU_LINK_PIECE=8M): the four bounce slots reused
src = shmem.zeros(N + 64, np.uint8, domain="gpu")
dst = shmem.zeros(N + 64, np.uint8, domain="gpu")
heap = shmem._state.rt.domains.heaps[src.domain.spec.name]
linked = [pe for pe in range(n) if heap.links[pe] is not None]
print(f"PE {me} gpu_link: links to {linked}, routes {heap.route_names}", flush=True)
for pe in linked:  # "link": the link carries AMOs too (a peer's CUDA heap mapped here)
    want = "link" if heap.links[pe].amos else "link+proxy"
    check(heap.route_names[pe] == want, f"route to PE {pe}: {heap.route_names[pe]}")


def pattern(pe: int, nbytes: int, salt: int = 0) -> np.ndarray:
    return np.random.default_rng(1000 * pe + salt).integers(0, 256, nbytes, dtype=np.uint8)


def calls() -> int:
    """Operations the link to the right neighbour carried (0 where it is not linked)."""
    link = heap.links[right]
    return link.calls + link.mapped_calls if link is not None else 0


src.copy_from(pattern(me, N + 64))
shmem.barrier_all()
before = calls()
for i, size in enumerate([1, 7, 4099, (3 << 20) + 5, N]):
    off = 3 + i  # odd offsets, unaligned to the pieces
    shmem.put(dst[off:off + size], src[5:5 + size], right)  # GPU -> GPU
    shmem.barrier_all()
    check(np.array_equal(dst[off:off + size].to_numpy(), pattern(left, N + 64)[5:5 + size]),
          f"GPU->GPU put of {size} B at {off}")
    shmem.barrier_all()
    shmem.get(dst[off:off + size], src[9:9 + size], right)  # GPU <- GPU
    check(np.array_equal(dst[off:off + size].to_numpy(), pattern(right, N + 64)[9:9 + size]),
          f"GPU<-GPU get of {size} B at {off}")
    shmem.barrier_all()
    if size < N:  # host data both ways
        data = pattern(me, size, salt=i + 1)
        shmem.put(dst[off:off + size], data, right)  # CPU -> GPU
        back = np.zeros(size, np.uint8)
        shmem.get(back, dst[off:off + size], right)  # GPU -> CPU, right after
        check(np.array_equal(back, data), f"CPU->GPU then GPU->CPU, {size} B at {off}")
        shmem.barrier_all()
# the nbi forms complete by quiet
shmem.put_nbi(dst[:4096], src[:4096], right)
shmem.quiet()
shmem.barrier_all()
check(np.array_equal(dst[:4096].to_numpy(), pattern(left, N + 64)[:4096]), "put_nbi")
shmem.barrier_all()
if heap.links[right] is not None:  # 5 sizes x 2 device, 4 x 2 host, the nbi put
    check(calls() - before == 19, f"the link carried {calls() - before} operations, not 19")
check_fetch_sees_put("gpu", 3)
for x in (dst, src):
    shmem.free(x)
direct = sum(bool(heap.links[pe].direct) for pe in linked)
mapped = sum(heap.links[pe].mapped_calls > 0 for pe in linked)
print(f"PE {me} gpu_link: {len(linked)} links ({direct} direct, {mapped} CPU-mapped), domain "
      f"{src.domain.spec.name}", flush=True)
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print("gpu_link ok", flush=True)
