"""The ring all-reduce of a domain's arrays whose members are not all mapped on each other's
devices (e.g. the Vulkan domain across two GPUs, or ``VKSHMEM_DOMAIN_IMPORT=0``).

Called by :func:`vkshmem.core.collectives.device.reduce` before its scratch gather, which moves
``SCRATCH_BYTES`` per chunk with two team barriers each. Here the elements are cut into ``n``
shares (``n`` members, boundaries at multiples of :data:`ALIGN` elements) and the data lands
in the members' *targets*, never in the scratch:

* reduce-scatter, ``n - 1`` steps: at step ``s`` member ``r`` pushes its partial of share
  ``r - s`` (its source's part at ``s = 0``, else the slot of its target that it folded at
  step ``s - 1``) into the same slot of member ``r + 1``'s target; after a quiet and a team
  barrier the receiver folds its own source's part into that slot on the device (``dst op=
  src``, the domain's ``reduce``). Member ``r`` then holds share ``r + 1`` finished;
* all-gather, ``n - 1`` steps: at step ``t`` member ``r`` pushes finished share ``r + 1 - t``
  into member ``r + 1``'s target, then a quiet and a team barrier.

Why no slot is overwritten while still needed (indices mod ``n``): slot ``k`` of member ``q``
is written in the reduce-scatter only at step ``q - 1 - k`` (never for ``k = q``), and read
(pushed on) at the next step, by ``q`` itself after its fold; in the all-gather it is written
only at step ``q - k`` (never for ``k = q + 1``, the share ``q`` finished) and pushed on at the
next step. Each write hits a slot whose old contents nobody reads again, and the barrier
between steps orders every read before the write that follows. The first barrier makes every
target free; the last step's barrier is the closing one (no member returns while a peer still
writes its target). Every member ends with the same bytes, copied from the member that
finished each share: floating-point results agree everywhere (share ``k`` is folded in the
order ``k, k + 1, ...`` of the members, so they can differ in rounding from the gather's order).

Where the right member is reached through a domain link that can fold and push in one pass
(``DomainLink.fold_put``: the Vulkan domain's CUDA link, a kernel that writes the result into
both targets), the last fold of the reduce-scatter also does the first all-gather step's push:
its target slot is the right member's own share, which that member reads only after the next
barrier. Two members joined by a link that has a round of its own for the whole all-reduce
(``DomainLink.pairs``/``pair_reduce``: the Vulkan domain's direct CUDA link,
:mod:`vkshmem_cuda.vulkan_accel.pair`: push, a flag on the GPU, one fold into both targets) take it
between two team barriers instead of the steps above. Where the domain cannot reduce ``op`` on
``dtype`` (``reduce`` returns False), the folds run with numpy on host copies; the data movement
is the same. ``VKSHMEM_GPU_RING_REDUCE`` sets the smallest all-reduce (bytes) that takes this
path, 0 turns it off. Its default, 128 KiB, is where the ring stops losing to one scratch chunk
on lavapipe through the proxy (float32 sums, best of 20-30): 2 PEs tie at 64-128 KiB (0.31-0.46
ms either way) and the ring wins from 256 KiB (0.57 against 0.65-1.0 ms); 4 PEs tie at 64 KiB
(2.1-3.3 against 2.4-3.0 ms), the ring wins at 128 KiB (2.6-3.3 against 5.2-5.5 ms) and loses at
16 KiB (1.7-2.5 against 1.6-1.8 ms).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..domains.contract import DomainArray
from ..domains.heap import DomainHeap
from .team import CollTeam

__all__ = ["ALIGN", "pair_call", "quiet_sync", "ring_reduce"]

#: share boundaries fall on multiples of this many elements
ALIGN = 256
#: elements per numpy fold where the device cannot reduce (bounds the host copies)
_HOST_FOLD = 1 << 20
#: how many all-reduces took this path in this process, and how many of them folded and
#: pushed in one pass (``DomainLink.fold_put``; read by tests/pe/gpu_ring_reduce.py)
_taken = 0
_fused = 0
#: and how many of them were a two-member pair's round (``DomainLink.pair_reduce``)
_paired = 0


@functools.lru_cache(maxsize=64)  # a repeated call shape: one lookup
def _shares(cnt: int, n: int) -> tuple[tuple[int, int], ...]:
    """(first element, count) of each member's share: ``n`` ranges covering ``cnt``."""
    per = -(-cnt // n)
    per = -(-per // ALIGN) * ALIGN
    return tuple((min(k * per, cnt), min((k + 1) * per, cnt) - min(k * per, cnt))
                 for k in range(n))


def quiet_sync(ct: CollTeam) -> None:
    """Complete this PE's puts, then the team's barrier: one step of a device collective
    (every member's pushes have landed when it returns)."""
    ct.rt.quiet()
    ct.ts.sync()


class _Folder:
    """``dst op= src`` within this PE's segment: on the device until the domain says it
    cannot, then by numpy on host copies."""

    def __init__(self, heap: DomainHeap, op: str, ufunc: np.ufunc, dt: np.dtype) -> None:
        self.heap, self.op, self.ufunc, self.dt = heap, op, ufunc, dt
        self.on_device = True

    def fold(self, dst_off: int, src_off: int, m: int) -> None:
        heap, dt = self.heap, self.dt
        if self.on_device:
            self.on_device = heap.reduce(dst_off, src_off, m, self.op, dt)
            if self.on_device:
                return
        isz = dt.itemsize
        for lo in range(0, m, _HOST_FOLD):
            k = min(_HOST_FOLD, m - lo)
            acc = np.empty(k, dt)
            mine = np.empty(k, dt)
            heap.read_local(dst_off + lo * isz, memoryview(acc).cast("B"))
            heap.read_local(src_off + lo * isz, memoryview(mine).cast("B"))
            self.ufunc(acc, mine, out=acc)
            heap.write_local(dst_off + lo * isz, memoryview(acc).cast("B"))


def _applies(ct: CollTeam, heap: DomainHeap, target: DomainArray, source: object,
             nbytes: int) -> bool:
    """Whether the ring (or a pair's round) takes an all-reduce of ``nbytes`` (see
    :func:`ring_reduce`); never in place (a member would overwrite a source it still reads)."""
    least = ct.rt.config.gpu_ring_reduce
    if not (isinstance(source, DomainArray) and source.domain is heap.domain and ct.n >= 2
            and least and nbytes >= least):
        return False
    t0, s0 = target.offset, source.offset
    return not (t0 < s0 + nbytes and s0 < t0 + nbytes)


def pair_call(ct: CollTeam, heap: DomainHeap, target: DomainArray, source: object, cnt: int,
              op: str, dt: np.dtype) -> Callable[[], None] | None:
    """Where two members are joined by a link that has a round of its own for the whole
    all-reduce (``DomainLink.pairs``), that round as a call to run between two team barriers
    (it counts itself as taken); None where the ring's steps or another path run. The same
    answer on every member."""
    if ct.n != 2 or not _applies(ct, heap, target, source, cnt * dt.itemsize):
        return None
    me = ct.me
    pes = (ct.pes[0], ct.pes[1])
    link = heap.links[pes[1 - me]]
    if link is None or not link.pairs(pes, op, dt):
        return None
    shares, t0, s0 = _shares(cnt, 2), target.offset, source.offset  # type: ignore[attr-defined]

    def call() -> None:
        global _taken, _paired
        _taken += 1
        _paired += 1
        link.pair_reduce(me, pes, shares, t0, s0, op, dt)
    return call


def ring_reduce(ct: CollTeam, heap: DomainHeap, target: DomainArray, source: object, cnt: int,
                op: str, ufunc: np.ufunc) -> bool:
    """Collective over the team of ``ct``: ``target[:cnt]`` = ``op`` over every member's
    ``source[:cnt]`` by the ring above, where it applies: ``source`` an array of the target's
    domain not overlapping it, two members or more, at least ``VKSHMEM_GPU_RING_REDUCE``
    bytes. The decision depends only on arguments every member shares. False when not taken
    (nothing done; the caller's path runs). Two members whose link has a round of its own
    take :func:`pair_call` instead (the caller asks it first)."""
    global _taken, _fused
    dt = np.dtype(target.dtype)
    isz = dt.itemsize
    if not _applies(ct, heap, target, source, cnt * isz):
        return False
    _taken += 1
    n, me = ct.n, ct.me
    right = ct.pes[(me + 1) % n]
    shares = _shares(cnt, n)
    link = heap.links[right]
    t0, s0 = target.offset, source.offset  # type: ignore[attr-defined]
    folder = _Folder(heap, op, ufunc, dt)
    put_device = heap.transfers.put_device
    ct.ts.sync()  # every member's target is free to be written
    pushed = False  # the last fold also wrote its result into the right member's target
    for s in range(n - 1):  # reduce-scatter
        lo, m = shares[(me - s) % n]
        if m:  # share me - s: my source's part first, then the partial I folded last step
            put_device(right, t0 + lo * isz, (s0 if s == 0 else t0) + lo * isz, m * isz)
        quiet_sync(ct)
        lo, m = shares[(me - 1 - s) % n]
        if m and s == n - 2 and link is not None and folder.on_device:
            pushed = link.fold_put(t0 + lo * isz, s0 + lo * isz, m, op, dt)
            _fused += pushed
        if m and not pushed:
            folder.fold(t0 + lo * isz, s0 + lo * isz, m)
    for t in range(n - 1):  # all-gather of the finished shares
        lo, m = shares[(me + 1 - t) % n]
        if m and not (t == 0 and pushed):
            put_device(right, t0 + lo * isz, t0 + lo * isz, m * isz)
        quiet_sync(ct)  # the last one: nobody returns while a peer still writes its target
    return True
