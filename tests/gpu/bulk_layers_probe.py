"""Probe (on an NVIDIA GPU, 2 PEs sharing it, Vulkan domain): where a bulk GPU->GPU put's time
goes, layer by layer, against the same copy with nothing around it. PE 0 copies 1, 16 and
64 MiB into PE 1's heap, each complete on return, through (a) shmem.put, (b) the domain's
``copy``, (c) the CUDA copier's ``d2d``, (d) cuda-bindings cuMemcpyDtoDAsync + stream
synchronize on the same pointers, (e) libcuda through ctypes on the same pointers, (f) the
same ctypes copy between two cuMemAlloc buffers, (g) CuPy memcpyAsync + synchronize between
two CuPy buffers. Then the same for a fetch_add on PE 1's word: shmem.atomic_fetch_add, the
domain's ``amo``, the copier's ``amo``. Prints µs per call (median of 5 rounds).

    VKSHMEM_GPU_PROVIDER=vulkan VKSHMEM_GPU_SYMMETRIC_SIZE=512M vkshmem run -n 2 \
        tests/gpu/bulk_layers_probe.py
"""

from __future__ import annotations

import ctypes

import numpy as np
from probe_timing import per_call

from vkshmem import shmem

me = shmem.my_pe()
SIZES = [1 << 20, 16 << 20, 64 << 20]
top = max(SIZES)
g_src = shmem.zeros(top, np.uint8, domain="gpu")
g_dst = shmem.zeros(top, np.uint8, domain="gpu")
shmem.barrier_all()


if me == 0:
    from vkshmem._api import state

    heap = state.rt.domains.domain("gpu")
    dom = heap.domain
    peer_mem = heap.direct[1]
    rows: dict[str, list[float]] = {}
    for s in SIZES:
        rows.setdefault("shmem.put", []).append(
            per_call(lambda s=s: shmem.put(g_dst[:s], g_src[:s], 1), warm=5))
        rows.setdefault("domain.copy", []).append(per_call(
            lambda s=s: dom.copy(peer_mem, g_dst.offset, dom.memory, g_src.offset, s)))
    copier = dom.accel.copier(top)
    assert copier is not None, "no CUDA copier"
    dptr = copier.pointer(peer_mem) + g_dst.offset
    sptr = copier.pointer(dom.memory) + g_src.offset
    cu = copier._cu
    stream = copier._stream
    for s in SIZES:
        rows.setdefault("copier.d2d", []).append(per_call(lambda s=s: copier.d2d(dptr, sptr, s)))

        def bindings(s: int = s) -> None:
            cu.cuMemcpyDtoDAsync(dptr, sptr, s, stream)
            cu.cuStreamSynchronize(stream)

        rows.setdefault("cuda-bindings", []).append(per_call(bindings))
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t,
                                         ctypes.c_void_p]
    lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    hstream = ctypes.c_void_p(int(stream))
    a, b = ctypes.c_uint64(), ctypes.c_uint64()
    assert lib.cuMemAlloc_v2(ctypes.byref(a), top) == 0
    assert lib.cuMemAlloc_v2(ctypes.byref(b), top) == 0
    for s in SIZES:
        def raw(d: int = dptr, src: int = sptr, s: int = s) -> None:
            lib.cuMemcpyDtoDAsync_v2(d, src, s, hstream)
            lib.cuStreamSynchronize(hstream)

        rows.setdefault("ctypes, heap", []).append(per_call(raw))
        rows.setdefault("ctypes, cuMemAlloc", []).append(
            per_call(lambda s=s: raw(a.value, b.value, s)))
    try:
        import cupy as cp

        x, y = cp.zeros(top, cp.uint8), cp.zeros(top, cp.uint8)
        st = cp.cuda.Stream(non_blocking=True)
        for s in SIZES:
            def cpy(s: int = s) -> None:
                cp.cuda.runtime.memcpyAsync(y.data.ptr, x.data.ptr, s, 3, st.ptr)
                st.synchronize()

            rows.setdefault("cupy", []).append(per_call(cpy))
    except ImportError:
        pass
    from vkshmem.core.transports.contract import AmoOp

    word = g_dst[:8].view(np.int64)
    amo_rows = {
        "shmem.atomic_fetch_add": per_call(lambda: shmem.atomic_fetch_add(word, 1, 1), 2000),
        "domain.amo": per_call(lambda: dom.amo(peer_mem, word.offset, AmoOp.ADD, 8, 1, 0), 2000),
        "copier.amo": per_call(lambda: copier.amo(peer_mem, word.offset, int(AmoOp.ADD), 8, 1, 0),
                               2000),
    }
    print("AMO layers, µs per call:", ", ".join(f"{k} {v:.1f}" for k, v in amo_rows.items()))
    print("bulk layers, µs per copy:", " ".join(f"{s >> 20} MiB" for s in SIZES))
    for name, vals in rows.items():
        print(f"  {name:20s}" + "".join(f"{v:10.1f}" for v in vals), flush=True)
shmem.barrier_all()
