"""The GPU proxy's pieces as its bandwidth path cuts them (tests/test_proxy_pieces.py): transfers
of one to several MiB in pieces of VKSHMEM_GPU_PROXY_CHUNK (256K here: gets of 64 KiB and more
are answered straight from a CPU-mapped segment, puts sent straight from it), each followed by
a signal the target waits for. Every PE sends to its right neighbour while its left one sends
to it, so pieces of several senders are in flight at once. A piece lost, reordered, sent from
the mapping after a later put changed it, or landing after the signal shows up as wrong bytes
or a failed check. Run with VKSHMEM_SHM=0 (hostproxy or UCX) or VKSHMEM_DOMAIN_IMPORT=0."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.proxy.mailbox import pieces

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
MIB = 1 << 20
SIZES = [MIB, MIB + 4096 + 123, 3 * MIB + 77]
top = max(SIZES)
src = shmem.zeros(top, np.uint8, domain="gpu")
dst = shmem.zeros(top, np.uint8, domain="gpu")
back = shmem.zeros(top, np.uint8, domain="gpu")
sig = shmem.new_signal()
gsig = shmem.new_signal(domain="gpu")
heap = shmem._state.rt.domains.heaps[src.domain.spec.name]
proxy = heap.proxy
check(proxy is not None and heap.route_names[right] == "proxy", f"routes {heap.route_names}")
mapped = proxy.dops.view is not None


def pattern(pe: int, nbytes: int, salt: int) -> np.ndarray:
    return np.random.default_rng(7919 * pe + salt).integers(0, 256, nbytes, dtype=np.uint8)


for size in SIZES:
    cut = pieces(size, proxy.chunk, mapped)
    check(len(cut) >= 2 and max(p for _, p in cut) <= proxy.chunk, f"{size}: pieces {cut}")

rounds = 0
for salt, size in enumerate(SIZES):
    for nbi in (False, True):
        rounds += 1
        src.copy_from(np.concatenate([pattern(me, size, salt * 2 + nbi),
                                      np.zeros(top - size, np.uint8)]))
        shmem.barrier_all()
        if nbi:  # pieces left in flight, then fence: the signal after every one of them
            shmem.put_nbi(dst[:size], src[:size], right)
            shmem.fence()
            shmem.atomic_set(sig, rounds, right)
        else:
            shmem.put(dst[:size], src[:size], right)
            shmem.atomic_set(gsig, rounds, right)  # through the proxy, after the pieces
        if nbi:
            shmem.signal_wait_until(sig, shmem.CMP.EQ, rounds)
        else:
            shmem.wait_until(gsig, shmem.CMP.EQ, rounds)
        got = dst.to_numpy()[:size]
        check(np.array_equal(got, pattern(left, size, salt * 2 + nbi)),
              f"{size} B put{'_nbi' if nbi else ''} from PE {left}: "
              f"{int(np.count_nonzero(got != pattern(left, size, salt * 2 + nbi)))} bytes wrong")
        # the pieces of a get, each answered (where mapped) straight from the peer's segment
        shmem.barrier_all()
        shmem.get(back[:size], src[:size], right)
        check(np.array_equal(back.to_numpy()[:size], pattern(right, size, salt * 2 + nbi)),
              f"{size} B get from PE {right}")
        shmem.barrier_all()  # before the next round rewrites src

# a get and a later put of the same range served in one round: the get's answer holds the
# bytes from before the put, even when sent from the mapping after the round's other copies
shmem.barrier_all()
size = 2 * MIB
old, new = pattern(me, size, 90), pattern(me, size, 91)
src.copy_from(np.concatenate([old, np.zeros(top - size, np.uint8)]))
back.copy_from(np.concatenate([new, np.zeros(top - size, np.uint8)]))
shmem.barrier_all()
shmem.get_nbi(dst[:size], src[:size], right)
shmem.put_nbi(src[:size], back[:size], right)
shmem.quiet()
check(np.array_equal(dst.to_numpy()[:size], pattern(right, size, 90)), "get before put")
shmem.barrier_all()
check(np.array_equal(src.to_numpy()[:size], pattern(left, size, 91)), "put after get")

stats = proxy.stats
check(stats["requests"] > 0, f"no proxy requests: {stats}")
if mapped and proxy.direct[right] is None:  # sent from the mapping, not staged
    check(stats["mapped"] > 0, f"no piece sent from the mapping: {stats}")
if mapped and proxy.direct[right] is not None:  # into the peer's mailbox past the caches
    check(stats["streamed"] > 0, f"no piece copied with streaming stores: {stats}")
shmem.barrier_all()
print(f"PE {me}: proxy {stats}", flush=True)
print("proxy_pieces ok", flush=True)
