"""Probe (run by hand, on a GPU): does work on the device's first queue run while a user kernel
spins on the launch queue? A put_signal kernel whose ring nobody drains spins in vks_quiet
until its bounded wait gives up; meanwhile the host times a staged 8-byte write on the first
queue, on the launch queue's device, and on a second VkDevice."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from vkshmem.gpu import Ring, UserKernel, VulkanDevice, pack_push

SPV = Path(__file__).parent / "shaders" / "put_signal.spv"


def trial(dev: VulkanDevice, other: VulkanDevice | None, label: str) -> None:
    heap = dev.alloc_exportable(1 << 16)
    ring = Ring.create(dev, 64)
    k = UserKernel(dev, SPV, heap=heap, ring=ring, my_pe=0, n_pes=1)
    target = other.alloc(4096) if other is not None else dev.alloc(4096)
    tdev = other if other is not None else dev
    push = pack_push(np.uint64(0), np.uint64(4096), np.uint64(8192), np.uint64(12288),
                     np.uint32(64), np.uint32(1), np.uint32(1), np.uint32(1))
    t0 = time.perf_counter()
    launch = k.dispatch(1, push=push)
    time.sleep(0.001)
    t1 = time.perf_counter()
    tdev.write(target, 0, b"12345678")
    t2 = time.perf_counter()
    launch.wait(10)
    t3 = time.perf_counter()
    status = bytearray(4)
    dev.read(heap, 12288, status)
    print(f"{label}: queues={dev.queue_count} write took {1e3 * (t2 - t1):.2f} ms, kernel "
          f"ended after {1e3 * (t3 - t0):.2f} ms, status {int.from_bytes(status, 'little')}",
          flush=True)
    k.close()
    ring.close()
    heap.free()
    target.free()


dev = VulkanDevice()
trial(dev, None, "same device (first queue vs launch queue)")
other = VulkanDevice()
trial(dev, other, "second VkDevice")
other.close()
dev.close()
