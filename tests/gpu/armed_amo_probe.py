"""Probe (run by hand under ``vkshmem run -n 2`` on one NVIDIA GPU shared by both PEs, with
CuPy and cuda-bindings): can a fetch_add on the peer's GPU word cost less than CUDA's own
per-call copy, without a resident kernel (which two processes can only share under MPS)?

PE 1 allocates a word with CuPy and sends its CUDA IPC handle; PE 0 opens it and times, per
call (best of 5 rounds of 2000):

- ``copy``: an 8-byte ``cudaMemcpyAsync`` into the peer's word + stream synchronize (the
  reference the issue names);
- ``launch``: a one-thread ``atomicAdd`` kernel launched per call, its old value and a
  sequence number written to mapped pinned memory, the host spinning on the sequence (what
  vkshmem does today);
- ``armed``: the same kernel launched *before* the call behind ``cuStreamWaitValue32`` on a
  pinned host word, reading its operands from pinned memory: the call writes the operands
  and the word, spins on the sequence, then arms the next one (off the critical path);
- ``copy, armed``: ``copy`` again while both PEs hold an armed stream (does a stream blocked
  on a host word delay the other process's work?).
Both PEs arm a stream when ``armed`` runs (each releases its own at the end). Prints
microseconds per call. One H100, 2026-11-26: copy 9.79, launched per call (through CuPy)
15.34, armed 19.26 per call of which 9.64 from the word's write to the result, copy with
both PEs armed 10.88.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import cupy as cp
import numpy as np
from probe_timing import best_per_call

from vkshmem import shmem

try:
    from cuda.bindings import driver as cu
except ImportError:  # cuda-python before 12.6
    from cuda import cuda as cu

me = shmem.my_pe()
ROUNDS, ITERS = 5, 2000
SRC = r"""
struct args { unsigned long long addr, operand; unsigned int seq, op; };
extern "C" __global__ void armed(const volatile struct args *a, volatile unsigned long long *r) {
    unsigned long long *p = (unsigned long long *)a->addr;
    unsigned long long old = a->op ? atomicAdd(p, a->operand) : 0ull;
    r[0] = old;
    __threadfence_system();
    ((volatile unsigned int *)r)[2] = a->seq;
}
"""


def ok(res) -> None:
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")


kern = cp.RawKernel(SRC, "armed")
kern.compile()
stream = cp.cuda.Stream(non_blocking=True)  # the AMO kernels' (armed: blocked between calls)
copies = cp.cuda.Stream(non_blocking=True)
pin = cp.cuda.alloc_pinned_memory(4096)
mem = np.frombuffer(pin, np.uint8, 4096)
args = mem[0:32].view(np.uint64)      # addr, operand, (seq, op) as two uint32 below
args32 = mem[0:32].view(np.uint32)
res = mem[64:80].view(np.uint64)
res32 = mem[64:80].view(np.uint32)
flag = mem[128:132].view(np.uint32)
ARGS, RES, FLAG = pin.ptr, pin.ptr + 64, pin.ptr + 128
handle = shmem.zeros(64, np.uint8)
word_buf = cp.zeros(1, cp.uint64) if me == 1 else None
if me == 1:
    shmem.put(handle, np.frombuffer(cp.cuda.runtime.ipcGetMemHandle(word_buf.data.ptr),
                                    np.uint8), 0)
shmem.barrier_all()
peer_word = cp.cuda.runtime.ipcOpenMemHandle(bytes(handle), 1) if me == 0 else 0
seq = [0]
crit = [0.0]  # seconds from the host word's write to the result (armed calls)


def arm() -> None:
    """Queue the next AMO behind the host word (the GPU's front end waits, no SM busy)."""
    ok(cu.cuStreamWaitValue32(stream.ptr, FLAG, seq[0] + 1, 0))  # GEQ
    with stream:
        kern((1,), (1,), (np.uint64(ARGS), np.uint64(RES)))


def armed_call(addr: int, op: int = 1, rearm: bool = True) -> int:
    s = seq[0] + 1
    args[0], args[1] = addr, 1
    args32[4], args32[5] = s, op
    t = time.perf_counter()
    flag[0] = s  # the GPU's wait ends, the kernel runs
    while res32[2] != s:
        pass
    crit[0] += time.perf_counter() - t
    seq[0] = s
    if rearm:
        arm()
    return int(res[0])


def launch_call(addr: int) -> int:
    s = seq[0] + 1
    args[0], args[1] = addr, 1
    args32[4], args32[5] = s, 1
    with stream:
        kern((1,), (1,), (np.uint64(ARGS), np.uint64(RES)))
    while res32[2] != s:
        pass
    seq[0] = s
    return int(res[0])


src8 = cp.ones(1, cp.uint64)


def copy_call() -> None:
    cp.cuda.runtime.memcpyAsync(peer_word, src8.data.ptr, 8, 3, copies.ptr)
    copies.synchronize()


def timed(fn: Callable[[], object]) -> float:
    return best_per_call(fn, ITERS, ROUNDS, warm=20)


rows = []
if me == 0:
    rows.append(("copy 8 B (memcpyAsync + sync)", timed(copy_call)))
    rows.append(("fetch_add, kernel launched per call", timed(lambda: launch_call(peer_word))))
shmem.barrier_all()
arm()  # both PEs now hold an armed stream
shmem.barrier_all()
if me == 0:
    n0 = seq[0]
    rows.append(("fetch_add, armed kernel (call + re-arm)",
                 timed(lambda: armed_call(peer_word))))
    rows.append(("  of which the write -> result path", crit[0] / (seq[0] - n0) * 1e6))
    olds = [armed_call(peer_word) for _ in range(5)]
    print(f"armed fetch_add old values {olds} (consecutive: "
          f"{all(b == a + 1 for a, b in itertools.pairwise(olds))})", flush=True)
    rows.append(("copy 8 B, both PEs armed", timed(copy_call)))
shmem.barrier_all()
armed_call(0, op=0, rearm=False)  # release this PE's armed stream (op 0: no AMO)
stream.synchronize()
shmem.barrier_all()
if me == 0:
    print(f"{'one H100, 2 PEs, per call':44s} {'us':>7s}")
    for name, us in rows:
        print(f"{name:44s} {us:7.2f}", flush=True)
    cp.cuda.runtime.ipcCloseMemHandle(peer_word)
shmem.free(handle)
