"""The all-reduce of two PEs on two GPUs (NVLink or PCIe peers): push, then reduce locally.

Each PE owns half of the elements (its *share*). Instead of a kernel that reads the peer's
source over the link (SM loads across NVLink keep the link less busy than the copy engine),
each PE's copy engine first pushes its source's part of the *peer's* share into the peer's
target, then one kernel reduces its share from local memory (its source and the pushed part
in its target) into its target and the peer's. Every byte crosses the link once each way.
Measured on 2 x H100 NVLink (tests/gpu/allreduce_probe.py, the GPUs' time for 256 MiB of
float32): 0.93 of one 256 MiB peer copy (0.94 of two at once, one each way), against 0.87 for
the share kernel; pipelining the phases in chunks only lost (0.91 in 4 chunks down to 0.68:
a copy engine moves a 16 MiB copy at 0.8 of its 256 MiB rate), and so did pushing the whole
source in chunks, each folded locally as it lands (no second phase on the link: 822-866 us in
every chunking tried, against 740; the folds slow the copies more than they hide). What did
gain: arrays of 64 MiB or more go in two halves on two streams, the fold into the local
target only (on half a block per SM) and the result pushed by the copy engine too, so the
link carries copies back to back (GPU time at 256 MiB: 711-716 against 740 us on 2 x H200,
719 against 744 on 2 x H100; ``cudapair.c`` has the schedule).

Each round is issued and waited for by one C call (``vkc_pair_round``, this plugin's
``csrc/cudapair.c``) on this PE's own stream, GIL released, its arguments worked out
once per call shape (a :class:`Plan`, which the domain keeps): the push, then a write of the
peer's PUSHED word (``cuStreamWriteValue32``, ordered after the copy), a wait for this PE's own
(``cuStreamWaitValue32``: no host round trip between the phases), then the kernel (two 16-byte
loads per source in flight per thread, two blocks per SM: it reads local memory only; measured
735 against 745 us with the NVLink-reading kernel's four and four); the core's barriers come
before (the peer's target is free) and after (its writes into mine are done).
Signalling entry and end on the GPUs the same way, without those barriers, measured 8 us
slower per call on 2 x H100. The words live in each heap's control granule (past the usable
segment, see :class:`~.domain.CudaDomain`), one per partner PE at its index, and both
partners count their rounds with each other alike (both take this path for the same calls:
the decision depends only on the members and the size), so the pairs of different teams
never mix. The wait is bounded by ``VKSHMEM_GPU_TIMEOUT``: when the peer never pushes (it
failed), this PE releases its stream by writing its own word, and the call raises.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from vkshmem.plugin import WaitTimeoutError

from ._ops import ffi as _ffi
from ._ops import lib as _lib
from .driver import Mapping, check
from .reducer import Reducer

__all__ = ["SLOT", "PairReduce", "Plan", "pair_members"]

#: the bytes of each partner's words in a PE's control granule (one, PUSHED, is used)
SLOT = 16
_BLOCK = 512
_UNROLL = 2  # packs in flight per thread per source (kernels.reduce_source)
_PER_SM = 2  # blocks per SM
_SPIN_NS = 2_000_000  # spin on the stream this long, then nap (csrc/cudapair.c)
_NOT_READY = 600  # CUDA_ERROR_NOT_READY: the wait ran out


class Plan(NamedTuple):
    """One call shape's round, worked out once (:meth:`PairReduce.plan`): the C call's
    arguments but the round number."""

    peer: int  #: the partner's PE
    mine: int  #: this PE's PUSHED word (the peer writes it)
    theirs: int  #: the peer's PUSHED word (this PE writes it)
    fn: int
    push_dst: int
    push_src: int
    push_bytes: int
    dsts: Any  # uint64_t[2]: this PE's share in both targets
    srcs: Any  # uint64_t[2]: its source and what the peer pushed, in the members' order
    count: int
    grid: int
    isz: int


class PairReduce:
    """The two-GPU all-reduce of one domain (see the module docstring); ``timeout`` seconds
    bound each call."""

    def __init__(self, reducer: Reducer, timeout: float) -> None:
        self.device = device = reducer.device
        self.reducer = reducer
        self.timeout = timeout
        self.rounds = 0  #: calls so far, with any partner
        self._seq: dict[int, int] = {}  # per partner PE: the rounds with it (alike on both)
        cu = device.cu
        device.current()
        #: its own streams (a wait on the peer's words holds no other operation of the
        #: domain; the second and two events serve the split round of large arrays)
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                            "cuStreamCreate")
        self._stream = int(self.stream)
        self.stream2 = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                             "cuStreamCreate")
        self._events = [check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING),
                              "cuEventCreate") for _ in range(2)]
        self._stream2 = int(self.stream2)
        self._event_ptrs = _ffi.new("uintptr_t[2]", [int(e) for e in self._events])

    def plan(self, me: int, peer: int, dst: tuple[int, int], src: tuple[int, int],
             words: tuple[int, int], count: int, share: int, op: str,
             dtype: np.dtype) -> Plan:
        """The round of a call shape: ``dst``/``src``/``words`` are (this PE's, the peer's)
        device addresses of the target, the source and the PUSHED word the other one writes,
        ``me`` this PE's index (0 or 1) in the members' order, ``peer`` the partner's PE,
        ``share`` the elements each index owns (the last one the rest). Compiles the kernel
        on first use."""
        red = self.reducer
        isz = np.dtype(dtype).itemsize
        lo, hi = me * share, min(count, (me + 1) * share)
        plo, phi = (1 - me) * share, min(count, (2 - me) * share)
        mine, pushed = src[0] + lo * isz, dst[0] + lo * isz
        n = max(0, hi - lo)
        # the peer's part is in my target by then: fold it with mine, in the members' order
        return Plan(peer, words[0], words[1], red.fn(op, dtype, _UNROLL),
                    dst[1] + plo * isz, src[0] + plo * isz, max(0, phi - plo) * isz,
                    _ffi.new("uint64_t[2]", [dst[0] + lo * isz, dst[1] + lo * isz]),
                    _ffi.new("uint64_t[2]", [mine, pushed] if me == 0 else [pushed, mine]),
                    n, red.grid(n, dtype, _BLOCK, _PER_SM), isz)

    def round(self, plan: Plan) -> None:
        """Collective over the pair, between two barriers: one all-reduce of ``plan``'s
        shape."""
        self.rounds += 1
        # two numbers a round (seq - 1, seq: the split round's halves)
        seq = self._seq[plan.peer] = (self._seq.get(plan.peer, 0) + 2) & 0xFFFFFFFF or 2
        dev = self.device
        res = _lib.vkc_pair_round(dev.ctx_ptr, self._stream, self._stream2,
                                  self._event_ptrs, plan.fn, plan.push_dst, plan.push_src,
                                  plan.push_bytes, plan.mine, plan.theirs, seq, plan.dsts,
                                  plan.srcs, plan.count, plan.isz, plan.grid, _BLOCK,
                                  _SPIN_NS, int(self.timeout * 1e9))
        if res == _NOT_READY:
            self._release(self._stream, plan.mine, seq)
        dev._done(res, "the pair all-reduce")

    def _release(self, stream: int, mine: int, seq: int) -> None:
        """The peer never pushed: release the stream by writing this PE's word, let it
        drain (its kernel folds whatever this PE's target holds: the target is undefined
        after this error), and say so."""
        cu = self.device.cu
        check(cu.cuMemsetD32(mine, seq, 1), "cuMemsetD32 (releasing the stream)")
        cu.cuStreamSynchronize(stream)
        raise WaitTimeoutError(
            f"the two-GPU all-reduce waited {self.timeout:g} s for the peer's push (it failed "
            "or took another path); VKSHMEM_GPU_TIMEOUT sets the limit")

    def close(self) -> None:
        """Destroy the streams and events (the domain's close, before the heap goes)."""
        if self.stream is not None:
            self.device.current()
            cu = self.device.cu
            cu.cuStreamDestroy(self.stream)
            cu.cuStreamDestroy(self.stream2)
            for ev in self._events:
                cu.cuEventDestroy(ev)
            self.stream = self.stream2 = None


def pair_members(sources: list[tuple[Mapping, int]], local: Mapping) -> int:
    """This PE's index when ``sources`` are two members, this PE and a peer on another GPU
    (imported with ``remote_gpu``), else -1."""
    if len(sources) != 2:
        return -1
    (first, _), (second, _) = sources
    if first is local and second.remote_gpu:
        return 0
    if second is local and first.remote_gpu:
        return 1
    return -1
