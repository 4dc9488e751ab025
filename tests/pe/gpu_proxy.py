"""The GPU domain proxy's pipeline: transfers of many pieces (a small VKSHMEM_GPU_PROXY_CHUNK),
sizes around the inline and piece boundaries, puts and gets interleaved on one range, every PE
targeting one, AMOs right after puts, the nbi forms. A piece delivered twice, lost, reordered
or read before its copy finished shows up as wrong bytes. Run with VKSHMEM_SHM=0, or with
VKSHMEM_DOMAIN_IMPORT=0 (pieces by DMA into the peers' mailboxes), under ``vkshmem run`` (see
tests/test_gpu_multipe.py)."""

from __future__ import annotations

import os

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.proxy.mailbox import DEPTH, INLINE

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
probe = shmem.zeros(1, np.uint8, domain="gpu")
heap = shmem._state.rt.domains.heaps[probe.domain.spec.name]
proxy = heap.proxy
check(n == 1 or proxy is not None, "several PEs that do not import must start the proxy")
check(n == 1 or heap.route_names[right] == "proxy", f"route {heap.route_names}")
C = proxy.chunk if proxy is not None else 12 << 10
N = 23 * C + 123  # many pieces, the last one short


def pattern(pe: int, nbytes: int, salt: int = 0) -> np.ndarray:
    return np.random.default_rng(1000 * pe + salt).integers(0, 256, nbytes, dtype=np.uint8)


# -- many pieces GPU->GPU, both ways ---------------------------------------------------------
src = shmem.zeros(N, np.uint8, domain="gpu")
dst = shmem.zeros(N, np.uint8, domain="gpu")
src.copy_from(pattern(me, N))
shmem.barrier_all()
shmem.put(dst, src, right)
shmem.barrier_all()
check(np.array_equal(dst.to_numpy(), pattern(left, N)), "GPU->GPU put of many pieces")
got = shmem.zeros(N, np.uint8, domain="gpu")
shmem.get(got, src, left)
check(np.array_equal(got.to_numpy(), pattern(left, N)), "GPU->GPU get of many pieces")
host = np.zeros(N, np.uint8)
shmem.get(host, src, right)
check(np.array_equal(host, pattern(right, N)), "GPU->CPU get of many pieces")
shmem.barrier_all()

# -- sizes around the inline size and the piece size, at offsets that straddle pieces --------
sizes = [1, 8, INLINE - 1, INLINE, INLINE + 1, C - 1, C, C + 1, 3 * C + 5]
for i, size in enumerate(sizes):
    off = (i * 977) % 64 + 3
    data = pattern(me, size, salt=i + 1)
    shmem.put(dst[off:off + size], data, right)  # CPU -> GPU
    back = np.zeros(size, np.uint8)
    shmem.get(back, dst[off:off + size], right)  # GPU -> CPU, right after
    check(np.array_equal(back, data), f"CPU->GPU then GPU->CPU, {size} B at {off}")
    shmem.put(dst[off:off + size], src[:size], right)  # GPU -> GPU over it
    shmem.get(got[:size], dst[off:off + size], right)  # GPU -> GPU back
    check(np.array_equal(got[:size].to_numpy(), pattern(me, N)[:size]),
          f"GPU->GPU then GPU->GPU back, {size} B at {off}")
shmem.barrier_all()

# -- puts and gets interleaved on one range: each get sees the put before it -----------------
for r in range(4):
    lo = (r * C) // 3
    span = N - lo - 64 * r
    data = pattern(me, span, salt=100 + r)
    if r % 2:
        shmem.put(dst[lo:lo + span], data, right)
    else:
        shmem.put_nbi(dst[lo:lo + span], data, right)  # complete on return over the proxy
    shmem.get(got[:span], dst[lo:lo + span], right)
    check(np.array_equal(got[:span].to_numpy(), data), f"round {r}: get after put")
    shmem.put(dst[lo + 64:lo + 64 + C], src[:C], right)  # overlapping, later: it wins
    whole = np.zeros(span, np.uint8)
    shmem.get(whole, dst[lo:lo + span], right)
    want = data.copy()
    want[64:64 + C] = pattern(me, N)[:C]
    check(np.array_equal(whole, want), f"round {r}: the later overlapping put wins")
shmem.barrier_all()

# -- an AMO right after a put of the same word (no barrier between) --------------------------
words = shmem.zeros(2, np.int64, domain="gpu")
shmem.barrier_all()
shmem.put(words[:1], np.array([100 + me], np.int64), right)
old = shmem.atomic_fetch_add(words[:1], 5, right)
check(old == 100 + me, f"fetch_add after a put saw {old}, not {100 + me}")
shmem.barrier_all()
check(int(words[0]) == 105 + left, f"the word holds {int(words[0])}")

# -- every PE targets PE 0 at once: disjoint puts of many pieces, gets, fetch_adds -----------
M = 5 * C + 17
many = shmem.zeros(n * M, np.uint8, domain="gpu")
mine = shmem.zeros(M, np.uint8, domain="gpu")
mine.copy_from(pattern(me, M, salt=7))
shmem.barrier_all()
for k in range(3):
    if k % 2:
        shmem.put(many[me * M:(me + 1) * M], pattern(me, M, salt=7), 0)  # CPU -> GPU
    else:
        shmem.put(many[me * M:(me + 1) * M], mine, 0)  # GPU -> GPU
    shmem.atomic_add(words[1:], me + 1, 0)
    seen = np.zeros(M, np.uint8)
    shmem.get(seen, many[me * M:(me + 1) * M], 0)
    check(np.array_equal(seen, pattern(me, M, salt=7)), f"PE 0's slice of PE {me}, pass {k}")
shmem.barrier_all()
if me == 0:
    whole = many.to_numpy()
    for pe in range(n):
        check(np.array_equal(whole[pe * M:(pe + 1) * M], pattern(pe, M, salt=7)),
              f"PE {pe}'s slice on PE 0")
    check(int(words[1]) == 3 * n * (n + 1) // 2, f"the shared counter holds {int(words[1])}")

# -- non-blocking GPU transfers: in flight across calls, complete at quiet -------------------
parts = [(k * (2 * C + 11), C + 37 * k + 5) for k in range(5)]  # disjoint, 1-2 pieces each
for lo, size in parts:
    shmem.put_nbi(dst[lo:lo + size], src[lo:lo + size], right)
in_flight = proxy is None or len(proxy._pending[right]) > 0
shmem.quiet()
check(in_flight, "put_nbi over the proxy completed before quiet")
check(proxy is None or not proxy._pending[right], "quiet left requests in flight")
shmem.barrier_all()
mine_now = dst.to_numpy()
for lo, size in parts:
    check(np.array_equal(mine_now[lo:lo + size], pattern(left, N)[lo:lo + size]),
          f"put_nbi of {size} B at {lo}")
for lo, size in parts:
    shmem.get_nbi(got[lo:lo + size], dst[lo:lo + size], right)
shmem.quiet()
fetched = got.to_numpy()
for lo, size in parts:
    check(np.array_equal(fetched[lo:lo + size], pattern(me, N)[lo:lo + size]),
          f"get_nbi of {size} B at {lo}")
if proxy is not None:  # a refused non-blocking transfer fails at quiet, naming the target
    proxy.put_device(right, heap.size - 8, 0, 64, nbi=True)
    try:
        shmem.quiet()
        check(False, "quiet after a refused put_nbi must fail")
    except heap.domain.error_type as exc:
        check(f"PE {right}'s" in str(exc), f"error: {exc}")
    shmem.quiet()  # nothing left
shmem.barrier_all()

# -- a request the target refuses: the error names it, and the pair stays usable -------------
if proxy is not None:
    for start in (heap.size - 8, heap.size - 2 * C):  # one piece; the last of three pieces
        try:
            proxy.put(right, start, memoryview(bytes(3 * C if start < heap.size - 8 else 16)))
            check(False, "a put past the end of the peer's heap must fail")
        except heap.domain.error_type as exc:
            check(f"PE {right}'s" in str(exc) and "proxy failed" in str(exc), f"error: {exc}")
    shmem.put(got[:C + 9], dst[:C + 9], right)  # the next requests are answered as usual
    back = np.zeros(C + 9, np.uint8)
    shmem.get(back, got[:C + 9], right)
    check(np.array_equal(back, dst[:C + 9].to_numpy()), "a put and get after a refused request")
shmem.barrier_all()

# -- the pipeline was used -------------------------------------------------------------------
if proxy is not None:
    stats = dict(proxy.stats)
    check(stats["max_in_flight"] == DEPTH, f"never {DEPTH} requests in flight: {stats}")
    check(stats["rounds"] > 0 and stats["max_round"] >= 1, f"the proxy served nothing: {stats}")
    # peers mapped here (shm path on, domain import off): pieces go by DMA to their mailboxes
    if os.environ.get("VKSHMEM_DOMAIN_IMPORT") == "0" and os.environ.get("VKSHMEM_SHM") != "0":
        check(all(proxy.direct[pe] is not None for pe in range(n) if pe != me),
              "a peer's mailbox is not mapped and registered")
        check(stats["direct"] > 0, f"no piece went straight to a peer's mailbox: {stats}")
    elif os.environ.get("VKSHMEM_SHM") == "0":
        check(stats["direct"] == 0 and not any(proxy.direct), f"direct pieces: {stats}")
    # a mapped heap (lavapipe: the CPU's copies and atomics) or CUDA: served in C, answered
    # through the mapping or the transport's C data path (hostproxy, UCX)
    if os.environ.get("VKSHMEM_GPU_MAPPED") != "0":
        native = proxy.server.native
        check(native is not None and int(native._p.rounds) > 0, "no native round ran")
for x in (many, mine, words, got, dst, src, probe):
    shmem.free(x)
shmem.barrier_all()
threads = [proxy.server._thread] if proxy is not None else []
shmem.finalize()
check(not any(t.is_alive() for t in threads), "the proxy thread outlived finalize")
print("gpu_proxy ok", flush=True)
