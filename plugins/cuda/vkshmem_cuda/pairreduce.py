"""The all-reduce of a two-member team whose members map each other's heaps (one PE per GPU
over NVLink, or two PEs on one GPU): each member owns half of the elements. In ``PIECES``
pieces, pipelined over the domain's two streams: the copy of the peer's source piece into this
member's target (stream 1), then (stream 2, after an event) the reduce kernel in place, in
member order, and the push of the reduced piece into the peer's target. The pulls run one way
over the link while the pushes run the other, so the whole moves about half the data each way
once, where one kernel reading the peer's whole source moved all of it through loads (0.74 of
a single 256 MiB peer copy on two H100s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._ops import lib as _lib
from .driver import check

if TYPE_CHECKING:
    from .driver import Device

__all__ = ["PIECES", "reduce_pair"]

#: pieces of each member's half (the last one's reduce and push are what is not overlapped)
PIECES = 8
_ALIGN = 256  # elements: pieces start 16-byte aligned for every dtype


def reduce_pair(dev: Device, fn: int, dst: int, peer_dst: int, mine: int, theirs: int,
                count: int, itemsize: int, me_first: bool) -> None:
    """Reduce ``count`` elements (this member's half: addresses already offset to it) of
    ``mine`` and ``theirs`` (the peer's source, mapped here) into ``dst`` and ``peer_dst``;
    ``me_first``: this member's source is the left operand (member order)."""
    cu = dev.cu
    dev.current()
    pull, work = dev.stream, dev.side_stream()
    per = max(_ALIGN, -(-count // PIECES // _ALIGN) * _ALIGN)
    events = dev.events(PIECES)
    for j, lo in enumerate(range(0, count, per)):
        n = min(per, count - lo)
        off, nbytes = lo * itemsize, n * itemsize
        check(cu.cuMemcpyDtoDAsync(dst + off, theirs + off, nbytes, pull), "cuMemcpyDtoDAsync")
        check(cu.cuEventRecord(events[j], pull), "cuEventRecord")
        check(cu.cuStreamWaitEvent(work, events[j], 0), "cuStreamWaitEvent")
        order = [mine + off, dst + off] if me_first else [dst + off, mine + off]
        dev.launch_reduce(fn, [dst + off], order, n, itemsize, stream=work, wait=False)
        check(cu.cuMemcpyDtoDAsync(peer_dst + off, dst + off, nbytes, work),
              "cuMemcpyDtoDAsync")
    # the work stream waited for every pull: its end is the end of both
    dev._done(_lib.vkc_sync(dev.ctx_ptr, work, dev.spin_ns), "cuStreamSynchronize")
