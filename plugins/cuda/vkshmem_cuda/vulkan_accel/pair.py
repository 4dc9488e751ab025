"""The Vulkan domain's all-reduce of two PEs on two GPUs joined by a direct CUDA link: push,
then reduce locally, in one C call (``csrc/cudapair.c``, the same round as the cuda domain's,
``vkshmem_cuda.pairreduce``).

Each member owns one share of the elements (the ring's shares,
:mod:`vkshmem.core.collectives.device_ring`). Between the core's two barriers, each PE on its link's
stream: the copy engine pushes its source's part of the peer's share into the peer's target
across NVLink, a ``cuStreamWriteValue32`` then writes the round number into the peer's word
for this PE (in the peer's control bytes, which the link maps), the stream waits for this PE's
own word (``cuStreamWaitValue32``: the peer's push landed, no host round trip), and one pass
of the reduce kernel folds this PE's share from local memory into both targets. Against the
ring's two steps (a push, a barrier through the host, the fused fold) it saves the middle
barrier and the host's wait between the phases. Arrays of 64 MiB or more go in two halves on
two streams, every byte across the link by the copy engine (the hub's :meth:`pair_stream`
and two of its events; ``csrc/cudapair.c`` says how and what it measured).

Both members take this path for the same calls or neither does (a collective that took two
paths would wait for a push that never comes): :func:`can_pair` depends only on what both
sides see alike, both heaps having the control bytes (CUDA's heaps), the link being direct
(the peer's heap mapped here, which it is where that heap is CUDA's), both PE numbers having a
word, and the kernel for the operation. Each partner PE has its own word and round count, so a
PE may pair with different peers in different teams. The wait is bounded by
``VKSHMEM_GPU_TIMEOUT``: a peer that never pushes gets this PE's stream released (its own word
written) and :class:`~vkshmem.core.errors.WaitTimeoutError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from vkshmem.plugin import CONTROL_BYTES, CONTROL_SLOT, CONTROL_WORDS, WaitTimeoutError

from .. import _ops

if TYPE_CHECKING:
    from .hub import LinkHub

__all__ = ["MAX_PE", "PairPlan", "can_pair", "pair_plan", "pair_round"]

#: PE numbers up to this one have a word in every heap's control bytes
MAX_PE = (CONTROL_BYTES - CONTROL_WORDS) // CONTROL_SLOT - 1
_SPIN_NS = 2_000_000  # spin on the stream this long, then nap (csrc/cudapair.c)
_NOT_READY = 600  # CUDA_ERROR_NOT_READY: the wait ran out


def can_pair(hub: LinkHub, direct: bool, peer_size: int, pes: tuple[int, int], op: str,
             dtype: np.dtype) -> bool:
    """Whether a link of ``hub`` (``direct``: the peer's heap of ``peer_size`` bytes mapped
    here) takes the pair round for members ``pes`` (see the module docstring)."""
    ctl = hub.control_off
    return (direct and ctl > 0 and peer_size >= ctl + CONTROL_BYTES and max(pes) <= MAX_PE
            and hub.fold_kernel(op, dtype) is not None)


class PairPlan(NamedTuple):
    """One call shape's round, worked out once (:func:`pair_plan`): the C call's arguments
    but the round number."""

    fn: int
    grid: int
    block: int
    push_dst: int  #: the peer's share in the peer's target
    push_src: int  #: the peer's share in this PE's source
    push_bytes: int
    mine: int  #: this PE's word (the peer writes it)
    theirs: int  #: the peer's word for this PE
    dsts: Any  # uint64_t[2]: this PE's share in both targets
    srcs: Any  # uint64_t[2]: its source and what the peer pushed, in the members' order
    count: int
    isz: int


def pair_plan(hub: LinkHub, peer_ptr: int, index: int, pes: tuple[int, int],
              shares: Sequence[tuple[int, int]], dst_off: int, src_off: int, op: str,
              dtype: np.dtype) -> PairPlan:
    """The round of a call shape (:func:`can_pair` true): ``index`` this PE's place in
    ``pes`` (the members' order), ``shares`` the (first element, count) each place owns,
    ``dst_off``/``src_off`` the target's and source's byte offsets (the same in both heaps,
    checked by the caller), ``peer_ptr`` the peer's heap as mapped here."""
    isz = np.dtype(dtype).itemsize
    local, ctl = hub.view.pointer, hub.control_off + CONTROL_WORDS
    (lo, n), (plo, pn) = shares[index], shares[1 - index]
    own_src, pushed = local + src_off + lo * isz, local + dst_off + lo * isz
    ffi = _ops.ffi
    fn, grid, block = hub.fold_launch(op, dtype, n)
    # the peer's part is in this PE's target by then: fold it with this PE's, members' order
    return PairPlan(int(fn), grid, block, peer_ptr + dst_off + plo * isz,
                    local + src_off + plo * isz, pn * isz,
                    local + ctl + CONTROL_SLOT * pes[1 - index],
                    peer_ptr + ctl + CONTROL_SLOT * pes[index],
                    ffi.new("uint64_t[2]", [local + dst_off + lo * isz,
                                            peer_ptr + dst_off + lo * isz]),
                    ffi.new("uint64_t[2]", [own_src, pushed] if index == 0
                            else [pushed, own_src]), n, isz)


def pair_round(hub: LinkHub, plan: PairPlan, seq: int, timeout: float) -> None:
    """One round of ``plan`` (collective over the pair, between the core's barriers):
    ``seq`` the round's number with this peer (both count alike, two a round: it uses
    ``seq - 1`` and ``seq``). The C call makes the link's context current (as the link's
    copies do)."""
    with hub.copy_lock:
        res = hub._lib.vkc_pair_round(hub.ctx_ptr, hub.stream_ptr, hub.pair_stream(),
                                      hub.local_events[0], plan.fn, plan.push_dst,
                                      plan.push_src, plan.push_bytes, plan.mine, plan.theirs,
                                      seq, plan.dsts, plan.srcs, plan.count, plan.isz,
                                      plan.grid, plan.block, _SPIN_NS, int(timeout * 1e9))
        if res == _NOT_READY:
            with hub.on(hub.view.context):
                _release(hub, plan.mine, seq, timeout)
    if res:
        hub.done(res, "the two-GPU all-reduce")


def _release(hub: LinkHub, mine: int, seq: int, timeout: float) -> Any:
    """The peer never pushed: release the stream by writing this PE's own word, let it
    drain (its kernel folds whatever this PE's target holds: the target is undefined after
    this error), and say so."""
    cu = hub.cu
    hub.check(cu.cuMemsetD32(mine, seq, 1), "cuMemsetD32 (releasing the stream)")
    cu.cuStreamSynchronize(hub.stream)
    raise WaitTimeoutError(
        f"the two-GPU all-reduce waited {timeout:g} s for the peer's push (it failed or took "
        "another path); VKSHMEM_GPU_TIMEOUT sets the limit")
