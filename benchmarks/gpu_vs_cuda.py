"""vkshmem's GPU domain next to CUDA on the same GPU, in one run.

Run with ``vkshmem run -n 2 benchmarks/gpu_vs_cuda.py [--quick] [--json PATH]`` on a machine
whose two PEs share one GPU. PE 0 measures, against PE 1 (reached through imported memory):

- per-call cost of an 8-byte put GPU->GPU, CPU->GPU and get GPU->CPU (complete on return),
  and of a fetch_add on the peer's GPU word; per-put cost of 64 non-blocking 64 KiB puts
  GPU->GPU followed by one quiet (CUDA: 64 memcpyAsync, one synchronize);
- bandwidth of GPU->GPU puts, CPU->GPU puts (from an ordinary numpy array, and from a
  symmetric host array, which the GPU domain has imported) and GPU->CPU gets, at 1, 4, 16, 64
  and 256 MiB (needs VKSHMEM_GPU_SYMMETRIC_SIZE=1G VKSHMEM_SYMMETRIC_SIZE=1G).

When CuPy is importable, the same operations through CUDA on PE 0's GPU, each a
``cudaMemcpyAsync`` + stream synchronize per call (what a Python user of CUDA pays): device to
device into PE 1's buffer opened with CUDA IPC (with ``--peer`` on a two-GPU machine: GPU 0 to
GPU 1 with peer access), pageable and
pinned host to device, device to pageable host; the fetch_add a one-thread ``atomicAdd`` kernel
on the peer's word whose old value lands in pinned memory, + synchronize. Array views (and
CUDA's pointers) are made once per size, outside the timed calls. Prints one table; ``--json``
writes the rows ``{"op", "pair", "bytes", "vkshmem", "cuda", "unit"}`` with the date, the
device, the driver and the command.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable

import numpy as np

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
peer = (me + 1) % n
quick = "--quick" in sys.argv
SIZES = [1 << 20, 4 << 20] if quick else [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
SMALL = 200 if quick else 2000
BIG = 5 if quick else 50
#: rounds per figure, the best kept (the device hosts' CPU jitter moves single rounds by µs)
ROUNDS = 2 if quick else 5


def timed(fn: Callable[[], object], iters: int) -> float:
    """Seconds per call on PE 0 (best of ROUNDS rounds; the other PEs wait in barriers)."""
    best = float("inf")
    for _ in range(ROUNDS):
        for _ in range(min(3, iters)):
            if me == 0:
                fn()
        shmem.barrier_all()
        t0 = time.perf_counter()
        if me == 0:
            for _ in range(iters):
                fn()
        best = min(best, time.perf_counter() - t0)
        shmem.barrier_all()
    return best / iters


top = max(SIZES)
g_dst = shmem.zeros(top, np.uint8, domain="gpu")
g_src = shmem.zeros(top, np.uint8, domain="gpu")
h_sym = shmem.zeros(top, np.uint8)
h_arb = np.random.default_rng(0).integers(0, 255, top, dtype=np.uint8)
h_out = np.empty(top, np.uint8)
word = shmem.zeros(1, np.int64, domain="gpu")
one = np.ones(1, np.int64)

rows: list[dict[str, object]] = []


def row(op: str, pair: str, nbytes: int, value: float, unit: str) -> None:
    rows.append({"op": op, "pair": pair, "bytes": nbytes, "vkshmem": round(value, 3),
                 "cuda": None, "unit": unit})


d8, s8, a8, o8 = g_dst[:8], g_src[:8], h_arb[:8], h_out[:8]  # views made once, not per call
row("put", "gpu->gpu", 8, timed(lambda: shmem.put(d8, s8, peer), SMALL) * 1e6, "us")
row("put", "cpu->gpu", 8, timed(lambda: shmem.put(d8, a8, peer), SMALL) * 1e6, "us")
row("get", "gpu->cpu", 8, timed(lambda: shmem.get(o8, d8, peer), SMALL) * 1e6, "us")
row("fetch_add", "gpu", 8, timed(lambda: shmem.atomic_fetch_add(word, 1, peer), SMALL) * 1e6,
    "us")
NBI, NBI_N = 64 << 10, 64  # 64 non-blocking 64 KiB puts, then quiet: per-put microseconds
nbi_dst = [g_dst[k * NBI:(k + 1) * NBI] for k in range(NBI_N)]
nbi_src = [g_src[k * NBI:(k + 1) * NBI] for k in range(NBI_N)]


def nbi_batch() -> None:
    for d, s in zip(nbi_dst, nbi_src, strict=True):
        shmem.put_nbi(d, s, peer)
    shmem.quiet()


row("put_nbi", "gpu->gpu", NBI, timed(nbi_batch, SMALL // 20) / NBI_N * 1e6, "us")
for size in SIZES:
    # views made once per size, as the CUDA side computes its pointers once
    gd, gs, ha, hs, ho = g_dst[:size], g_src[:size], h_arb[:size], h_sym[:size], h_out[:size]
    for op, pair, fn in (
            ("put", "gpu->gpu", lambda gd=gd, gs=gs: shmem.put(gd, gs, peer)),
            ("put", "cpu->gpu", lambda gd=gd, ha=ha: shmem.put(gd, ha, peer)),
            ("put", "cpu(sym)->gpu", lambda gd=gd, hs=hs: shmem.put(gd, hs, peer)),
            ("get", "gpu->cpu", lambda gd=gd, ho=ho: shmem.get(ho, gd, peer))):
        row(op, pair, size, size / timed(fn, BIG) / 1e9, "GB/s")


def ipc_exchange() -> np.ndarray | None:
    """Collective: PE ``peer`` of PE 0 allocates a CuPy buffer and hands PE 0 its CUDA IPC
    handle (through a symmetric host array), so the gpu->gpu reference copies into another
    process's memory as vkshmem does. Returns the handle on PE 0 (None without CuPy, on one
    PE, or with ``--peer``); the buffer lives until the job's last barrier."""
    global ipc_buf
    handle = shmem.zeros(64, np.uint8)
    try:
        import cupy as cp
    except Exception:
        cp = None
    use = cp is not None and n > 1 and "--peer" not in sys.argv
    if use and me == 1:
        ipc_buf = cp.zeros(top, cp.uint8)
        shmem.put(handle, np.frombuffer(cp.cuda.runtime.ipcGetMemHandle(ipc_buf.data.ptr),
                                        np.uint8), 0)
    shmem.barrier_all()
    return handle if use and me == 0 else None


ipc_buf = None


def cuda_reference(ipc: np.ndarray | None) -> str:
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

    def cost(fn: Callable[[], None], iters: int) -> float:
        fn()
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
    ref = {("put", "gpu->gpu"): (dp, sp, d2d), ("put_nbi", "gpu->gpu"): (dp, sp, d2d),
           ("put", "cpu->gpu"): (dp, arb, h2d),
           ("put", "cpu(sym)->gpu"): (dp, pin, h2d), ("get", "gpu->cpu"): (out, dp, d2h)}
    for r in rows:
        key = (r["op"], r["pair"])
        if key not in ref:
            continue
        dst, src, kind = ref[key]
        nbytes = int(r["bytes"])  # type: ignore[call-overload]
        if r["op"] == "put_nbi":  # NBI_N copies, one synchronize
            t = cost(copy(dst, src, nbytes, kind, NBI_N), SMALL // 20) / NBI_N
        else:
            t = cost(copy(dst, src, nbytes, kind), SMALL if nbytes <= 8 else BIG)
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
    props = rt.getDeviceProperties(0)
    return (f"CUDA {rt.runtimeGetVersion()} on {props['name'].decode()}: memcpyAsync + stream "
            "sync per call; cpu->gpu and gpu->cpu from/to pageable numpy memory, cpu(sym)->gpu "
            f"compared with pinned H2D; fetch_add: a one-thread atomicAdd kernel on the peer's "
            f"word, its old value in pinned memory, + sync{peer_note}")


ipc = ipc_exchange()
if me == 0:
    note = cuda_reference(ipc)
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
    print(f"{'op':<10} {'pair':<14} {'bytes':>10} {'vkshmem':>10} {'CUDA':>10} {'unit':>5} "
          f"{'ratio':>6}")
    for r in rows:
        cuda = r["cuda"]
        ratio = ""
        if cuda:
            v = float(r["vkshmem"])  # type: ignore[arg-type]
            ratio = f"{(cuda / v if r['unit'] == 'us' else v / cuda):.2f}"  # >1: vkshmem ahead
        print(f"{r['op']:<10} {r['pair']:<14} {r['bytes']:>10} {r['vkshmem']:>10} "
              f"{cuda if cuda is not None else '-':>10} {r['unit']:>5} {ratio:>6}")
    if "--json" in sys.argv:
        path = sys.argv[sys.argv.index("--json") + 1]
        with open(path, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "device": dev.name,
                       "driver": driver, "header": head, "cuda": note,
                       "command": "vkshmem run -n 2 benchmarks/gpu_vs_cuda.py --json " + path,
                       "ratio": "CUDA/vkshmem for us rows, vkshmem/CUDA for GB/s rows",
                       "rows": rows}, f, indent=1)
shmem.barrier_all()
