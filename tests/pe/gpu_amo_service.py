"""AMOs through the Vulkan domain's CUDA service kernel (vkshmem_cuda/service_kernel.py), run with
VKSHMEM_GPU_CUDA_SERVICE=on and an idle limit longer than the script, so the kernel ends only
when parked (requests in pinned host memory, or with VKSHMEM_TEST_GPU_BOX=1 in the CPU-mapped
heap's control bytes): every PE's fetch_adds on one word of PE 0 come back strictly
increasing and none is lost; a Vulkan submission parks a resident kernel (a shader AMO here)
and the next AMO launches it again with the right value; a word that half the PEs change
through Vulkan shaders and half through the service loses no update. On NVIDIA with
cuda-bindings and NVRTC; run under ``vkshmem run``."""

from __future__ import annotations

import itertools
import os

import numpy as np
from _common import check

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
word = shmem.zeros(4, np.int64, domain="gpu")
dom = word.domain
shmem.barrier_all()
K = 200
olds = [shmem.atomic_fetch_add(word[0:1], 1, 0) for _ in range(K)]
check(all(b > a for a, b in itertools.pairwise(olds)), f"fetch_add not increasing: {olds[:5]}")
svc = dom.accel.cuda_service
check(svc is not None and svc.launches >= 1,
      f"no service kernel (VKSHMEM_GPU_CUDA_SERVICE=on): {svc}")
assert svc is not None
on_gpu = os.environ.get("VKSHMEM_TEST_GPU_BOX") == "1"  # the heap CPU-mapped: requests there
check(svc.requests_on_gpu == on_gpu, f"requests on the GPU: {svc.requests_on_gpu}")
shmem.barrier_all()
if me == 0:
    check(int(word[0:1].to_numpy()[0]) == K * n, f"fetch_add total {word[0:1].to_numpy()}")
shmem.barrier_all()

# park: resident after an AMO, parked by the next Vulkan submission, launched again after it
before = shmem.atomic_fetch_add(word[1:2], 5, me)
launches, parks = svc.launches, svc.parks
dom.accel.cuda_amo = False  # this PE's AMOs on Vulkan shaders: a submission
shmem.atomic_add(word[1:2], 7, me)
dom.accel.cuda_amo = True
check(svc.parks == parks + 1, f"a Vulkan submission did not park the kernel ({svc.parks})")
got = shmem.atomic_fetch_add(word[1:2], 1, me)
check(got == before + 12, f"fetch_add after a park: {got}, expected {before + 12}")
check(svc.launches == launches + 1, f"{svc.launches - launches} launches after a park")
check(int(word[1:2].to_numpy()[0]) == before + 13, f"word after a park: {word[1:2].to_numpy()}")

# one word, odd PEs through Vulkan shaders, even ones through the service
shmem.barrier_all()
dom.accel.cuda_amo = me % 2 == 0
for _ in range(K):
    shmem.atomic_add(word[2:3], 3, 0)
dom.accel.cuda_amo = True
shmem.barrier_all()
if me == 0:
    check(int(word[2:3].to_numpy()[0]) == 3 * K * n, f"mixed adds {word[2:3].to_numpy()}")
shmem.barrier_all()
print(f"PE {me}: gpu_amo_service ok ({svc.launches} launches, {svc.parks} parks)", flush=True)
