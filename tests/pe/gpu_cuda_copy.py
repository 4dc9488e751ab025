"""Bulk copies and AMOs of the Vulkan heap through CUDA (vkshmem_cuda/vulkan_accel/copier.py): on
NVIDIA with cuda-bindings, blocking copies from VKSHMEM_GPU_CUDA_COPY bytes (CPU->GPU, GPU->CPU,
GPU->GPU to this PE's heap and to same-device peers') go through CUDA, and so do AMOs where
NVRTC is installed (VKSHMEM_GPU_CUDA_AMO); elsewhere (lavapipe) they stay on Vulkan. Either way
the bytes land, at odd offsets and sizes, Vulkan's own operations (small reads, shader AMOs) see
what CUDA wrote, and AMOs on one word from every PE, half of them CUDA kernels and half Vulkan
shaders, lose no update (a PE on another GPU than PE 0 reaches it through a CUDA link, whose
AMOs are CUDA kernels either way). Run under ``vkshmem run``."""

from __future__ import annotations

import itertools

import numpy as np
from _common import check

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
size = (1 << 20) + 7  # above the default threshold (256K), not a multiple of anything
x = shmem.zeros(4 << 20, np.uint8, domain="gpu")
y = shmem.zeros(4 << 20, np.uint8, domain="gpu")
dom = x.domain
acc = dom.accel  # vkshmem-cuda's accelerator on NVIDIA; the Vulkan-only one elsewhere
try:
    import cuda.bindings  # noqa: F401

    bindings = True
except ImportError:
    bindings = False
expect_cuda = (dom.spec.name == "vulkan" and dom.device.info.vendor == "NVIDIA" and bindings
               and getattr(acc, "cuda_copy_min", 0) > 0)
try:
    from cuda.bindings import nvrtc

    nvrtc_ok = nvrtc.nvrtcVersion()[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
except Exception:
    nvrtc_ok = False
expect_amo = expect_cuda and nvrtc_ok and acc.cuda_amo


def pattern(pe: int, salt: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.int64) * 7 + 31 * pe + salt) % 251).astype(np.uint8)


# CPU -> GPU (a peer's heap), at an odd offset
shmem.put(x[3:3 + size], pattern(me, 1), right)
shmem.barrier_all()
check(np.array_equal(x[3:3 + size].to_numpy(), pattern(left, 1)), "CPU->GPU put")
# a small Vulkan-side read and a shader AMO see the bytes CUDA wrote
h = np.zeros(8, np.uint8)
shmem.get(h, x[3 + size - 8:3 + size], me)
check(np.array_equal(h, pattern(left, 1)[-8:]), "a small read after the bulk put")
# GPU -> CPU from a peer
got = np.zeros(size, np.uint8)
shmem.get(got, x[3:3 + size], right)
check(np.array_equal(got, pattern(me, 1)), "GPU->CPU get")
# GPU -> GPU into a peer and from a peer, and within this PE's heap
y[5:5 + size].copy_from(pattern(me, 2))
shmem.barrier_all()
shmem.put(x[(1 << 20) + 11:(1 << 20) + 11 + size], y[5:5 + size], right)
shmem.barrier_all()
check(np.array_equal(x[(1 << 20) + 11:(1 << 20) + 11 + size].to_numpy(), pattern(left, 2)),
      "GPU->GPU put")
shmem.get(y[(2 << 20) - 1:(2 << 20) - 1 + size], x[(1 << 20) + 11:(1 << 20) + 11 + size], right)
check(np.array_equal(y[(2 << 20) - 1:(2 << 20) - 1 + size].to_numpy(), pattern(me, 2)),
      "GPU->GPU get")
shmem.put(x[0:size], y[5:5 + size], me)
check(np.array_equal(x[0:size].to_numpy(), pattern(me, 2)), "GPU->GPU within the heap")
# non-blocking: a symmetric host array (in the registered host heap) into a peer's heap and
# back, completed by quiet (on NVIDIA issued on CUDA's stream)
hs = shmem.zeros(2 * size, np.uint8)
hs[:size] = pattern(me, 3)
shmem.barrier_all()
shmem.put_nbi(y[9:9 + size], hs[:size], right)
shmem.quiet()
shmem.barrier_all()
shmem.get_nbi(hs[size:], y[9:9 + size], me)
shmem.quiet()
check(np.array_equal(hs[size:], pattern(left, 3)), "put_nbi/get_nbi through quiet")
shmem.free(hs)
# a shader AMO on a word the bulk copy wrote
c = shmem.zeros(1 << 16, np.int64, domain="gpu")
c.copy_from(np.full(1 << 16, 40 + me, np.int64))  # 512 KiB: above the threshold
old = shmem.atomic_fetch_add(c[100:101], 2, me)
check(old == 40 + me and int(c[100:101].to_numpy()[0]) == 42 + me, f"AMO after a bulk copy: {old}")
shmem.barrier_all()
# AMOs on one word of PE 0 from every PE; odd PEs use Vulkan shaders, even ones CUDA kernels
word = shmem.zeros(2, np.int64, domain="gpu")
w32 = shmem.zeros(2, np.int32, domain="gpu")
shmem.barrier_all()
use_cuda = getattr(acc, "cuda_amo", False)
if use_cuda:
    acc.cuda_amo = me % 2 == 0
amos0 = getattr(acc, "cuda_amos", 0)
K = 100
olds = [shmem.atomic_fetch_add(word[1:2], 1, 0) for _ in range(K)]
check(all(b > a for a, b in itertools.pairwise(olds)), f"fetch_add not increasing: {olds[:5]}")
for _ in range(K):
    shmem.atomic_add(w32[0:1], 3, 0)
swapped = 0
for _ in range(K):  # compare_swap races: each success moves the word on by one
    cur = int(shmem.atomic_fetch(word[0:1], 0))
    swapped += int(shmem.atomic_compare_swap(word[0:1], cur, cur + 1, 0) == cur)
shmem.barrier_all()
total = np.zeros(1, np.int64)
total[0] = swapped
everyone = shmem.zeros(n, np.int64)
shmem.put(everyone[me:me + 1], total, 0)
shmem.barrier_all()
if me == 0:
    got64 = word.to_numpy()
    check(int(got64[1]) == K * n, f"fetch_add total {int(got64[1])} != {K * n}")
    check(int(w32[0:1].to_numpy()[0]) == 3 * K * n, f"32-bit adds {w32.to_numpy()}")
    check(int(got64[0]) == int(everyone.sum()), f"compare_swap: word {int(got64[0])}, "
                                                 f"successes {int(everyone.sum())}")
if use_cuda:
    acc.cuda_amo = True
amos = getattr(acc, "cuda_amos", 0) - amos0
link = shmem._state.rt.domains.heaps[dom.spec.name].links[0]  # PE 0 on another GPU: a CUDA link
want_amo = expect_amo and (me % 2 == 0 or (link is not None and link.amos))
check((amos > 0) == want_amo, f"{amos} AMOs went through CUDA (expected "
                              f"{'some' if want_amo else 'none'})")
shmem.barrier_all()
used = getattr(acc, "cuda_copies", 0)
check((used > 0) == expect_cuda, f"{used} copies went through CUDA (expected "
                                 f"{'some' if expect_cuda else 'none'})")
for a in (x, y, c, word, w32):
    shmem.free(a)
shmem.free(everyone)
print(f"[pe {me}] gpu_cuda_copy ok: {used} copies and {amos} AMOs through CUDA", flush=True)
