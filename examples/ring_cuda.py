"""GPU-initiated communication from a CUDA kernel on the cuda domain
(docs/guide/gpu-initiated.md): each PE's kernel puts 4 KiB into the next PE's array with a
signal, through the device API header. Run with
``VKSHMEM_GPU_PROVIDER=cuda vkshmem run -n 2 examples/ring_cuda.py`` (CuPy, a CUDA GPU)."""

import cupy as cp
import numpy as np
import vkshmem_cuda

from vkshmem import shmem

shmem.init()
a = shmem.zeros(1024, np.uint32, domain="gpu")  # 4096 bytes on every PE
s = shmem.new_signal(domain="gpu")
cp.cuda.Device(a.domain.device.ordinal).use()  # this PE's GPU: its heap is mapped there
src = '#include "vkshmem_device.cuh"\n' + r"""
extern "C" __global__ void ring(const vks_ctx *c, unsigned long long off, unsigned long long sig) {
    int next = (vks_my_pe(c) + 1) % vks_n_pes(c);
    vks_putmem_signal_block(c, next, off, off, 4096, sig, 1, VKS_SIGNAL_ADD);
}"""
k = cp.RawKernel(src, "ring", options=("-I" + vkshmem_cuda.include_dir(),))
k((1,), (128,), (np.uint64(shmem.device_context()), np.uint64(a.offset), np.uint64(s.offset)))
shmem.signal_wait_until(s, shmem.CMP.GE, 1)  # the previous PE's kernel has put and signalled
cp.cuda.get_current_stream().synchronize()  # this PE's kernel is done before the heap goes
shmem.barrier_all()
shmem.finalize()
