"""The memory-domain contract: what a plugin declares (:class:`DomainSpec`) and implements.

A memory domain supplies one symmetric segment per PE in some kind of memory (GPU memory of a
Vulkan device, a CUDA VMM allocation, hugepages, ...). The host heap (a memfd) is the core's
built-in; every other domain is a plugin, discovered through the entry-point group
``vkshmem.domains`` with the hook ``register_domains`` (see :mod:`vkshmem.core.plugins.hookspecs`)
and the same load policy as transports. Its life:

1. At start-up every installed domain gets a segment number (0 is the host heap, 1 the
   core's internal segment, then the domains in name order: the same on every PE).
2. The first allocation in the domain (``shmem.zeros(..., domain=name)``) opens it on every
   PE (collective): the core calls ``spec.factory(context)``, which creates this PE's segment.
3. ``export()`` gives fds and metadata for same-node peers; the core all-gathers the metadata,
   passes the fds over Unix sockets to peers of the same ``group``, and calls
   ``import_peer`` for each; an import that raises makes that peer reachable another way.
   Peers of the same node and ``link_group`` but another ``group`` (e.g. other GPUs that a
   vendor API can copy between) get the fds too, for ``link_peer``: a :class:`DomainLink`
   moves puts and gets to that peer (route ``link+proxy``: AMOs through the proxy; ``link``
   where the link carries them too, ``DomainLink.amos``).
4. ``describe()`` tells transports what the memory is (``SegmentInfo.kind``: ``host`` with a
   host address, ``opaque_fd``, ``dmabuf``, ``cuda_va``); a transport whose
   ``TransportSpec.memory_kinds`` holds that kind carries traffic to peers it reaches: the
   operation classes it carries on it (``Transport.carries(kind)``: ``rma``, ``amo``), the
   rest of those peers' operations (e.g. AMOs on CUDA memory by UCX) going through the
   domain proxy. Peers neither imported nor reachable by such a transport go through the
   core's domain proxy, which asks the target PE's proxy thread to apply the operation with
   the local operations below (its AMOs with ``amo``: atomic with the device's own).
5. Local operations take a *memory handle*: :attr:`MemoryDomain.local` (this PE's segment) or
   what ``import_peer`` returned. Offsets are bytes from the start of the segment.
6. ``close()`` releases everything (after ``stop_threads``).

Arrays: a domain whose memory the CPU cannot address hands users its own array type, a
subclass of :class:`DomainArray`; the API dispatches on the array's ``domain``. A domain of
kind ``host`` (memory the CPU maps) may hand out plain numpy arrays over ``describe().buffer``:
the core registers such a segment in its native address table, so those arrays take the host
paths (shm, transports) unchanged.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import VkshmemError
from ..plugins.apiversion import API_VERSION
from ..transports.contract import AmoOp, SegmentInfo
from .array import DomainArray
from .stream import StreamOps

if TYPE_CHECKING:
    import numpy as np

    from ..config import Config

__all__ = [
    "DomainArray",
    "DomainContext",
    "DomainExport",
    "DomainLink",
    "DomainSpec",
    "MemoryDomain",
    "StreamOps",
]



@dataclass(frozen=True)
class DomainSpec:
    """What a plugin declares about one memory domain.

    ``family`` is what users may ask for instead of the name: ``"gpu"`` domains answer
    ``domain='gpu'`` (the highest ``priority`` one that is available) and ``domain='auto'``
    (when ``accelerator()`` is true on every PE); ``"host"`` domains only their name.
    ``accelerator(config)`` is a cheap, local, non-collective probe: does this PE have a real
    accelerator for this domain (not an emulation such as a CPU Vulkan driver)?
    ``available(config)``: could the domain open here at all (its library and a device are
    present; None: always)? ``domain='gpu'`` takes the first gpu-family domain available on
    every PE. ``size_variable``: the variable users raise when the heap is full; ``variables``:
    every variable the plugin reads (for ``vkshmem info``).
    """

    name: str
    factory: Callable[[DomainContext], MemoryDomain]
    family: str = "gpu"
    priority: int = 0
    #: the plugin API version the spec was built for (:mod:`vkshmem.core.plugins.apiversion`)
    api_version: str | int = API_VERSION
    accelerator: Callable[[Config], bool] | None = None
    available: Callable[[Config], bool] | None = None
    description: str = ""
    #: the environment variable that sets the heap's size (named in HeapExhaustedError)
    size_variable: str = ""
    #: what ``describe()`` may report, for ``vkshmem info``'s statement of which transports
    #: register the heap: ``SegmentInfo.kind`` values (``host``, ``opaque_fd``, ``cuda_va``)
    #: and ``dmabuf`` where a dma-buf may come with them (empty: not declared)
    memory_kinds: frozenset[str] = frozenset()
    #: the plugin's own environment variables, ``(name, default, meaning)`` each: ``vkshmem
    #: info`` prints them under the domain with their current values (the plugin reads and
    #: checks them itself)
    variables: tuple[tuple[str, str, str], ...] = ()


@dataclass
class DomainContext:
    """Handed to a domain's factory: who this PE is and the job's collective helpers."""

    my_pe: int
    n_pes: int
    local_rank: int
    """This PE's index among the PEs of its node (picks a device)."""
    node_id: str
    seg_id: int
    config: Config
    allgather: Callable[[bytes], list[bytes]]
    """Collective: every PE's blob, in PE order."""
    barrier: Callable[[], None]
    """Collective: returns when every PE called it."""
    amo_function: int = 0
    """Address of the core's native ``vk_amo`` (C type ``vk_amo_fn`` in ``_native.h``): a
    domain of CPU-addressable memory applies AMOs with it, so they are atomic with the shm
    path's and the transports' AMOs on the same word."""
    host_heap: SegmentInfo | None = None
    """The core's host heap (segment 0), for domains that map host memory into their device
    so that copies between the two need no staging."""
    runtime: Any = None
    """The running :class:`~vkshmem.core.runtime.Runtime`, for domains that serve
    device-initiated communication (they need the host heap and the transports); its
    ``domains.heap_of`` (:meth:`~vkshmem.core.domains.registry.MemoryDomains.heap_of`) gives
    the domain's routes to peers."""


@dataclass(frozen=True)
class DomainExport:
    """What a PE offers same-node peers: ``fds`` (passed over Unix sockets to peers on this
    node whose ``group`` is equal and not None, e.g. the same device UUID) and ``meta``
    (all-gathered to every PE)."""

    fds: list[int]
    meta: bytes = b""
    group: str | None = None
    link_group: str | None = None
    """Peers on this node with an equal (not None) ``link_group`` and another ``group`` get
    the fds for :meth:`MemoryDomain.link_peer`."""


class DomainLink(ABC):
    """Puts and gets to a same-node peer's segment that this PE cannot import as memory
    (made by :meth:`MemoryDomain.link_peer`). Every call is complete when it returns; raise
    the domain's ``error_type`` on failure."""

    @abstractmethod
    def put(self, offset: int, src: memoryview) -> None:
        """Host bytes into the peer's segment at ``offset``."""

    @abstractmethod
    def get(self, offset: int, dst: memoryview) -> None:
        """The peer's segment at ``offset`` into host bytes."""

    @abstractmethod
    def put_device(self, offset: int, src_off: int, nbytes: int) -> None:
        """This PE's segment at ``src_off`` into the peer's at ``offset``."""

    @abstractmethod
    def get_device(self, offset: int, dst_off: int, nbytes: int) -> None:
        """The peer's segment at ``offset`` into this PE's at ``dst_off``."""

    #: whether :meth:`amo` carries AMOs to the peer (route ``link``); False: the domain
    #: proxy does (route ``link+proxy``). Fixed when the link is made.
    amos: bool = False

    def amo(self, offset: int, op: AmoOp, width: int, operand: int, compare: int) -> int:
        """An AMO on the peer's aligned ``width``-byte word at ``offset`` (checked by the
        core), atomic with the peer's own AMOs on it: the old value. Only where :attr:`amos`."""
        raise NotImplementedError(f"{type(self).__name__} carries no AMOs")

    def fold_put(self, dst_off: int, src_off: int, count: int, op: str, dtype: Any) -> bool:
        """``dst op= src`` over ``count`` elements of numpy ``dtype`` in this PE's segment
        (byte offsets, checked by the caller), the result also written into the peer's
        segment at ``dst_off``, complete on return: a ring all-reduce's last fold and the
        push that follows it, in one pass. False (nothing done) where the link cannot."""
        return False

    def pairs(self, pes: tuple[int, int], op: str, dtype: Any) -> bool:
        """Whether the all-reduce of the two members ``pes`` (this PE and the peer, in the
        team's order) with ``op`` on numpy ``dtype`` takes :meth:`pair_reduce`. The peer's
        link must answer the same for the same call (the decision may depend only on what
        both sides see alike)."""
        return False

    def pair_reduce(self, index: int, pes: tuple[int, int], shares: Sequence[tuple[int, int]],
                    dst_off: int, src_off: int, op: str, dtype: Any) -> None:
        """Collective over the pair, between two barriers (only where :meth:`pairs`): the
        all-reduce of ``op`` over both members' sources at byte offset ``src_off`` into both
        targets at ``dst_off``; ``index`` is this PE's place in ``pes`` and ``shares`` the
        (first element, count) each place owns (what it folds)."""
        raise NotImplementedError(f"{type(self).__name__} has no pair all-reduce")

    def close(self) -> None:  # noqa: B027 - optional
        """Release what the link holds (at close, before the domain's own close)."""


class MemoryDomain(ABC):
    """An open memory domain on one PE. See the module docstring for the contract."""

    spec: DomainSpec
    seg_id: int
    size: int
    """Bytes of this PE's segment (equal on every PE)."""
    local: Any
    """The memory handle of this PE's own segment."""
    closed: bool = False
    error_type: type[VkshmemError] = VkshmemError
    """What failures of this domain's operations raise (the core's proxy raises it too)."""

    # -- the segment ------------------------------------------------------------------------

    @abstractmethod
    def export(self) -> DomainExport:
        """Fds and metadata for same-node peers (fds stay owned by the domain)."""

    @abstractmethod
    def import_peer(self, pe: int, fds: list[int], meta: bytes) -> Any:
        """Map ``pe``'s segment from its fds (owned by the callee from now on) and metadata;
        return a memory handle, or raise to have the core reach ``pe`` another way."""

    def release_peer(self, handle: Any) -> None:  # noqa: B027 - optional
        """Release an imported segment (at close)."""

    def link_peer(self, pe: int, fds: list[int], meta: bytes,
                  group: str | None) -> DomainLink | None:
        """A :class:`DomainLink` to ``pe``'s segment (its fds are owned by the callee from now
        on, its ``meta`` and ``group`` as exported), or None (or raise) to reach ``pe``
        another way. Called only where :attr:`DomainExport.link_group` matched."""
        for fd in fds:
            os.close(fd)
        return None

    @abstractmethod
    def describe(self) -> SegmentInfo:
        """This PE's segment as transports register it (``kind`` says what memory it is)."""

    # -- local operations on a memory handle ------------------------------------------------

    @abstractmethod
    def check_range(self, offset: int, nbytes: int, what: str) -> None:
        """Raise InvalidArgumentError unless ``[offset, offset + nbytes)`` is in the segment."""

    @abstractmethod
    def write(self, mem: Any, offset: int, src: memoryview) -> None:
        """Copy host bytes into ``mem``; complete on return."""

    @abstractmethod
    def read(self, mem: Any, offset: int, dst: memoryview) -> None:
        """Copy bytes of ``mem`` into host buffer ``dst``."""

    @abstractmethod
    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        """Copy within the domain (between this PE's and imported segments)."""

    @abstractmethod
    def amo(self, mem: Any, offset: int, op: AmoOp, width: int, operand: int,
            compare: int) -> int:
        """Apply ``op`` to the aligned ``width``-byte word atomically with respect to every
        other vkshmem AMO on it (device atomics included); return the old value."""

    # Non-blocking forms (optional): started here, completed by quiet(). The defaults are the
    # blocking operations, complete on return.

    def write_nbi(self, mem: Any, offset: int, src: memoryview) -> None:
        """Start :meth:`write`; ``src`` must not change before :meth:`quiet`."""
        self.write(mem, offset, src)

    def read_nbi(self, mem: Any, offset: int, dst: memoryview) -> None:
        """Start :meth:`read`; ``dst`` is filled by :meth:`quiet`."""
        self.read(mem, offset, dst)

    def copy_nbi(self, dst: Any, dst_offset: int, src: Any, src_offset: int,
                 nbytes: int) -> None:
        """Start :meth:`copy`; the source must not change before :meth:`quiet`."""
        self.copy(dst, dst_offset, src, src_offset, nbytes)

    def quiet(self) -> None:  # noqa: B027 - optional
        """Complete every operation the ``*_nbi`` methods started (called by the runtime's
        ``quiet``, ``fence`` and ``barrier_all``)."""

    def flush(self) -> None:  # noqa: B027 - optional
        """Start the device on what the ``*_nbi`` methods queued, without waiting (a domain
        that holds them back until :meth:`quiet`, e.g. in one command buffer, submits them
        now). The domain proxy calls it to overlap a device copy with a transfer over a
        transport. Default: nothing (the ``*_nbi`` operations already run)."""

    def register_host(self, address: int, size: int) -> bool:
        """Make ``size`` bytes of host memory at ``address`` (page-aligned; mapped in this
        process until :meth:`close`) a range the ``*_nbi`` copies move by DMA, as the host
        heap is. The domain proxy offers it a same-node peer's mailbox, so pieces go between
        the device and the peer's host memory with no CPU copy. Return whether it did;
        default: False (copies of the range then take the domain's ordinary path)."""
        return False

    def native_ops(self, address: int) -> bool:
        """Optional: fill the ``struct vk_domain_ops`` at ``address``
        (``vkshmem/core/_native.h``) with C functions that copy between this PE's segment
        and registered host memory and apply AMOs to it, kept valid until :meth:`close`; the
        domain proxy's serving thread then serves same-node peers' requests in C (GIL
        released) instead of through :meth:`write_nbi`/:meth:`read_nbi`/:meth:`amo`, which
        they must equal. Return whether it did (default: False)."""
        return False

    def stream_ops(self, stream: Any) -> StreamOps | None:
        """Optional (API 1.2): the :class:`~vkshmem.core.domains.stream.StreamOps` that enqueue
        operations on the user's ``stream`` (an object the domain recognises, e.g. a CUDA
        stream), or None (the default: the core synchronizes the stream and makes the
        blocking call). Called per call: keep it cheap (cache per stream)."""
        return None

    def zero(self, offset: int, nbytes: int) -> None:
        """Zero ``nbytes`` of this PE's segment (default: writes of zeros)."""
        chunk = 1 << 20
        zeros = bytes(min(nbytes, chunk))
        for lo in range(0, nbytes, chunk):
            self.write(self.local, offset + lo, memoryview(zeros)[:min(chunk, nbytes - lo)])

    def watch_address(self, offset: int) -> int:
        """A host address of this PE's segment at ``offset`` the CPU may spin on (coherent with
        remote writes), or 0 (the core then polls with :meth:`read`)."""
        return 0

    def host_view(self, mem: Any) -> memoryview | None:
        """A CPU view of memory handle ``mem`` (this PE's or an imported segment), or None
        where the CPU cannot address it (``shmem.ptr`` then returns None)."""
        return None

    def device_view(self, mem: Any, offset: int, shape: tuple[int, ...],
                    dtype: np.dtype) -> Any:
        """Where the CPU has no view: an object device libraries can use for ``shape`` x
        ``dtype`` at ``offset`` of memory handle ``mem`` (e.g. one with
        ``__cuda_array_interface__``), or None (the default). ``shmem.ptr`` returns it."""
        return None

    def dlpack_range(self) -> tuple[int, int, int, int] | None:
        """Where this PE's segment appears to DLPack consumers: (DLPack device type, device
        id, base address, size), or None (the default: the domain exports no DLPack tensors).
        ``shmem.from_dlpack`` uses it to find arrays in the heap."""
        return None

    def no_view_reason(self) -> str:
        """Why :meth:`host_view` of this PE's segment is None (for error messages)."""
        return "the domain does not map its memory for the CPU"

    def reduce(self, dst_offset: int, src_offset: int, count: int, op: str,
               dtype: np.dtype) -> bool:
        """``dst[i] = dst[i] op src[i]`` for ``count`` elements of this PE's segment on the
        device; return False when the device cannot (the core then reduces on the host)."""
        return False

    def can_reduce_from(self, op: str, dtype: np.dtype) -> bool:
        """Whether :meth:`reduce_from` does ``op`` on ``dtype`` (the answer must depend on
        nothing else: every PE of a collective decides alike). Default: no."""
        return False

    def reduce_from(self, dst_offset: int, sources: list[tuple[Any, int]], count: int, op: str,
                    dtype: np.dtype) -> None:
        """``dst[i] = op over sources[j][i]`` for ``count`` elements into this PE's segment,
        on the device, where each source is (memory handle this PE maps: its own ``local`` or
        a peer's imported one, offset), folded in the order given; called only where
        :meth:`can_reduce_from`. Otherwise the core gathers through its scratch and uses
        :meth:`reduce`. Collective: every member of the team calls it with its sources in the
        same order, between the same two barriers, and ``dst_offset`` is symmetric; so a domain
        may instead compute a share of the elements and write it into every member's target
        (``dst_offset`` in each source's memory handle)."""
        raise NotImplementedError

    # -- arrays -------------------------------------------------------------------------------

    @abstractmethod
    def make_array(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """The array users get for an allocation at ``offset`` (a :class:`DomainArray`, or a
        numpy array for memory the CPU addresses)."""

    # -- errors and teardown -------------------------------------------------------------------

    def check_errors(self) -> None:  # noqa: B027 - optional
        """Raise errors the device reported asynchronously (called after barriers)."""

    def stop_threads(self) -> BaseException | None:
        """Stop background work of the domain (before transports close); return a recorded
        failure, if any."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the segment and the device; safe to call twice."""

