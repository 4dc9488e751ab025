"""Probe of user kernels with a ring service on a real device (run by hand:
python tests/gpu/launch_probe.py [--validation]).

Runs tests/gpu/shaders/put_signal.spv (a put-with-signal per workgroup, then a quiet) on one
PE whose "GPU heap" is alloc_mapped memory, with a RingService performing the requests through
the CPU mapping, and reports the launch time and whether every quiet returned. Then the same
with a handler that performs the put by a device-to-device copy on the device's own queue:
that copy runs only after the kernel ends, so the kernel's quiet gives up (status 3) — why a
handler must not wait for work on the queue of the kernel it serves.
"""

from __future__ import annotations

import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np

from vkshmem.gpu import (
    Descriptor,
    GpuMemory,
    Ring,
    RingOp,
    RingService,
    SignalOp,
    UserKernel,
    VulkanDevice,
    pack_push,
)

SPV = Path(__file__).parent / "shaders" / "put_signal.spv"
SRC, DST, SIG, STATUS = 0, 1 << 20, 2 << 20, (2 << 20) + 4096


def handler_for(dev: VulkanDevice, heap: GpuMemory, view: memoryview, queue_copy: bool):
    def handle(d: Descriptor) -> None:
        if d.op in (RingOp.PUT, RingOp.PUT_SIGNAL):
            if queue_copy:
                dev.copy(heap, d.dst, heap, d.src, d.nbytes, timeout=60)
            else:
                view[d.dst:d.dst + d.nbytes] = bytes(view[d.src:d.src + d.nbytes])
        if d.op in (RingOp.SIGNAL, RingOp.PUT_SIGNAL):
            old = struct.unpack_from("<Q", view, d.signal_offset)[0]
            new = old + d.value if d.signal_op == SignalOp.ADD else d.value
            struct.pack_into("<Q", view, d.signal_offset, new)
    return handle


def run(dev: VulkanDevice, count: int, reps: int, queue_copy: bool) -> None:
    heap = dev.alloc_mapped(4 << 20)
    view = heap.map()
    assert view is not None
    view[:] = bytes(len(view))
    ring = Ring.create(dev, 4096)
    groups = -(-count // 64)
    push = pack_push(np.uint64(SRC), np.uint64(DST), np.uint64(SIG), np.uint64(STATUS),
                     np.uint32(count), np.uint32(7), np.uint32(SignalOp.ADD), np.uint32(1))
    times = []
    svc = RingService(ring, handler_for(dev, heap, view, queue_copy))
    with UserKernel(dev, SPV, heap=heap, ring=ring) as k, svc:
        for _ in range(reps):
            t0 = time.perf_counter()
            k.run(groups, push=push)
            times.append(time.perf_counter() - t0)
    svc_handled = svc.handled
    status = np.frombuffer(view, np.uint32, groups, STATUS).copy()
    data = np.frombuffer(view, np.uint32, count, DST).copy()
    want = (7 + np.arange(count, dtype=np.uint64)).astype(np.uint32)
    sig = struct.unpack_from("<Q", view, SIG)[0]
    how = "queue copy" if queue_copy else "CPU mapping"
    print(f"{how}: count={count} ({groups} workgroups) x {reps}: launch median "
          f"{1e3 * statistics.median(times):.2f} ms (min {1e3 * min(times):.2f}), "
          f"handled {svc_handled}, statuses {sorted(set(status.tolist()))} (1 = quiet returned), "
          f"data {'ok' if np.array_equal(data, want) else 'WRONG'}, signal {sig} "
          f"(want {groups * reps})")
    del view, svc  # the handler holds the view too
    ring.close()
    heap.free()


def main() -> None:
    dev = VulkanDevice(validation="--validation" in sys.argv)
    print(dev, "device-local host-visible:", dev.has_device_local_host_visible)
    for count in (64, 4096, 65536):
        run(dev, count, 20 if count < 65536 else 5, queue_copy=False)
    run(dev, 64, 1, queue_copy=True)
    dev.close()
    print("validation errors:", dev.validation_errors)


if __name__ == "__main__":
    main()
