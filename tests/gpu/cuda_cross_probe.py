"""Probe (run by hand on a two-GPU NVIDIA machine: ``VKSHMEM_GPU_PROVIDER=cuda python -m vkshmem
run -n 2 tests/gpu/cuda_cross_probe.py``): where an 8-byte operation of the ``cuda`` domain
between GPUs spends its time. PE 0 times, layer by layer, a GPU->GPU put, a CPU->GPU put, a
GPU->CPU get and a fetch_add on PE 1's heap on the other GPU: the API, the domain heap, the
domain and the service kernel's C call under them (median of 3000 calls each). With the heaps
CPU-mapped (``VKSHMEM_CUDA_CPU_MAP``, :mod:`vkshmem_cuda.cpumap`) the small copies are CPU
copies; the last rows count them and say where the service's requests sit."""

from __future__ import annotations

import numpy as np
from probe_timing import median_call as med

from vkshmem import shmem
from vkshmem.core.transports.contract import AmoOp

me = shmem.my_pe()
s8 = shmem.zeros(8, np.uint8, domain="gpu")
d8 = shmem.zeros(8, np.uint8, domain="gpu")
word = shmem.zeros(1, np.int64, domain="gpu")
heap = shmem._state.rt.domains.heaps[s8.domain.spec.name]
dom = heap.domain
h8 = np.ones(8, np.uint8)
hv = memoryview(h8)


rows: list[tuple[str, float]] = []
if me == 0:
    peer = heap.direct[1]
    assert peer is not None, "PE 1's heap is not mapped here"
    svc = dom.service
    rows.append(("shmem.put GPU->GPU", med(lambda: shmem.put(d8, s8, 1))))
    put_device = heap.transfers.put_device
    rows.append(("heap.transfers.put_device", med(lambda: put_device(1, d8.offset, s8.offset,
                                                                      8))))
    rows.append(("domain.copy", med(lambda: dom.copy(peer, d8.offset, dom.local, s8.offset,
                                                       8))))
    dst, src = peer.va + d8.offset, dom.local.va + s8.offset
    if svc is not None:
        rows.append(("service.copy", med(lambda: svc.copy(dst, src, 8))))
        c, h = svc._call_c, svc._h
        res, tmo = svc._result, svc.timeout_ns
        rows.append(("vkc_svc_call copy (C)", med(lambda: c(h, 1, 0, dst, src, 8, 0, 0, 0, 0,
                                                             res, tmo))))
    rows.append(("stream dtod (C)", med(lambda: dom.device.dtod(dst, src, 8))))
    rows.append(("shmem.put CPU->GPU", med(lambda: shmem.put(d8, h8, 1))))
    rows.append(("heap.put", med(lambda: heap.put(1, heap.seg_id, d8.offset, hv))))
    rows.append(("domain.write", med(lambda: dom.write(peer, d8.offset, hv))))
    if svc is not None:
        ha = h8.ctypes.data
        rows.append(("service.write", med(lambda: svc.write(dst, ha, 8))))
    rows.append(("shmem.get GPU->CPU", med(lambda: shmem.get(h8, s8, 1))))
    rows.append(("domain.read", med(lambda: dom.read(peer, s8.offset, hv))))
    rows.append(("shmem.atomic_fetch_add", med(lambda: shmem.atomic_fetch_add(word, 1, 1))))
    rows.append(("heap.amo", med(lambda: heap.amo(1, heap.seg_id, word.offset, AmoOp.ADD, 8, 1,
                                                   0))))
    waddr = peer.va + word.offset
    if svc is not None:
        rows.append(("service.amo", med(lambda: svc.amo(waddr, int(AmoOp.ADD), 8, 1, 0))))
    rows.append(("kernel amo (C)", med(lambda: dom.device.amo(waddr, int(AmoOp.ADD), 8, 1,
                                                              0))))
    rows.append(("service launches", float(svc.launches if svc is not None else -1)))
    rows.append(("CPU copies (mapped heaps)", float(dom.mapped_calls)))
    rows.append(("requests in GPU memory", float(svc is not None and svc.requests_on_gpu)))
shmem.barrier_all()
for name, us in rows:
    print(f"{name:28s} {us:7.2f} us", flush=True)
