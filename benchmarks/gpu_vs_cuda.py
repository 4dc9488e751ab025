"""vkshmem's GPU domain next to CUDA on the same GPU, in one run: every size, every pair.

Run with ``vkshmem run -n 2 benchmarks/gpu_vs_cuda.py [--quick] [--json PATH]`` on a machine
whose two PEs share one GPU (sizes past the heaps are skipped: 256 MiB rows need
``VKSHMEM_GPU_SYMMETRIC_SIZE=1G VKSHMEM_SYMMETRIC_SIZE=1G``, and on the cuda domain
``VKSHMEM_CUDA_SYMMETRIC_SIZE=1G``). PE 0 measures, against PE 1 (reached through imported
memory), at 8 B ... 64 MiB (every power of 4) and 256 MiB:

- blocking put GPU->GPU, CPU->GPU (from an ordinary numpy array, and from a symmetric host
  array, which the GPU domain may have imported), get GPU->CPU and get GPU->GPU, complete on
  return; ``put_nbi`` GPU->GPU followed by ``quiet``, per call;
- an 8-byte ``fetch_add`` on the peer's GPU word, and 64 non-blocking 64 KiB puts GPU->GPU
  followed by one quiet (per put);
- ``put_signal`` of 128 B + ``signal_wait_until`` on GPU-heap signals, ping-pong between the
  PEs: half a round trip.

Rows below 1 MiB are microseconds per call, from 1 MiB GB/s. When CuPy is importable, the
same operations through CUDA on PE 0's GPU, each a ``cudaMemcpyAsync`` + stream synchronize
per call (what a Python user of CUDA pays): device to device into PE 1's buffer opened with
CUDA IPC (with ``--peer`` on a two-GPU machine: GPU 0 to GPU 1 with peer access), pageable and
pinned host to device, device to pageable host; the fetch_add a one-thread ``atomicAdd``
kernel on the peer's word whose old value lands in pinned memory, + synchronize; the ping-pong
a 128-byte copy into the peer's IPC buffer + synchronize, then a flag stored in host memory
both processes map, which the other side polls. Array views (and CUDA's pointers) are made
once per size, outside the timed calls. Prints one table; ``--json`` writes the rows
``{"op", "pair", "bytes", "vkshmem", "cuda", "unit"}`` with the date, the device, the driver
and the command (and, while the sweep runs, the rows so far to ``PATH.partial``).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
peer = (me + 1) % n
quick = "--quick" in sys.argv
#: 8 B ... 128 MiB, every power of 4, and 256 MiB (quick: up to 512 KiB)
SIZES = [8 << (2 * k) for k in range(9 if quick else 13)] + ([] if quick else [256 << 20])
SMALL = 200 if quick else 2000
#: seconds a timed loop aims at (its calls: that over a first call's time, 3 to SMALL)
BUDGET = 0.01 if quick else 0.04
#: rounds per figure, the best kept (the device hosts' CPU jitter moves single rounds by µs)
ROUNDS = 2 if quick else 5
MIB = 1 << 20


def iters_for(fn: Callable[[], object]) -> int:
    """Calls per timed loop: about BUDGET seconds' worth, from one warm call (on PE 0)."""
    fn()
    t0 = time.perf_counter()
    fn()
    return int(min(SMALL, max(3, BUDGET / max(time.perf_counter() - t0, 1e-7))))


def timed(fn: Callable[[], object], iters: int | None = None) -> float:
    """Seconds per call on PE 0 (best of ROUNDS rounds; the other PEs wait in barriers)."""
    if me == 0 and iters is None:
        iters = iters_for(fn)
    best = float("inf")
    for _ in range(ROUNDS):
        shmem.barrier_all()
        t0 = time.perf_counter()
        if me == 0:
            for _ in range(iters or 0):
                fn()
        best = min(best, time.perf_counter() - t0)
    shmem.barrier_all()
    return best / max(iters or 0, 1)


def heap_top() -> int:
    """The largest of SIZES that the GPU heap holds three times and the host heap twice."""
    rt = shmem._state.rt  # a benchmark reads its heaps' sizes
    gpu = min(h.size for h in rt.domains.heaps.values())
    host = rt.host.segment.size
    return max([s for s in SIZES if 3 * s + MIB <= gpu and 2 * s + MIB <= host] or [8])


shmem.barrier_all()
shmem.free(shmem.zeros(1, np.uint8, domain="gpu"))  # opens the GPU domain
top = heap_top()
if me == 0 and top < SIZES[-1]:
    print(f"gpu_vs_cuda: sizes past {top} B skipped (heaps too small: see --help)")
SIZES = [s for s in SIZES if s <= top]
g_dst = shmem.zeros(top, np.uint8, domain="gpu")
g_src = shmem.zeros(top, np.uint8, domain="gpu")
g_out = shmem.zeros(top, np.uint8, domain="gpu")
h_sym = shmem.zeros(top, np.uint8)
h_arb = np.random.default_rng(0).integers(0, 255, top, dtype=np.uint8)
h_out = np.empty(top, np.uint8)
word = shmem.zeros(1, np.int64, domain="gpu")
PP = 128  # ping-pong bytes
pp_buf = shmem.zeros(PP, np.uint8, domain="gpu")
pp_sig = shmem.new_signal(domain="gpu")
pp_src = shmem.zeros(PP, np.uint8, domain="gpu")

rows: list[dict[str, object]] = []


def row(op: str, pair: str, nbytes: int, seconds: float) -> None:
    """One row: µs per call below 1 MiB, GB/s from 1 MiB."""
    big = nbytes >= MIB
    value = nbytes / seconds / 1e9 if big else seconds * 1e6
    rows.append({"op": op, "pair": pair, "bytes": nbytes, "vkshmem": round(value, 3),
                 "cuda": None, "unit": "GB/s" if big else "us"})


def save_partial() -> None:
    """With ``--json``: the rows so far into PATH.partial (no CUDA column yet), so a run cut
    short (a device lease ending) still leaves what it measured."""
    if "--json" in sys.argv:
        path = sys.argv[sys.argv.index("--json") + 1] + ".partial"
        with open(path, "w") as f:
            json.dump({"complete": False, "date": datetime.date.today().isoformat(),
                       "rows": rows}, f, indent=1)


def nbi_quiet(d: object, s: object) -> None:
    shmem.put_nbi(d, s, peer)
    shmem.quiet()


for size in SIZES:
    # views made once per size, as the CUDA side computes its pointers once
    gd, gs, go = g_dst[:size], g_src[:size], g_out[:size]
    ha, hs, ho = h_arb[:size], h_sym[:size], h_out[:size]
    for op, pair, fn in (
            ("put", "gpu->gpu", lambda gd=gd, gs=gs: shmem.put(gd, gs, peer)),
            ("put", "cpu->gpu", lambda gd=gd, ha=ha: shmem.put(gd, ha, peer)),
            ("put", "cpu(sym)->gpu", lambda gd=gd, hs=hs: shmem.put(gd, hs, peer)),
            ("get", "gpu->cpu", lambda gd=gd, ho=ho: shmem.get(ho, gd, peer)),
            ("get", "gpu->gpu", lambda gd=gd, go=go: shmem.get(go, gd, peer)),
            ("put_nbi+quiet", "gpu->gpu", lambda gd=gd, gs=gs: nbi_quiet(gd, gs))):
        row(op, pair, size, timed(fn))
    if me == 0:
        print(f"gpu_vs_cuda: {size} B done", flush=True)
        save_partial()
row("fetch_add", "gpu", 8, timed(lambda: shmem.atomic_fetch_add(word, 1, peer), SMALL))
NBI, NBI_N = 64 << 10, min(64, top // (64 << 10))  # non-blocking 64 KiB puts, one quiet
nbi_dst = [g_dst[k * NBI:(k + 1) * NBI] for k in range(NBI_N)]
nbi_src = [g_src[k * NBI:(k + 1) * NBI] for k in range(NBI_N)]


def nbi_batch() -> None:
    for d, s in zip(nbi_dst, nbi_src, strict=True):
        shmem.put_nbi(d, s, peer)
    shmem.quiet()


if NBI_N:
    rows.append({"op": f"put_nbi x{NBI_N}", "pair": "gpu->gpu", "bytes": NBI,
                 "vkshmem": round(timed(nbi_batch, SMALL // 20) / NBI_N * 1e6, 3),
                 "cuda": None, "unit": "us"})


def ping_pong(rounds: int, base: int) -> float:
    """Half round trip (s) of put_signal 128 B + signal_wait_until between PEs 0 and 1,
    signal values ``base + 1`` ... ``base + rounds`` (collective)."""
    other = 1 - me
    shmem.barrier_all()
    t0 = time.perf_counter()
    if me < 2:
        for r in range(base + 1, base + rounds + 1):
            if me == 1:
                shmem.signal_wait_until(pp_sig, shmem.CMP_GE, r)
            shmem.put_signal(pp_buf, pp_src, other, pp_sig, r, shmem.SIGNAL_SET)
            if me == 0:
                shmem.signal_wait_until(pp_sig, shmem.CMP_GE, r)
    dt = time.perf_counter() - t0
    shmem.barrier_all()
    return dt / rounds / 2


PP_ROUNDS = 50 if quick else 500
if n > 1:
    best = min(ping_pong(PP_ROUNDS, k * PP_ROUNDS) for k in range(3 if quick else ROUNDS))
    rows.append({"op": "put_signal+wait ping-pong", "pair": "gpu->gpu", "bytes": PP,
                 "vkshmem": round(best * 1e6, 3), "cuda": None, "unit": "us"})


def ipc_exchange() -> np.ndarray | None:
    """Collective: PEs 0 and 1 each allocate a CuPy buffer of ``top`` bytes and hand the other
    its CUDA IPC handle (through a symmetric host array), so the gpu->gpu references copy into
    another process's memory as vkshmem does. Returns the other's handle on PEs 0 and 1 (None
    without CuPy, on one PE, or with ``--peer``); the buffers live until the job ends."""
    global ipc_buf
    handle = shmem.zeros(64, np.uint8)
    try:
        import cupy as cp
    except Exception:
        cp = None
    use = cp is not None and n > 1 and "--peer" not in sys.argv
    if use and me < 2:
        ipc_buf = cp.zeros(top, cp.uint8)
        shmem.put(handle, np.frombuffer(cp.cuda.runtime.ipcGetMemHandle(ipc_buf.data.ptr),
                                        np.uint8), 1 - me)
    shmem.barrier_all()
    return handle if use and me < 2 else None


ipc_buf = None
flags = shmem.zeros(8, np.int64)  # the CUDA ping-pong's flags, in host memory both map


def cuda_ping_pong(ipc: np.ndarray | None) -> float | None:
    """Collective: the CUDA reference of the ping-pong row, half a round trip (s): a 128-byte
    ``cudaMemcpyAsync`` into the other's IPC buffer + synchronize, then a CPU store of the
    round into the other's flag (host memory, mapped by both), which the other polls."""
    if ipc is None:
        for _ in range((3 if quick else ROUNDS) + 1):  # the barriers PEs 0 and 1 make
            shmem.barrier_all()
        return None
    import cupy as cp
    rt = cp.cuda.runtime
    stream = cp.cuda.Stream(non_blocking=True)
    other = 1 - me
    dst = rt.ipcOpenMemHandle(bytes(ipc), 1)
    src = ipc_buf.data.ptr + top - PP  # type: ignore[union-attr]
    theirs = shmem.ptr(flags, other)
    assert theirs is not None, "the CUDA ping-pong needs the shm path (VKSHMEM_SHM=1)"
    mine = flags
    best = float("inf")
    rounds = 50 if quick else 500
    for rep in range(3 if quick else ROUNDS):
        base = rep * rounds
        shmem.barrier_all()
        t0 = time.perf_counter()
        for r in range(base + 1, base + rounds + 1):
            if me == 1:
                while mine[0] < r:
                    pass
            rt.memcpyAsync(dst, src, PP, 3, stream.ptr)
            stream.synchronize()
            theirs[0] = r
            if me == 0:
                while mine[0] < r:
                    pass
        best = min(best, (time.perf_counter() - t0) / rounds / 2)
    shmem.barrier_all()
    rt.ipcCloseMemHandle(dst)
    return best


def cuda_reference(ipc: np.ndarray | None, pp: float | None) -> str:
    """Fill the rows' ``cuda`` column on PE 0; returns a description (or why not)."""
    try:
        import cupy as cp
    except Exception as exc:  # no CuPy, no CUDA
        return f"no CUDA reference ({type(exc).__name__}: {exc})"
    stream = cp.cuda.Stream(non_blocking=True)
    rt = cp.cuda.runtime
    d_a = cp.zeros(top, cp.uint8)
    d_b = cp.zeros(top, cp.uint8)
    pinned = cp.cuda.alloc_pinned_memory(top)
    h_pin = np.frombuffer(pinned, np.uint8, top)
    h_pin[:] = h_arb
    h2d, d2d, d2h = 1, 3, 2

    def copy(dst: int, src: int, nbytes: int, kind: int, batch: int = 1) -> Callable[[], None]:
        def run() -> None:
            for k in range(batch):
                rt.memcpyAsync(dst + k * nbytes, src + k * nbytes, nbytes, kind, stream.ptr)
            stream.synchronize()
        return run

    def cost(fn: Callable[[], None], iters: int | None = None) -> float:
        iters = iters or iters_for(fn)
        best = float("inf")
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            best = min(best, (time.perf_counter() - t0) / iters)
        return best

    dp, sp = d_a.data.ptr, d_b.data.ptr
    peer_note = ""
    if rt.getDeviceCount() > 1 and "--peer" in sys.argv:  # GPU->GPU rows: GPU 0 -> GPU 1
        with cp.cuda.Device(1):
            d_peer = cp.zeros(top, cp.uint8)
        rt.deviceEnablePeerAccess(1)
        dp = d_peer.data.ptr
        peer_note = "; gpu->gpu rows: GPU 0 -> GPU 1 with peer access (cudaMemcpyPeer's path)"
    elif ipc is not None:  # into PE 1's buffer, opened with CUDA IPC
        dp = rt.ipcOpenMemHandle(bytes(ipc), 1)  # cudaIpcMemLazyEnablePeerAccess
        peer_note = "; the GPU side of every row: PE 1's buffer, opened with CUDA IPC"
    arb, pin, out = h_arb.ctypes.data, h_pin.ctypes.data, h_out.ctypes.data
    ref = {("put", "gpu->gpu"): (dp, sp, d2d), ("put_nbi+quiet", "gpu->gpu"): (dp, sp, d2d),
           ("get", "gpu->gpu"): (sp, dp, d2d), (f"put_nbi x{NBI_N}", "gpu->gpu"): (dp, sp, d2d),
           ("put", "cpu->gpu"): (dp, arb, h2d),
           ("put", "cpu(sym)->gpu"): (dp, pin, h2d), ("get", "gpu->cpu"): (out, dp, d2h)}
    for r in rows:
        key = (r["op"], r["pair"])
        if key not in ref:
            continue
        dst, src, kind = ref[key]
        nbytes = int(r["bytes"])  # type: ignore[call-overload]
        if str(r["op"]).startswith("put_nbi x"):  # NBI_N copies, one synchronize
            t = cost(copy(dst, src, nbytes, kind, NBI_N), SMALL // 20) / NBI_N
        else:
            t = cost(copy(dst, src, nbytes, kind))
        r["cuda"] = round(t * 1e6 if r["unit"] == "us" else nbytes / t / 1e9, 3)
    fadd = cp.RawKernel(r"""extern "C" __global__ void fadd(unsigned long long *p,
                            unsigned long long *out) { *out = atomicAdd(p, 1ull); }""", "fadd")
    res = cp.cuda.alloc_pinned_memory(8)  # device-mapped (unified addressing)
    res_np = np.frombuffer(res, np.uint64, 1)

    def cuda_fadd() -> None:
        fadd((1,), (1,), (dp, res.ptr), stream=stream)
        stream.synchronize()
        int(res_np[0])

    for r in rows:
        if r["op"] == "fetch_add":
            r["cuda"] = round(cost(cuda_fadd, SMALL) * 1e6, 3)
        if r["op"] == "put_signal+wait ping-pong" and pp is not None:
            r["cuda"] = round(pp * 1e6, 3)
    props = rt.getDeviceProperties(0)
    return (f"CUDA {rt.runtimeGetVersion()} on {props['name'].decode()}: memcpyAsync + stream "
            "sync per call; cpu->gpu and gpu->cpu from/to pageable numpy memory, cpu(sym)->gpu "
            f"compared with pinned H2D; fetch_add: a one-thread atomicAdd kernel on the peer's "
            f"word, its old value in pinned memory, + sync; ping-pong: 128 B memcpyAsync into "
            f"the other process's IPC buffer + sync, then a flag stored in shared host memory "
            f"that the other polls{peer_note}")


ipc = ipc_exchange()
pp_cuda = cuda_ping_pong(ipc)
if me == 0:
    note = cuda_reference(ipc, pp_cuda)
    dom = word.domain
    route = shmem._state.rt.domains.heaps[dom.spec.name].route_names[peer]
    dev = dom.device
    info = getattr(dev, "info", None)
    driver = info.driver_info if info is not None else "CUDA driver"
    head = (f"vkshmem GPU domain {dom.spec.name!r} at {n} PEs on {dev.name} ({driver}), route "
            f"to the peer {route!r}")
    if dom.spec.name == "vulkan":
        head += (f", submission {'native' if dev.native else 'Python'}, host heap "
                 f"{'imported' if dom.host_imported else 'staged'}")
    print(f"\n{head}\n{note}")
    print(f"{'op':<26} {'pair':<14} {'bytes':>10} {'vkshmem':>10} {'CUDA':>10} {'unit':>5} "
          f"{'ratio':>6}")
    for r in rows:
        cuda = r["cuda"]
        ratio = ""
        if cuda:
            v = float(r["vkshmem"])  # type: ignore[arg-type]
            ratio = f"{(cuda / v if r['unit'] == 'us' else v / cuda):.2f}"  # >1: vkshmem ahead
        print(f"{r['op']:<26} {r['pair']:<14} {r['bytes']:>10} {r['vkshmem']:>10} "
              f"{cuda if cuda is not None else '-':>10} {r['unit']:>5} {ratio:>6}")
    if "--json" in sys.argv:
        path = sys.argv[sys.argv.index("--json") + 1]
        settings = [f"{k}={v}" for k, v in sorted(os.environ.items())
                    if k.startswith(("VKSHMEM_GPU_", "VKSHMEM_CUDA_", "VKSHMEM_SYMMETRIC"))]
        with open(path, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "device": dev.name,
                       "driver": driver, "header": head, "cuda": note,
                       "command": " ".join([*settings, "vkshmem run -n 2",
                                            "benchmarks/gpu_vs_cuda.py --json", path]),
                       "ratio": "CUDA/vkshmem for us rows, vkshmem/CUDA for GB/s rows",
                       "rows": rows}, f, indent=1)
        if os.path.exists(path + ".partial"):
            os.remove(path + ".partial")
shmem.barrier_all()
