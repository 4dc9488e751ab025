"""The Triton device API (vkshmem_cuda.triton_device) on the ``cuda`` domain: each PE's Triton
kernel stores a block into the next PE's array through shmem.ptr's peer view, then signals it
(release, system scope); after a host barrier each PE's second kernel waits on its signal
(acquire) and checks the block; every program of every PE fetch_adds PE 0's counter, and a
compare_swap and a wait that gives up. Needs PyTorch with Triton and a CUDA GPU."""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from _common import check
from vkshmem_cuda import triton_device as vks

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
N, BLOCK = 1 << 16, 1024


@triton.jit
def put_signal(src, dst_peer, sig_peer, count_peer, n_elems, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elems
    tl.store(dst_peer + offs, tl.load(src + offs, mask=mask), mask=mask)
    vks.fence()
    tl.debug_barrier()  # every thread has stored and fenced before the one thread signals
    vks.signal_add(sig_peer, 1)  # one per program
    vks.fetch_add(count_peer, 1)  # every program of every PE adds to PE 0's counter


@triton.jit
def check_block(dst, sig, want_sig, expect_base, result, n_elems, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    ok = vks.signal_wait_until_ge(sig, want_sig, 1 << 20)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elems
    got = tl.load(dst + offs, mask=mask, other=0.0)
    bad = tl.sum(tl.where(mask & (got != expect_base + offs.to(tl.float32)), 1, 0), axis=0)
    tl.atomic_add(result, bad)
    tl.atomic_add(result + 1, tl.where(ok, 0, 1))


@triton.jit
def cas_and_timeout(word, result):
    old1 = vks.compare_swap(word, 0, 77)
    old2 = vks.compare_swap(word, 0, 88)
    tl.store(result, old1)
    tl.store(result + 1, old2)
    never = vks.signal_wait_until_ge(word + 1, 12345, 1000)
    tl.store(result + 2, tl.where(never, 1, 0))


src = shmem.zeros(N, np.float32, domain="gpu")
dst = shmem.zeros(N, np.float32, domain="gpu")
sig = shmem.zeros(2, np.int32, domain="gpu")
count = shmem.zeros(2, np.int32, domain="gpu")
check(src.domain.spec.name == "cuda", f"domain {src.domain.spec.name}")
dev = torch.device("cuda", src.domain.device.ordinal)


def t(a: object) -> torch.Tensor:
    # DLPack names this PE's GPU; torch.as_tensor would ask CUDA where a peer's pointer
    # lives (the peer's GPU, with one GPU per PE) and copy it to dev
    return torch.from_dlpack(a)


grid = (N // BLOCK,)
for rnd in (1, 2):
    base = 1000.0 * rnd + 100000.0 * me
    t(src).copy_(torch.arange(N, dtype=torch.float32, device=dev) + base)
    torch.cuda.synchronize(dev)
    shmem.barrier_all()
    put_signal[grid](t(src), t(shmem.ptr(dst, right)), t(shmem.ptr(sig, right)),
                     t(shmem.ptr(count, 0)), N, BLOCK=BLOCK)
    torch.cuda.synchronize(dev)
    shmem.barrier_all()
    result = torch.zeros(2, dtype=torch.int32, device=dev)
    check_block[grid](t(dst), t(sig), rnd * (N // BLOCK), 1000.0 * rnd + 100000.0 * left,
                      result, N, BLOCK=BLOCK)
    torch.cuda.synchronize(dev)
    bad, gave_up = result.tolist()
    check(bad == 0 and gave_up == 0, f"round {rnd}: {bad} wrong, {gave_up} waits gave up")
    shmem.barrier_all()
    if me == 0:
        got = int(count.to_numpy()[0])
        check(got == rnd * n * (N // BLOCK), f"round {rnd}: counter {got}")
    shmem.barrier_all()
word = shmem.zeros(2, np.int32, domain="gpu")
out = torch.zeros(3, dtype=torch.int32, device=dev)
cas_and_timeout[(1,)](t(word), out)
torch.cuda.synchronize(dev)
check(out.tolist() == [0, 77, 0], f"compare_swap / bounded wait: {out.tolist()}")
shmem.barrier_all()
print(f"cuda_triton ok: PE {me} of {n}", flush=True)
