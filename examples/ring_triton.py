"""GPU-initiated communication from Triton kernels on the cuda domain
(docs/guide/gpu-initiated.md): each PE's kernel puts a block into the next PE's array and
signals it; each PE's second kernel waits for its own signal and sums what arrived. Run with
``VKSHMEM_GPU_PROVIDER=cuda vkshmem run -n 2 examples/ring_triton.py`` (PyTorch with Triton, a
CUDA GPU)."""

import numpy as np
import torch
import triton
import triton.language as tl
from vkshmem_cuda import triton_device as vks

from vkshmem import shmem

shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
N, BLOCK = 1 << 16, 1024
src = shmem.zeros(N, np.float32, domain="gpu")
dst = shmem.zeros(N, np.float32, domain="gpu")
sig = shmem.zeros(1, np.int32, domain="gpu")
dev = torch.device("cuda", src.domain.device.ordinal)
torch.cuda.set_device(dev)  # Triton launches on the current device: this PE's GPU
t = torch.from_dlpack  # no copy: the heap's memory, on the device the view names


@triton.jit
def put_signal(src, dst_peer, sig_peer, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_peer + offs, tl.load(src + offs))  # a put: the peer's memory
    tl.debug_barrier()  # every thread's stores before the one thread's signal
    vks.signal_add(sig_peer, 1)  # release: the stores above land first


@triton.jit
def total(dst, sig, want, out, BLOCK: tl.constexpr):
    if vks.signal_wait_until_ge(sig, want, 1 << 22):  # acquire, bounded
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.atomic_add(out, tl.sum(tl.load(dst + offs), axis=0))


t(src).fill_(me + 1.0)
torch.cuda.synchronize(dev)
shmem.barrier_all()  # every PE's source is written
grid = (N // BLOCK,)
put_signal[grid](t(src), t(shmem.ptr(dst, (me + 1) % n)), t(shmem.ptr(sig, (me + 1) % n)),
                 BLOCK=BLOCK)
out = torch.zeros(1, dtype=torch.float32, device=dev)
total[grid](t(dst), t(sig), N // BLOCK, out, BLOCK=BLOCK)
torch.cuda.synchronize(dev)
assert out.item() == N * ((me - 1) % n + 1.0)
shmem.barrier_all()
shmem.finalize()
