"""Probe (run by hand on a two-GPU NVIDIA machine: ``VKSHMEM_GPU_PROVIDER=vulkan python -m
vkshmem run -n 2 tests/gpu/link_latency_probe.py``): where an 8-byte operation of the Vulkan
domain between GPUs spends its time. PE 0 times, layer by layer, a GPU->GPU put, a CPU->GPU
put and a fetch_add into PE 1's heap on the other GPU: through the API, through the CUDA link
(:class:`~vkshmem_cuda.vulkan_accel.link.CudaLink`) and through the C call under it; with the peer's
heap CPU-mapped (:mod:`~vkshmem.gpu.domain.peermap`) the small copies are CPU copies, timed against
the CUDA copy. Last, what a Vulkan device of this process on the other GPU (what the mapping
opens) costs in that GPU's memory."""

from __future__ import annotations

import time

import numpy as np
from probe_timing import median_call as med

from vkshmem import shmem
from vkshmem.core.transports.contract import AmoOp

me = shmem.my_pe()
s8 = shmem.zeros(8, np.uint8, domain="gpu")
d8 = shmem.zeros(8, np.uint8, domain="gpu")
word = shmem.zeros(1, np.uint64, domain="gpu")
heap = shmem._state.rt.domains.heaps[s8.domain.spec.name]
h8 = np.ones(8, np.uint8)


rows: list[tuple[str, float]] = []
if me == 0:
    link = heap.links[1]
    assert link is not None and link.direct, "PE 1 is not linked directly (two GPUs?)"
    hub = link.hub
    lib = hub._lib
    rows.append(("shmem.put GPU->GPU", med(lambda: shmem.put(d8, s8, 1))))
    rows.append(("link.put_device", med(lambda: link.put_device(d8.offset, s8.offset, 8))))
    dst, src = link._ptr + d8.offset, hub.view.pointer + s8.offset
    rows.append(("vkc_link_host d2d (C)", med(lambda: lib.vkc_link_host(
        0, hub.ctx_ptr, hub.stream_ptr, dst, src, 8, hub.spin_ns))))
    if link._map:
        rows.append(("mapped: CPU d2d (C)", med(lambda: lib.vkc_bar_copy(
            link._map + d8.offset, link._local + s8.offset, 8, 1))))
        rows.append(("mapped: no read-back (C)", med(lambda: lib.vkc_bar_copy(
            link._map + d8.offset, link._local + s8.offset, 8, 0))))
        rows.append(("shmem.get GPU<-GPU", med(lambda: shmem.get(d8, s8, 1))))
    rows.append(("shmem.get GPU->CPU", med(lambda: shmem.get(h8, s8, 1))))
    rows.append(("shmem.put CPU->GPU", med(lambda: shmem.put(d8, h8, 1))))
    rows.append(("link.put host", med(lambda: link.put(d8.offset, memoryview(h8)))))
    rows.append(("shmem.atomic_fetch_add", med(lambda: shmem.atomic_fetch_add(word, 1, 1))))
    rows.append(("link.amo", med(lambda: link.amo(word.offset, AmoOp.ADD, 8, 1, 0))))
    copier = link._copier
    addr = link._ptr + word.offset
    rows.append(("copier.amo_at", med(lambda: copier.amo_at(addr, int(AmoOp.ADD), 8, 1, 0))))
shmem.barrier_all()
for name, us in rows:
    print(f"{name:28s} {us:7.2f} us", flush=True)
if me == 0:  # the memory one more Vulkan device on the other GPU takes there
    from cuda.bindings import driver as cu

    from vkshmem.gpu.vk.instance import list_devices
    from vkshmem.gpu.vk.logical import LogicalDevice

    mine = heap.domain.device.info.device_uuid
    other = next(d for d in list_devices() if not d.is_cpu and d.device_uuid != mine)
    cu.cuInit(0)
    ordinal = next(i for i in range(cu.cuDeviceGetCount()[1])
                   if bytes(cu.cuDeviceGetUuid(cu.cuDeviceGet(i)[1])[1].bytes) ==
                   other.device_uuid)
    dev = cu.cuDeviceGet(ordinal)[1]
    ctx = cu.cuDevicePrimaryCtxRetain(dev)[1]
    prev = cu.cuCtxGetCurrent()[1]
    cu.cuCtxSetCurrent(ctx)
    free0 = cu.cuMemGetInfo()[1]
    extra = LogicalDevice(other.index)
    time.sleep(0.5)
    free1 = cu.cuMemGetInfo()[1]
    extra.close()
    cu.cuCtxSetCurrent(prev)
    cu.cuDevicePrimaryCtxRelease(dev)
    print(f"a Vulkan device on GPU {ordinal}: {(free0 - free1) / 2**20:.0f} MiB there", flush=True)
shmem.barrier_all()
