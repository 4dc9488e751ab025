"""Micro-benchmarks of the Vulkan layer (run by hand: python tests/gpu/bench.py [--validation]).

Prints: staged write/read bandwidth at 1 MiB and 64 MiB, device-to-device copy bandwidth, an
empty dispatch round trip (submit + fence wait of a one-workgroup dispatch that does nothing),
a single AMO round trip (amo.comp through its prerecorded command buffer), a 1M-element
float32 reduction, and for reference a plain memcpy into the mapping where the memory is
host-visible. Medians over repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time

import numpy as np

from vkshmem.core.transports.contract import AmoOp
from vkshmem.gpu import VulkanDevice


def median_time(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--validation", action="store_true")
    ap.add_argument("--staging", type=int, default=None, help="staging bytes (default 8 MiB)")
    args = ap.parse_args()
    dev = VulkanDevice(validation=args.validation, staging_size=args.staging)
    print(f"device: {dev.name} ({dev.driver}); staging {dev.transfer.half * 2 >> 20} MiB")
    big = 64 << 20
    mem = dev.alloc_exportable(big)
    other = dev.alloc_exportable(big)
    plain = dev.alloc_exportable(big, host_visible=False)
    plain2 = dev.alloc_exportable(big, host_visible=False)
    for name, m in (("segment", mem), ("device-local only", plain),
                    ("staging", dev.transfer.staging)):
        assert m is not None
        flags = dev.info.memory_types[m.memory_type_index][0]
        print(f"  {name}: memory type {m.memory_type_index} (flags {flags:#x}), mapped: "
              f"{m.map() is not None}")
    src = np.random.default_rng(0).integers(0, 255, big, dtype=np.uint8)
    dst = np.empty_like(src)
    for size in (1 << 20, big):
        reps = 30 if size == 1 << 20 else 5
        w = median_time(lambda size=size: dev.write(mem, 0, src[:size]), reps)
        r = median_time(lambda size=size: dev.read(mem, 0, dst[:size]), reps)
        c = median_time(lambda size=size: dev.copy(other, 0, mem, 0, size), reps)
        c2 = median_time(lambda size=size: dev.copy(plain2, 0, plain, 0, size), reps)
        print(f"{size >> 20:3d} MiB  write {size / w / 1e9:6.2f} GB/s ({w * 1e3:7.2f} ms)  "
              f"read {size / r / 1e9:6.2f} GB/s ({r * 1e3:7.2f} ms)  "
              f"d2d copy {size / c / 1e9:6.2f} GB/s (device-local only {size / c2 / 1e9:6.2f})")
        view = mem.map()
        if view is not None:
            m = median_time(lambda size=size, view=view: view.__setitem__(
                slice(0, size), memoryview(src[:size])), reps)
            print(f"         (memcpy into the mapping: {size / m / 1e9:6.2f} GB/s)")
            del view
    assert np.array_equal(dst, src)
    small = bytearray(8)
    t8w = median_time(lambda: dev.write(mem, 0, b"\0" * 8), 200)
    t8r = median_time(lambda: dev.read(mem, 0, small), 200)
    print(f"8 B write round trip {t8w * 1e6:.1f} us, read {t8r * 1e6:.1f} us")
    if mem.map() is not None:
        t8d = median_time(lambda: dev.write(mem, 0, b"\0" * 8, direct=True), 200)
        print(f"8 B direct write (through the mapping) {t8d * 1e6:.2f} us")
    pipe = dev.pipeline("copy_u32")
    push = struct.pack("<QQI4x", mem.device_address, mem.device_address, 0)
    t = median_time(lambda: pipe.dispatch(1, push), 300)
    print(f"empty dispatch round trip {t * 1e6:.1f} us")
    t = median_time(lambda: dev.amo(mem, 0, AmoOp.ADD, 8, 1), 300)
    t4 = median_time(lambda: dev.amo(mem, 8, AmoOp.CSWAP, 4, 1, 0), 300)
    print(f"amo round trip: 64-bit fetch-add {t * 1e6:.1f} us, 32-bit cswap {t4 * 1e6:.1f} us")
    n = 1 << 20
    t = median_time(lambda: dev.reduce(mem, 0, other, 0, n, "sum", np.float32), 20)
    print(f"reduce sum float32 1M elements {t * 1e3:.2f} ms ({n / t / 1e6:.0f} M elem/s)")
    for m in (mem, other, plain, plain2):
        m.free()
    dev.close()
    if args.validation:
        print("validation errors:", dev.validation_errors)


if __name__ == "__main__":
    main()
