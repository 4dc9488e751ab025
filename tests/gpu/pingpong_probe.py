"""Round trip of a resident CUDA kernel polling mapped pinned host memory (run by hand on an
NVIDIA machine with CuPy: ``python tests/gpu/pingpong_probe.py``): the host stores a sequence
number, the kernel sees it and stores it back, the host sees that. Variants of the kernel's
poll (volatile load or ld.acquire.sys, with or without reading %globaltimer each turn) and of
its reply (with or without __threadfence_system first) show where a service kernel's time
goes."""

from __future__ import annotations

import ctypes
import time

import cupy as cp
import numpy as np

SRC = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 acq(const u64 *p) {
    u64 v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 gtime() {
    u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
extern "C" __global__ void pong(u64 *box, int mode, u64 rounds) {
    /* box[0]: host's seq, box[8]: the kernel's reply (another cache line) */
    u64 last = 0, sink = 0;
    for (u64 r = 0; r < rounds; ++r) {
        u64 s;
        for (;;) {
            s = (mode & 1) ? acq(&box[0]) : ((volatile u64 *)box)[0];
            if (mode & 2) sink += gtime();
            if (s != last) break;
        }
        if (mode & 4) __threadfence_system();
        ((volatile u64 *)box)[8] = s + (sink & 0);
        last = s;
    }
}
"""


def main() -> None:
    mod = cp.RawModule(code=SRC, options=("-std=c++14",))
    fn = mod.get_function("pong")
    mem = cp.cuda.alloc_pinned_memory(4096)
    box = np.frombuffer(mem, np.uint64, 16)
    dptr = mem.ptr  # unified addressing: the host pointer works on the device
    rounds = 20000
    stream = cp.cuda.Stream(non_blocking=True)
    names = {0: "volatile poll", 1: "acquire poll", 2: "volatile + globaltimer",
             3: "acquire + globaltimer", 4: "volatile, fence before reply",
             5: "acquire, fence before reply", 7: "acquire + globaltimer + fence"}
    for mode, name in names.items():
        box[:] = 0
        fn((1,), (1,), (np.uint64(dptr), np.int32(mode), np.uint64(rounds)), stream=stream)
        addr = box.ctypes.data
        seq = ctypes.c_uint64.from_address(addr)
        reply = ctypes.c_uint64.from_address(addr + 64)
        t0 = time.perf_counter()
        for s in range(1, rounds + 1):
            seq.value = s
            while reply.value != s:
                pass
        dt = (time.perf_counter() - t0) / rounds
        stream.synchronize()
        print(f"{name:<34} {dt * 1e6:7.2f} us per round trip")


if __name__ == "__main__":
    main()
