"""GPU-initiated put_signal next to the floor and the ceiling of the same GPU, in one job.

    vkshmem run -n 2 benchmarks/device_api.py [--json benchmarks/results/FILE.json] [--quick]

PE 0's kernel (``benchmarks/shaders/device_put_signal.comp``, compiled here with glslc)
puts ``bytes`` into PE 1's GPU heap with workgroup-scope ``vks_put_signal_block`` calls, each
workgroup adding 1 to PE 1's signal; PE 1's host polls the signal word. Rows, per size (8 B to
64 MiB, every power of 4, and 64 MiB):

- ``put_signal``: from PE 0's dispatch call to PE 1's host seeing the last signal (µs; both
  clocks are this host's CLOCK_MONOTONIC), and the bandwidth that makes;
- ``floor``: an empty kernel's dispatch to completion (``launch.wait()``) on PE 0;
- ``ceiling``: a kernel copying the same bytes inside PE 0's own heap, dispatch to completion.

Goals (issue 38): put_signal ≤ floor + 5 µs for small sizes, ≥ 0.8 x the ceiling's bandwidth
from 16 MiB. The route each PE's kernel takes to the other (direct or ring) is printed.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from _device_api import measure, report, start

from vkshmem import shmem
from vkshmem.gpu.shaders import compile_glsl

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "shaders" / "device_put_signal.comp"


def main() -> None:
    args, src, dst = start(__doc__ or "")
    me = shmem.my_pe()
    sig = shmem.zeros(1, np.uint64, domain="gpu")
    with tempfile.TemporaryDirectory() as tmp:
        kernels = [shmem.gpu_kernel(compile_glsl(SOURCE, Path(tmp) / f"k{m}.spv",
                                                 defines={"MODE": str(m)}), name=f"mode{m}")
                   for m in range(3)]
    init = src.domain.initiator
    route = "direct" if (1 - me) in init.direct_pes else "ring"
    try:
        view = sig.to_numpy(zero_copy=True)  # CPU-mapped: poll it directly
    except Exception:
        view = None

    def seen(target: int) -> None:
        if view is not None:
            deadline = time.monotonic() + 30
            while view[0] < target:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"signal {view[0]}, want {target}")
        else:
            shmem.signal_wait_until(sig, shmem.CMP.GE, target)

    def run(mode: int, nbytes: int, groups: int) -> None:
        push = shmem.pack_push(np.uint64(src.offset), np.uint64(dst.offset),
                               np.uint64(sig.offset), np.uint64(nbytes // groups),
                               np.uint32(1 if mode == 1 else 0))
        kernels[mode].dispatch(groups, push=push).wait()

    rows = measure(args.quick, run, seen, route)
    init.check()
    view = None  # drop the mapping's view before the heap is released
    shmem.barrier_all()
    if me == 0:
        report(rows, src.domain.device.name, src.domain.spec.name, args.json,
               "vkshmem run -n 2 benchmarks/device_api.py")


if __name__ == "__main__":
    main()
