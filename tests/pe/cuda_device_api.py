"""The CUDA device API (plugins/cuda/vkshmem_cuda/include/vkshmem_device.cuh) from a CuPy
RawKernel on the ``cuda`` domain: thread/warp/block puts and gets, p/g, put_signal, a kernel
waiting for another PE's signal, AMOs, concurrent atomics from every block of every PE and from
the hosts, the device barrier, and a bounded wait that gives up. Needs CuPy and a CUDA GPU."""

from __future__ import annotations

import cupy as cp
import numpy as np
import vkshmem_cuda
from _common import check

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
HOST_ADDS = 50

SOURCE = r"""
#include "vkshmem_device.cuh"
typedef unsigned long long u64;

__device__ unsigned f(unsigned salt, int pe, unsigned j) { return salt + 65536u * pe + j; }

extern "C" __global__ void phase(const vks_ctx *c, u64 buf, u64 dst, u64 words, u64 res_off,
                                 int mode, unsigned salt, unsigned rounds) {
    int me = vks_my_pe(c), n = vks_n_pes(c);
    int right = (me + 1) % n, left = (me + n - 1) % n;
    unsigned *b = (unsigned *)vks_local(c, buf);
    unsigned *d = (unsigned *)vks_local(c, dst);
    u64 *w = (u64 *)vks_local(c, words);
    u64 *res = (u64 *)vks_local(c, res_off);
    unsigned t = threadIdx.x;
    if (mode == 0) {            /* 1 block of 128 */
        for (unsigned j = t; j < 4096; j += blockDim.x) b[j] = f(salt, me, j);
        __syncthreads();
        if (t == 0) {
            vks_putmem(c, right, dst, buf, 4096);                 /* words [0, 1024) */
            vks_fence(c);
            vks_p<u64>(c, right, words, salt + me);                /* words[0] */
            vks_quiet(c);
            vks_signal_op(c, right, words + 8, 1, VKS_SIGNAL_ADD);  /* words[1] */
            res[0] = vks_ptr(c, right, 0) != nullptr;
        }
        if (t < 32)                                                 /* warp: [1024, 2048) */
            vks_putmem_warp(c, right, dst + 4096, buf + 4096, 4096);
        __syncthreads();
        vks_putmem_signal_block(c, right, dst + 8192, buf + 8192, 4096, words + 13 * 8, 1,
                                VKS_SIGNAL_ADD);                    /* block: [2048, 3072) */
    } else if (mode == 1) {     /* 1 block of 128 */
        if (t == 0) {
            u64 sig = 0;
            res[20] = vks_signal_wait_until(c, words + 13 * 8, VKS_CMP_GE, rounds, &sig);
            unsigned bad = 0;
            for (unsigned j = 0; j < 3072; ++j) bad += d[j] != f(salt, left, j);
            res[1] = bad;
            res[2] = w[0];
            res[3] = w[1];
            vks_getmem(c, right, dst + 12288, buf, 1024);
            bad = 0;
            for (unsigned j = 0; j < 256; ++j) bad += d[3072 + j] != f(salt, right, j);
            res[4] = bad;
            res[5] = vks_g<u64>(c, right, words);
            res[6] = vks_atomic_fetch_add(c, right, words + 2 * 8, 5);
            res[7] = vks_atomic_fetch_add(c, right, words + 2 * 8, 1);
            res[8] = vks_atomic_compare_swap(c, right, words + 3 * 8, 0, 77);
            res[9] = vks_atomic_compare_swap(c, right, words + 3 * 8, 0, 88);
            res[10] = vks_atomic_swap(c, right, words + 4 * 8, 9);
            vks_atomic_fetch_or(c, right, words + 5 * 8, 0xF0);
            vks_atomic_fetch_xor(c, right, words + 5 * 8, 0x3C);
            vks_atomic_fetch_and(c, right, words + 5 * 8, 0xFF);
            res[11] = vks_atomic_fetch(c, right, words + 5 * 8);
            res[12] = vks_atomic_fetch_add32(c, right, words + 6 * 8, 3);
            res[13] = vks_atomic_fetch_add32(c, right, words + 6 * 8, 0);
        }
        vks_getmem_block(c, right, dst + 16384, buf, 8192);         /* [4096, 6144) */
        if (t == 0) {
            unsigned bad = 0;
            for (unsigned j = 0; j < 2048; ++j) bad += d[4096 + j] != f(salt, right, j);
            res[24] = bad;
        }
    } else if (mode == 2) {     /* 8 blocks of 128: every thread adds to PE 0's words[10] */
        vks_atomic_fetch_add(c, 0, words + 10 * 8, 1);
    } else if (mode == 3) {     /* 1 thread: barriers */
        unsigned bad = 0, failed = 0;
        for (unsigned i = 0; i < rounds; ++i) {
            vks_p<u64>(c, right, words + 14 * 8, salt + i);
            failed += !vks_barrier_all(c);
            bad += *(volatile u64 *)&w[14] != salt + i;
            failed += !vks_barrier_all(c);
        }
        res[32] = bad;
        res[33] = failed;
    } else if (mode == 4) {     /* 1 thread: an unsatisfiable wait gives up */
        res[40] = !vks_wait_until(c, words + 15 * 8, VKS_CMP_EQ, 12345, 1000);
    }
}
"""

buf = shmem.zeros(4096, np.uint32, domain="gpu")
dst = shmem.zeros(6144, np.uint32, domain="gpu")
words = shmem.zeros(32, np.uint64, domain="gpu")
res = shmem.zeros(64, np.uint64, domain="gpu")
ctx = shmem.device_context()
check(res.domain.spec.name == "cuda", f"domain {res.domain.spec.name}")
cp.cuda.Device(res.domain.device.ordinal).use()
kernel = cp.RawKernel(SOURCE, "phase", options=("-I" + vkshmem_cuda.include_dir(),
                                                "--std=c++17"))


def run(mode: int, blocks: int, threads: int, salt: int, rounds: int) -> np.ndarray:
    res.copy_from(np.zeros(64, np.uint64))
    shmem.barrier_all()
    kernel((blocks,), (threads,), (np.uint64(ctx), np.uint64(buf.offset), np.uint64(dst.offset),
                                   np.uint64(words.offset), np.uint64(res.offset),
                                   np.int32(mode), np.uint32(salt), np.uint32(rounds)))
    if mode == 2:
        for _ in range(HOST_ADDS):
            shmem.atomic_add(words[10:11], 1, 0)
    cp.cuda.get_current_stream().synchronize()
    shmem.barrier_all()
    return res.to_numpy()


ramp = np.arange(6144)


def f(pe: int, j: np.ndarray, salt: int) -> np.ndarray:
    return (salt + 65536 * pe + j).astype(np.uint32)


for rnd in (1, 2):
    salt = 1000 * rnd
    w = np.zeros(32, np.uint64)
    w[1], w[13] = rnd - 1, rnd - 1
    words.copy_from(w)
    shmem.barrier_all()
    r = run(0, 1, 128, salt, rnd)
    check(r[0] == 1, "every PE of the node is reachable")
    r = run(1, 1, 128, salt, rnd)
    check(r[20] == 1, f"round {rnd}: the wait for PE {left}'s block signal gave up")
    check(r[1] == 0, f"round {rnd}: {r[1]} words put by PE {left} wrong")
    check(r[2] == salt + left and r[3] == rnd, f"round {rnd}: p/signal {r[2]}, {r[3]}")
    check(r[4] == 0 and r[24] == 0, f"round {rnd}: get {r[4]}, get_block {r[24]} wrong")
    check(r[5] == salt + me, f"round {rnd}: g {r[5]}")  # right's words[0], put by this PE
    check(list(r[6:14]) == [0, 5, 0, 77, 0, 0xCC, 0, 3], f"round {rnd}: AMOs {list(r[6:14])}")
    check(np.array_equal(dst.to_numpy()[4096:6144], f(right, ramp[:2048], salt)), "get data")
    r = run(2, 8, 128, salt, rnd)
    if me == 0:
        got = words.to_numpy()[10]
        check(got == n * (8 * 128 + HOST_ADDS), f"round {rnd}: concurrent adds {got}")
    r = run(3, 1, 1, salt, 3)
    check(r[33] == 0 and r[32] == 0, f"round {rnd}: barriers failed {r[33]}, bad {r[32]}")
r = run(4, 1, 1, 0, 1)
check(r[40] == 1, "an unsatisfiable wait gives up")
print(f"cuda_device_api ok: PE {me} of {n}", flush=True)
