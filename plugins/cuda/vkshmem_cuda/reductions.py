"""The cuda domain's reductions of mapped peers (a mixin of
:class:`~vkshmem_cuda.domain.CudaDomain`): one kernel reading every member's source where it
lives, each member reducing its share into every member's target; two members on two GPUs push,
then reduce locally (:mod:`.pairreduce`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.plugin import InvalidArgumentError

from .driver import Device, Mapping
from .kernels import MAX_SOURCES, reduce_source
from .pairreduce import SLOT, PairReduce, Plan, pair_members
from .reducer import Reducer

__all__ = ["Reductions"]

_SHARE_ALIGN = 256  # elements: each member's share of a reduction starts 16-byte aligned
_PAIR_MIN = 1 << 20  # bytes: smaller two-GPU all-reduces take the share kernel (one launch)
_PAIR_PLANS = 64  # the distinct pair all-reduce call shapes whose rounds are kept


class Reductions:
    """``reduce_from`` of :class:`~vkshmem_cuda.domain.CudaDomain` (which sets the attributes
    declared here)."""

    device: Device
    local: Mapping
    size: int
    my_pe: int
    reducer: Reducer
    _timeout: float
    _box: int
    _pair: PairReduce | None
    _pair_plans: dict[tuple[Any, ...], Plan]

    if TYPE_CHECKING:  # CudaDomain's
        def check_range(self, offset: int, nbytes: int, what: str) -> None: ...

    def can_reduce_from(self, op: str, dtype: np.dtype) -> bool:
        return reduce_source(op, dtype) is not None

    def reduce_from(self, dst_offset: int, sources: list[tuple[Any, int]], count: int, op: str,
                    dtype: np.dtype) -> None:
        """A share of the result per member: this PE reduces its slice of the elements, reading
        every member's source where it lives, and writes it into every member's target (the
        same offset in each member's heap, mapped here): each byte crosses NVLink once each way
        instead of every member reading every other's whole source. Two members on two GPUs
        push, then reduce (:mod:`.pairreduce`). More members than one launch takes: this PE
        reduces everything into its own target. Every member calls this between the same two
        barriers (the core's contract). A pair's round is kept per call shape (its
        :class:`~.pairreduce.Plan`): a repeated call goes straight to it."""
        key = None
        if len(sources) == 2:
            (first, first_off), (second, second_off) = sources
            key = (dst_offset, id(first), first_off, id(second), second_off, count, op, dtype)
            plan = self._pair_plans.get(key)
            if plan is not None:
                self._pair.round(plan)  # type: ignore[union-attr]  # it made the plan
                return
        isz = np.dtype(dtype).itemsize
        self.check_range(dst_offset, count * isz, "CUDA reduce")
        for _mem, off in sources:
            self.check_range(off, count * isz, "CUDA reduce")
        members = [mem for mem, _off in sources]
        pair = pair_members(sources, self.local)
        if pair >= 0 and count * isz >= _PAIR_MIN:
            self._pair_reduce(pair, dst_offset, sources, count, op, dtype, key)
            return
        me = next((i for i, mem in enumerate(members) if mem is self.local), -1)
        if me < 0 or len(members) > MAX_SOURCES:
            self.reducer.run([self.local.va + dst_offset],
                             [mem.va + off for mem, off in sources], count, op, dtype)
            return
        share = -(-count // len(members) // _SHARE_ALIGN) * _SHARE_ALIGN
        lo, hi = me * share, min(count, (me + 1) * share)
        if lo < hi:
            self.reducer.run([mem.va + dst_offset + lo * isz for mem in members],
                             [mem.va + off + lo * isz for mem, off in sources], hi - lo, op,
                             dtype)

    def _pair_reduce(self, me: int, dst_offset: int, sources: list[tuple[Any, int]],
                     count: int, op: str, dtype: np.dtype,
                     key: tuple[Any, ...] | None = None) -> None:
        """Two members on two GPUs: push, then reduce locally (see :mod:`.pairreduce`); the
        round's plan is kept under ``key``."""
        if self._pair is None:
            self._pair = PairReduce(self.reducer, self._timeout)
        peer, peer_off = sources[1 - me]
        share = -(-count // 2 // _SHARE_ALIGN) * _SHARE_ALIGN
        plan = self._pair.plan(me, peer.pe, (self.local.va + dst_offset, peer.va + dst_offset),
                               (self.local.va + sources[me][1], peer.va + peer_off),
                               (self._control(self.local, peer.pe),
                                self._control(peer, self.my_pe)), count, share, op, dtype)
        self._pair.round(plan)
        if key is not None:
            if len(self._pair_plans) >= _PAIR_PLANS:
                self._pair_plans.clear()
            self._pair_plans[key] = plan

    def _control(self, mem: Mapping, writer: int) -> int:
        """The device address of the pair all-reduce's words in ``mem`` that PE ``writer``
        writes (each partner its own: :data:`~.pairreduce.SLOT` bytes at ``writer``'s index
        in the allocation's last granule, past the segment)."""
        if (writer + 1) * SLOT > self._box - self.size:  # the service's box follows
            raise InvalidArgumentError(f"PE {writer}: more PEs than the CUDA heap's control "
                                       "granule has pair all-reduce slots")
        return mem.va + mem.size - self.device.granularity + writer * SLOT
