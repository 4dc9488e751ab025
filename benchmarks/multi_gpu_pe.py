"""One job of ``benchmarks/multi_gpu.py``: two PEs on two GPUs of one node (run it through that
driver, or ``vkshmem run -n 2 benchmarks/multi_gpu_pe.py --domain cuda --json PATH``).

PE 0 measures against PE 1, whose GPU heap is on the other GPU:

- vkshmem in the domain ``--domain`` (``cuda``: mapped over NVLink, route ``direct``;
  ``vulkan``: the domain proxy): put and get GPU->GPU bandwidth for 8 B ... 256 MiB (complete on
  return), an 8-byte put and a fetch_add (per call), ``barrier_all`` and a 256 MiB float32
  ``sum_reduce`` (both PEs);
- with ``--nvshmem``: the same through nvshmem4py's host API (``put``/``get`` on a stream +
  synchronize, ``atomic_fetch_add``, ``barrier_all`` on a stream + synchronize, ``reduce`` on
  TEAM_WORLD), NVSHMEM initialised by a unique id that vkshmem broadcasts;
- with ``--ceiling``: CUDA itself through CuPy on PE 0: ``cudaMemcpyPeerAsync`` + synchronize
  GPU 0 -> GPU 1 (put rows) and GPU 1 -> GPU 0 (get rows), one 8-byte peer copy for the put
  latency, a one-thread ``atomicAdd`` kernel on GPU 1's word whose old value lands in pinned
  host memory for the fetch_add; for the all-reduce, 256 MiB peer copies both ways at once
  (each GPU must receive the whole of the other's data while sending its own: the least
  traffic of any two-GPU all-reduce), and one such copy alone as ``ceiling_one_way``;
- with ``--nccl``: NCCL's all-reduce through ``torch.distributed`` (both PEs, a TCP store on
  loopback): ``nccl`` after a device copy of the source into the target (out of place, as
  vkshmem's and NVSHMEM's), ``nccl_in_place`` without it.

Every figure is the best of three rounds, each sized to run about ``--round-ms`` (default 60 ms).
Writes ``{"domain", "device", "rows": [{"op", "bytes", "vkshmem", "nvshmem", "ceiling", "unit"}]}``
to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from vkshmem import shmem

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--domain", default="cuda", help="the vkshmem GPU domain (cuda or vulkan)")
ap.add_argument("--nvshmem", action="store_true", help="measure nvshmem4py too")
ap.add_argument("--ceiling", action="store_true", help="measure cudaMemcpyPeer through CuPy")
ap.add_argument("--nccl", action="store_true",
                help="measure NCCL's all-reduce through torch.distributed too")
ap.add_argument("--quick", action="store_true", help="fewer sizes, shorter rounds")
ap.add_argument("--latency-only", action="store_true",
                help="only the per-call rows and the all-reduce: no bandwidth rows")
ap.add_argument("--round-ms", type=float, default=60.0, help="target length of one round")
ap.add_argument("--json", required=True, help="where PE 0 writes its rows")
args = ap.parse_args()

me, n = shmem.my_pe(), shmem.n_pes()
if n != 2:
    raise SystemExit("multi_gpu_pe.py runs at exactly 2 PEs (vkshmem run -n 2)")
SIZES = [8, 512, 32 << 10, 1 << 20, 16 << 20, 256 << 20] if args.quick else \
    [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20, 256 << 20]
TOP = max(SIZES)
ROUND = args.round_ms / 1e3 / (3 if args.quick else 1)
_agree = shmem.zeros(1, np.int64)


def agree(value: int) -> int:
    """PE 0's ``value`` on every PE (a host broadcast)."""
    src = np.array([value], np.int64)
    shmem.broadcast(_agree, src, 0)
    return int(_agree[0])


def timed(fn: Callable[[], object], everyone: bool = False, max_iters: int = 5000) -> float:
    """Seconds per call of ``fn`` on PE 0 (on every PE if ``everyone``): best of 3 rounds of a
    length near ``ROUND``; the other PE waits in barriers."""
    runs = everyone or me == 0
    if runs:
        fn()  # warm-up: what the first call makes once (kernels compiled, a service started)
    t0 = time.perf_counter()
    if runs:
        fn()  # the estimate of one call
    once = time.perf_counter() - t0
    iters = agree(max(1, min(max_iters, int(ROUND / max(once, 1e-7)))))
    best = float("inf")
    for _ in range(3):
        shmem.barrier_all()
        t0 = time.perf_counter()
        if runs:
            for _ in range(iters):
                fn()
        best = min(best, time.perf_counter() - t0)
    shmem.barrier_all()
    return best / iters


rows: dict[tuple[str, int], dict[str, Any]] = {}


def put_row(op: str, nbytes: int, column: str, value: float, unit: str) -> None:
    r = rows.setdefault((op, nbytes), {"op": op, "bytes": nbytes, "vkshmem": None,
                                       "nvshmem": None, "ceiling": None, "unit": unit})
    r[column] = round(value, 3)


def bandwidth(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


# -- vkshmem ---------------------------------------------------------------------------------

dom = args.domain
g_dst = shmem.zeros(TOP, np.uint8, domain=dom)
g_src = shmem.zeros(TOP, np.uint8, domain=dom)
word = shmem.zeros(1, np.int64, domain=dom)
r_src = shmem.zeros(TOP // 4, np.float32, domain=dom)
r_dst = shmem.zeros(TOP // 4, np.float32, domain=dom)
r_src.copy_from(np.full(TOP // 4, me + 1, np.float32))
heap = shmem._state.rt.domains.heaps[g_dst.domain.spec.name]
route = heap.route_names[1 - me]
device_name = getattr(g_dst.domain.device, "name", "?")
print(f"PE {me}: domain {g_dst.domain.spec.name} on {device_name}, route to the peer "
      f"{route!r}", flush=True)
shmem.barrier_all()

for size in [] if args.latency_only else SIZES:
    d, s = g_dst[:size], g_src[:size]
    put_row("put", size, "vkshmem", bandwidth(size, timed(lambda d=d, s=s: shmem.put(d, s, 1))),
            "GB/s")
    put_row("get", size, "vkshmem", bandwidth(size, timed(lambda d=d, s=s: shmem.get(d, s, 1))),
            "GB/s")
d8, s8 = g_dst[:8], g_src[:8]
put_row("put latency", 8, "vkshmem", timed(lambda: shmem.put(d8, s8, 1)) * 1e6, "us")
put_row("get latency", 8, "vkshmem", timed(lambda: shmem.get(d8, s8, 1)) * 1e6, "us")
h8 = np.ones(8, np.uint8)
put_row("put CPU→GPU latency", 8, "vkshmem", timed(lambda: shmem.put(d8, h8, 1)) * 1e6, "us")
put_row("fetch_add latency", 8, "vkshmem",
        timed(lambda: shmem.atomic_fetch_add(word, 1, 1)) * 1e6, "us")
if heap.spec.name == "cuda" and route == "direct":  # the AMO kernel's cost below the API
    for who in ("own", "peer"):
        mem = heap.direct[0 if who == "own" else 1] if me == 0 else None
        t = timed(lambda mem=mem: heap.domain.device.amo(mem.va + word.offset, 4, 8, 1, 0))
        if me == 0:
            print(f"diagnostic: the cuda domain's AMO kernel on the {who} GPU's word: "
                  f"{t * 1e6:.2f} us per call", flush=True)
put_row("barrier latency", 0, "vkshmem", timed(shmem.barrier_all, everyone=True) * 1e6, "us")
put_row("sum all-reduce", TOP, "vkshmem",
        timed(lambda: shmem.sum_reduce(r_dst, r_src), everyone=True, max_iters=50) * 1e6, "us")
check = r_dst.to_numpy()
if not np.all(check == 3.0):
    raise SystemExit(f"PE {me}: the vkshmem all-reduce gave {check[:4]}..., not 3.0")

# -- NVSHMEM (nvshmem4py's host API) ---------------------------------------------------------

nvshmem_note = "not measured (--nvshmem not given)"
nvshmem_fetch_add = ""
if args.nvshmem:
    os.environ.setdefault("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo")
    os.environ.setdefault("NVSHMEM_REMOTE_TRANSPORT", "none")
    import cupy as cp
    import nvshmem
    import nvshmem.core as nv
    from cuda.core import Device

    ordinal = getattr(heap.domain.device, "ordinal", me)
    gpu = Device(ordinal)
    gpu.set_current()
    cp.cuda.Device(ordinal).use()
    uid = nv.get_unique_id(empty=me != 0)
    raw = shmem.zeros(uid._data.nbytes, np.int8)
    shmem.broadcast(raw, uid._data.view(np.int8).copy(), 0)
    uid._data.view(np.int8)[:] = raw
    nv.init(device=gpu, uid=uid, rank=me, nranks=n, initializer_method="uid")
    stream = gpu.create_stream()
    pairs = {size: (nv.array((size,), dtype="uint8"), nv.array((size,), dtype="uint8"))
             for size in SIZES}
    nword = nv.array((1,), dtype="int64")
    nr_src = nv.array((TOP // 4,), dtype="float32")
    nr_dst = nv.array((TOP // 4,), dtype="float32")
    nr_src[:] = me + 1
    cp.cuda.Device().synchronize()
    nv.barrier_all(stream=stream)
    stream.sync()

    def nv_op(fn: Callable[..., None], d: Any, s: Any) -> Callable[[], None]:
        def run() -> None:
            fn(d, s, remote_pe=1, stream=stream)
            stream.sync()
        return run

    for size in SIZES:
        d, s = pairs[size]
        put_row("put", size, "nvshmem", bandwidth(size, timed(nv_op(nv.put, d, s))), "GB/s")
        put_row("get", size, "nvshmem", bandwidth(size, timed(nv_op(nv.get, d, s))), "GB/s")
    put_row("put latency", 8, "nvshmem", timed(nv_op(nv.put, *pairs[8])) * 1e6, "us")
    # nvshmem4py 0.4.1 binds the host-side fetch_add, but NVSHMEM 3.4's host library answers
    # "not implemented" (it prints so, and returns 0): measured only where two calls count up.
    first = second = 0
    if me == 0:
        first = int(nv.atomic_fetch_add(nword, 1, remote_pe=1))
        second = int(nv.atomic_fetch_add(nword, 1, remote_pe=1))
    if agree(int(second == first + 1)):
        put_row("fetch_add latency", 8, "nvshmem",
                timed(lambda: nv.atomic_fetch_add(nword, 1, remote_pe=1)) * 1e6, "us")
    else:
        nvshmem_fetch_add = "NVSHMEM's host fetch_add is not implemented (returned 0)"

    def nv_barrier() -> None:
        nv.barrier_all(stream=stream)
        stream.sync()

    def nv_reduce() -> None:
        nv.reduce(nv.Teams.TEAM_WORLD, nr_dst, nr_src, "sum", stream=stream)
        stream.sync()

    put_row("barrier latency", 0, "nvshmem", timed(nv_barrier, everyone=True) * 1e6, "us")
    put_row("sum all-reduce", TOP, "nvshmem",
            timed(nv_reduce, everyone=True, max_iters=50) * 1e6, "us")
    if not bool(cp.all(nr_dst == 3.0)):
        raise SystemExit(f"PE {me}: the NVSHMEM all-reduce gave {nr_dst[:4]}")
    nvshmem_note = (f"nvshmem4py {nvshmem.__version__} host API: put/get on a "
                    "stream + synchronize, barrier_all on a stream + synchronize, reduce on "
                    "TEAM_WORLD + synchronize, atomic_fetch_add"
                    + (f"; {nvshmem_fetch_add}" if nvshmem_fetch_add else ""))
    for d, s in pairs.values():
        nv.free_array(d)
        nv.free_array(s)
    for x in (nword, nr_src, nr_dst):
        nv.free_array(x)
    nv.finalize()

# -- NCCL (torch.distributed), the all-reduce a torch user would call ----------------------

def measure_nccl() -> str:
    """NCCL's all-reduce rows; returns the note."""
    import socket

    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    with socket.socket() as probe:  # a free port on loopback for the store, PE 0's pick
        probe.bind(("127.0.0.1", 0))
        port = agree(probe.getsockname()[1] if me == 0 else 0)
    ordinal = getattr(heap.domain.device, "ordinal", me)
    torch.cuda.set_device(ordinal)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=me,
                            world_size=n, device_id=torch.device("cuda", ordinal))
    t = torch.full((TOP // 4,), float(me + 1), device="cuda")
    out_t = torch.empty_like(t)

    def nccl_reduce() -> None:
        out_t.copy_(t)  # an out-of-place all-reduce, like the others (NCCL's is in place)
        dist.all_reduce(out_t)
        torch.cuda.synchronize()

    def nccl_reduce_in_place() -> None:
        dist.all_reduce(out_t)
        torch.cuda.synchronize()

    put_row("sum all-reduce", TOP, "nccl", timed(nccl_reduce, everyone=True, max_iters=50) * 1e6,
            "us")
    if not bool((out_t == 3.0).all()):
        raise SystemExit(f"PE {me}: the NCCL all-reduce gave {out_t[:4]}")
    put_row("sum all-reduce", TOP, "nccl_in_place",
            timed(nccl_reduce_in_place, everyone=True, max_iters=50) * 1e6, "us")
    note = (f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
            ": dist.all_reduce of 256 MiB float32 + synchronize; nccl: after a device copy of "
            "the source into the target (out of place, like vkshmem's and NVSHMEM's), "
            "nccl_in_place: without it")
    dist.destroy_process_group()
    return note


nccl_note = "not measured (--nccl not given)"
if args.nccl:
    try:
        nccl_note = measure_nccl()
    except Exception as exc:  # a reference that fails must not lose vkshmem's rows
        nccl_note = f"failed: {type(exc).__name__}: {exc}"
        print(f"PE {me}: NCCL {nccl_note}", flush=True)


# -- the ceiling: cudaMemcpyPeer through CuPy ------------------------------------------------

ceiling_note = "not measured (--ceiling not given)"
if args.ceiling and me == 0:
    import cupy as cp

    rt = cp.cuda.runtime
    with cp.cuda.Device(0):
        a0 = cp.zeros(TOP, cp.uint8)
        st = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.Device(1):
        a1 = cp.zeros(TOP, cp.uint8)
    with cp.cuda.Device(0):
        rt.deviceEnablePeerAccess(1)

    def peer(dst: Any, ddev: int, src: Any, sdev: int, nbytes: int) -> Callable[[], None]:
        def run() -> None:
            rt.memcpyPeerAsync(dst.data.ptr, ddev, src.data.ptr, sdev, nbytes, st.ptr)
            st.synchronize()
        return run

    with cp.cuda.Device(0):
        for size in SIZES:
            put_row("put", size, "ceiling", bandwidth(size, timed(peer(a1, 1, a0, 0, size))),
                    "GB/s")
            put_row("get", size, "ceiling", bandwidth(size, timed(peer(a0, 0, a1, 1, size))),
                    "GB/s")
        put_row("put latency", 8, "ceiling", timed(peer(a1, 1, a0, 0, 8)) * 1e6, "us")
        put_row("get latency", 8, "ceiling", timed(peer(a0, 0, a1, 1, 8)) * 1e6, "us")
        h8p = cp.cuda.alloc_pinned_memory(8)

        def h2d() -> None:
            rt.memcpyAsync(a1.data.ptr, h8p.ptr, 8, rt.memcpyHostToDevice, st.ptr)
            st.synchronize()

        put_row("put CPU→GPU latency", 8, "ceiling", timed(h2d) * 1e6, "us")
        fadd = cp.RawKernel(r"""extern "C" __global__ void fadd(unsigned long long *p,
                                unsigned long long *out) { *out = atomicAdd(p, 1ull); }""",
                            "fadd")
        out = cp.cuda.alloc_pinned_memory(8)  # device-mapped (unified addressing)
        out_np = np.frombuffer(out, np.uint64, 1)
        w1 = a1[:8].view(cp.uint64)

        def cuda_fadd() -> None:
            fadd((1,), (1,), (w1, out.ptr), stream=st)
            st.synchronize()
            int(out_np[0])

        put_row("fetch_add latency", 8, "ceiling", timed(cuda_fadd) * 1e6, "us")
        # an all-reduce of two GPUs moves the whole buffer each way, at once: its ceiling is
        # both peer copies running together (the one-way copy is kept beside it)
        with cp.cuda.Device(1):
            b1 = cp.zeros(TOP, cp.uint8)
            st1 = cp.cuda.Stream(non_blocking=True)
            try:
                rt.deviceEnablePeerAccess(0)
            except cp.cuda.runtime.CUDARuntimeError:  # already enabled in this process
                pass
        b0 = cp.zeros(TOP, cp.uint8)

        def both_ways() -> None:
            rt.memcpyPeerAsync(a1.data.ptr, 1, a0.data.ptr, 0, TOP, st.ptr)
            rt.memcpyPeerAsync(b0.data.ptr, 0, b1.data.ptr, 1, TOP, st1.ptr)
            st.synchronize()
            st1.synchronize()

        put_row("sum all-reduce", TOP, "ceiling", timed(both_ways) * 1e6, "us")
        put_row("sum all-reduce", TOP, "ceiling_one_way", timed(peer(a1, 1, a0, 0, TOP)) * 1e6,
                "us")
    ceiling_note = ("CUDA through CuPy: cudaMemcpyPeerAsync + stream synchronize per call, GPU 0 "
                    "-> GPU 1 for put rows, GPU 1 -> GPU 0 for get rows; fetch_add: an atomicAdd "
                    "kernel on GPU 1's word, result in pinned memory, + synchronize; "
                    "all-reduce: 256 MiB peer copies GPU 0 -> GPU 1 and GPU 1 -> GPU 0 at once "
                    "(what every two-GPU all-reduce must move), ceiling_one_way: one of them "
                    "alone")
elif args.ceiling:  # PE 1 keeps up with PE 0's rounds
    for _ in range(2 * len(SIZES) + 6):
        timed(lambda: None)

# which proxy path served (routes "proxy", "link+proxy"): requests sent, and rounds served
# natively (C) by every PE's proxy thread, and operations the links carried (by CUDA, and by
# the CPU through the peer's heap mapped here: vkshmem/gpu/peermap.py), summed over PEs
counts = shmem.zeros(4, np.int64)
if heap.proxy is not None:
    native = heap.proxy.server.native
    counts[:2] = (heap.proxy.stats["requests"], int(native._p.rounds) if native else 0)
counts[2] = sum(getattr(link, "calls", 0) for link in heap.links if link is not None)
counts[3] = sum(getattr(link, "mapped_calls", 0) for link in heap.links if link is not None)
shmem.sum_reduce(counts, counts)
if me == 0:
    with open(args.json, "w") as f:
        dom = g_dst.domain  # the cuda domain's service, or the Vulkan domain's (AMOs)
        svc = getattr(dom, "service", None) or \
            getattr(getattr(dom, "accel", None), "cuda_service", None)
        json.dump({"domain": g_dst.domain.spec.name, "device": device_name, "route": route,
                   "service": None if svc is None else f"{svc.launches} launches",
                   "proxy": None if not route.endswith("proxy") else
                   f"{counts[0]} requests, {counts[1]} rounds in C"
                   + (f"; {counts[2]} operations through CUDA links" if counts[2] else ""),
                   "links": None if not route.startswith("link") else
                   f"{counts[2]} operations by CUDA, {counts[3]} by the CPU through the peer's "
                   "heap mapped here",
                   "nvshmem": nvshmem_note, "ceiling": ceiling_note, "nccl": nccl_note,
                   "rows": list(rows.values())}, f, indent=1)
for x in (g_dst, g_src, word, r_src, r_dst, _agree, counts):
    shmem.free(x)
print(f"PE {me}: done", flush=True)
