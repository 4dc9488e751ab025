"""Stream-ordered operations: the optional part of the memory-domain contract behind the API's
``stream=`` (plugin API 1.2).

A user's GPU work is queued on streams (a CUDA stream of torch, CuPy or cuda-bindings). A
domain that can enqueue vkshmem's operations on such a stream returns a :class:`StreamOps`
from :meth:`MemoryDomain.stream_ops <vkshmem.core.domains.contract.MemoryDomain.stream_ops>`:
each method *issues* its operation on the stream and returns at once; the stream runs it after
the work queued before it and before the work queued after it. The CPU never waits for the
stream in these methods (except :meth:`StreamOps.synchronize`).

The core decides per call whether it can enqueue (the arrays are the domain's, the peers'
segments are imported here: ``direct`` routes, the domain returned a :class:`StreamOps`);
otherwise it *falls back*: :meth:`StreamOps.synchronize` (or the stream object's own
``synchronize()`` where no open domain takes the stream), then the blocking call. Memory
handles are those of the :class:`~vkshmem.core.domains.contract.MemoryDomain` (its ``local``
or what ``import_peer`` returned); offsets are bytes from the start of the segment and are
checked by the core.

Waits on a stream (:meth:`StreamOps.wait`, :meth:`StreamOps.barrier`) must be bounded on the
device: a wait that times out records the failure where the host can read it and lets the
stream go on; :meth:`StreamOps.check` raises it (``WaitTimeoutError``). The core calls
``check`` at every call given the stream, the domain raises it at its ``quiet`` and
``check_errors`` and returns it from ``stop_threads`` (finalize).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ..transports.contract import AmoOp

__all__ = ["StreamOps"]


class StreamOps(ABC):
    """One domain's operations on one user stream (made by ``MemoryDomain.stream_ops``)."""

    #: the stream as the domain names it (for messages), e.g. a CUDA stream handle
    handle: int = 0
    #: whether :meth:`wait` is issued on this stream (False: the core synchronizes the
    #: stream and waits on the CPU, e.g. a device without the shader clock a bounded GPU
    #: wait needs)
    can_wait: bool = True

    def reaches(self, mem: Any) -> bool:
        """Whether the stream's device addresses memory handle ``mem`` (this PE's segment or
        a peer's imported one); where it does not, the core falls back. Every handle by
        default."""
        return True

    @abstractmethod
    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        """Issue a copy between two memory handles (this PE's segment or a peer's imported
        one)."""

    @abstractmethod
    def write(self, mem: Any, offset: int, src: memoryview) -> bool:
        """Issue a copy of host bytes into ``mem`` (``src`` must not change before the stream
        has run it). False, issuing nothing, where the host memory cannot be copied without
        the CPU (e.g. pageable memory): the core falls back."""

    @abstractmethod
    def read(self, mem: Any, offset: int, dst: memoryview) -> bool:
        """Issue a copy of ``mem`` into host bytes ``dst`` (filled once the stream has run
        it). False, issuing nothing, as for :meth:`write`."""

    @abstractmethod
    def amo(self, mem: Any, offset: int, op: AmoOp, width: int, operand: int) -> None:
        """Issue a non-fetching AMO (``SET``, ``ADD``, ``AND``, ``OR``, ``XOR``) on the aligned
        ``width``-byte word, atomic with every other vkshmem AMO on it."""

    @abstractmethod
    def wait(self, offset: int, cmp: int, value: int) -> None:
        """Issue a wait until this PE's 64-bit word at ``offset`` satisfies ``word cmp value``
        (``cmp``: the ``CMP`` code 1..6: EQ, NE, GT, LE, LT, GE; unsigned), bounded on the
        device (see the module docstring); later work on the stream sees every write made
        before the word's update."""

    @abstractmethod
    def barrier(self, members: Sequence[Any], index: int, slot: int) -> bool:
        """Issue a barrier among ``members`` (every member's memory handle, this PE's
        ``local`` at ``index``; all imported here) over counters of barrier family ``slot``
        (0: every PE of the job): the stream passes it once every member's stream reached its
        barrier of the same number. Bounded like :meth:`wait`. False, issuing nothing, where
        the domain cannot for this many members (the same answer on every member)."""

    @abstractmethod
    def can_reduce(self, op: str, dtype: Any, members: int) -> bool:
        """Whether :meth:`reduce` does ``op`` on numpy ``dtype`` over ``members`` sources (the
        answer depends on nothing else: every member decides alike)."""

    @abstractmethod
    def reduce(self, dst_offset: int, sources: Sequence[tuple[Any, int]], count: int, op: str,
               dtype: Any) -> None:
        """Issue ``dst[i] = op over sources[j][i]`` for ``count`` elements into this PE's
        segment at ``dst_offset`` (sources: (memory handle, offset), folded in order)."""

    @abstractmethod
    def after_domain(self) -> None:
        """Make the stream wait for the domain's non-blocking operations issued so far (its
        ``*_nbi`` methods), without the CPU waiting: ``quiet(stream=)``."""

    @abstractmethod
    def check(self) -> None:
        """Raise a failure the stream's operations recorded (``WaitTimeoutError`` for a wait
        or barrier that timed out), once; nothing otherwise."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait (CPU) until the stream has run everything queued on it: the fallback."""
