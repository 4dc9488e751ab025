"""Probe of GPU-initiated requests on a real device (run by hand: python tests/gpu/ring_probe.py).

Runs ring_selftest in mode 2 (each invocation posts a 64-bit fetch-add to the ring and waits
for the host's completion within the same dispatch) while a host thread drains the ring, and
reports when the host first saw a request, how many it handled during the dispatch, and how
many invocations saw their completion. It shows whether shader writes to host-visible memory
become visible to the host during a dispatch, and host writes to the shader, on this driver.
"""

from __future__ import annotations

import struct
import sys
import threading
import time

import numpy as np

from vkshmem.gpu import Ring, RingOp, VulkanDevice


def probe(dev: VulkanDevice, n: int) -> None:
    ring = Ring.create(dev, 64)
    out = dev.alloc_mapped(8 * 3 * n)
    view = out.map()
    assert view is not None
    view[:] = bytes(len(view))
    words = [0, 0, 0, 0]
    first_seen: list[float] = []
    handled = [0]
    stop = threading.Event()

    def handle(d):  # type: ignore[no-untyped-def]
        if not first_seen:
            first_seen.append(time.perf_counter())
        if d.op == RingOp.AMO:
            old = words[d.dst // 8]
            words[d.dst // 8] = old + d.value
            return old
        return None

    def drain() -> None:
        while not stop.is_set():
            handled[0] += ring.drain(handle, dev)

    th = threading.Thread(target=drain, daemon=True)
    th.start()
    push = struct.pack("<QQII", ring.device_address, out.device_address, n, 2)
    t0 = time.perf_counter()
    err = None
    try:
        dev.pipeline("ring_selftest").dispatch(-(-n // 64), push, timeout=30)
    except Exception as exc:  # report, do not hide
        err = exc
    t1 = time.perf_counter()
    stop.set()
    th.join(5)
    v = np.frombuffer(view, np.uint64).copy()
    del view
    ok = int(v[2 * n:].sum())
    seen = f"{(first_seen[0] - t0) * 1e3:.2f} ms" if first_seen else "never"
    print(f"n={n}: dispatch {1e3 * (t1 - t0):.1f} ms, host first saw a request after {seen}, "
          f"handled {handled[0]} during+after, head {ring.head}, {ok}/{n} waits succeeded"
          f"{', error ' + str(err) if err else ''}")
    ring.close()
    out.free()


def main() -> None:
    dev = VulkanDevice(validation="--validation" in sys.argv)
    print(dev)
    for n in (1, 4, 30):
        probe(dev, n)
    dev.close()
    print("validation errors:", dev.validation_errors)


if __name__ == "__main__":
    main()
