"""The transport contract: what a plugin declares (:class:`TransportSpec`) and implements.

A transport moves bytes between symmetric segments of PEs. Its life:

1. The core calls the spec's ``factory(context)`` to open it for one rail.
2. ``register(segment)`` for each local symmetric segment returns a *remote key* blob.
3. ``address()`` returns this PE's endpoint blob; the core all-gathers addresses and keys.
4. ``connect(peers)`` receives every peer's :class:`PeerInfo`; ``reaches(peer)`` says which
   peers it can carry traffic to (the core routes each peer to one transport per rail).
5. Data path: ``put``/``get`` (blocking: the source buffer is reusable, or the destination
   filled, on return), ``put_nbi``/``get_nbi`` (complete at ``quiet``), ``amo`` (every op of
   :class:`AmoOp` on 4- and 8-byte words, operands passed as unsigned bit patterns),
   ``fence`` (order operations to each PE), ``quiet`` (remote completion of everything issued).
6. ``close()`` releases everything; it must not block for long.

Lifetimes: the core closes every transport before it unmaps the segments, so a progress thread
may touch segment memory until ``close()`` returns; a transport must not keep exports of
``SegmentInfo.buffer`` (memoryview slices) past ``close()``. ``fence`` orders operations within
one transport; the core turns it into ``quiet`` where an operation could take another rail.
Native code applies AMOs through ``TransportContext.amo_function`` (C type ``vk_amo_fn`` in
``_native.h``, found with :func:`vkshmem.core.get_include`); op codes are :class:`AmoOp`.
The core never asks a non-fetching op (SET, ADD, AND, OR, XOR with ``fetch=False``) for a
result, nor SET to fetch (it asks SWAP).

Addresses are ``(segment id, byte offset)``; transports never see numpy arrays, only
``memoryview`` objects of contiguous bytes (writable for gets).

Memory kinds and operations: a transport registers a segment only where ``memory_kinds`` holds
its kind (or ``"dmabuf"`` and the segment has a dma-buf fd). Which operations it then carries
on that memory is ``carries(kind)`` (default: the spec's ``kind_ops``, where a kind it does not
list gets every operation): ``"rma"`` (put/get) and ``"amo"``. The core sends what a transport
does not carry on a memory domain's segment through that domain's proxy (e.g. UCX puts and gets
CUDA device memory, whose atomics it could only apply with CPU instructions: AMOs go to the
owning PE, which applies them with the domain's own atomics).

Optional collective offload: ``collective(name, team_pes)`` may return an implementation of a
collective (see :class:`CollectiveArgs` for the names and what the call receives) for a team
whose members all route through this transport object; the default returns None and the core
runs its own algorithms over put/AMO.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..errors import TransportError
from ..plugins.apiversion import API_VERSION

__all__ = [
    "ALL_AMO_OPS",
    "ALL_OPS",
    "AMO",
    "API_VERSION",
    "RMA",
    "AmoOp",
    "CollectiveArgs",
    "PeerInfo",
    "SegmentInfo",
    "Transport",
    "TransportContext",
    "TransportSpec",
]



class AmoOp(enum.IntEnum):
    """Atomic memory operations; codes are shared with the native helpers (``_native.h``)."""

    FETCH = 0
    SET = 1
    SWAP = 2
    CSWAP = 3
    ADD = 4
    AND = 5
    OR = 6
    XOR = 7

    @property
    def fetching_only(self) -> bool:
        """Ops that only make sense with a result (fetch, swap, compare-swap)."""
        return self in (AmoOp.FETCH, AmoOp.SWAP, AmoOp.CSWAP)


ALL_AMO_OPS = frozenset(AmoOp)

#: the operation classes a transport may carry on a memory kind (``TransportSpec.kind_ops``,
#: ``Transport.carries``): put/get (blocking and non-blocking), and atomics
RMA = "rma"
AMO = "amo"
ALL_OPS = frozenset({RMA, AMO})


@dataclass(frozen=True)
class SegmentInfo:
    """A local symmetric segment as a transport sees it when registering it.

    ``kind`` is the memory kind: ``"host"`` (CPU-addressable memory at ``address``, a
    memfd-backed mapping where ``fd`` is open), ``"cuda_va"`` (CUDA device memory at device
    virtual address ``address``, not CPU-addressable: the ``cuda`` domain's VMM heap), later
    ``"opaque_fd"``/``"dmabuf"`` for other GPU memory. ``dmabuf_fd`` is a
    dma-buf fd of the same memory where its domain exports one (else -1), owned by the
    segment: a transport whose ``memory_kinds`` holds ``"dmabuf"`` may register any segment
    with one (an RDMA NIC through ``ibv_reg_dmabuf_mr``), whatever its ``kind``.
    """

    seg_id: int
    kind: str
    address: int
    size: int
    fd: int
    buffer: memoryview = field(repr=False)
    dmabuf_fd: int = -1


@dataclass(frozen=True)
class PeerInfo:
    """What the core knows about another PE when connecting a transport to it."""

    pe: int
    node_id: str
    same_node: bool
    address: bytes | None
    rkeys: Mapping[int, bytes]


@dataclass
class TransportContext:
    """Handed to a transport's factory: who we are and how this rail is configured."""

    my_pe: int
    n_pes: int
    rail: int
    options: Mapping[str, str]
    node_id: str
    host_address: str
    """An address of this host that peers can reach (from the bootstrap's connection)."""
    amo_function: int
    """Address of the core's native ``vk_amo`` function (see ``_native.h``), so native
    transport code can apply AMOs with the same hardware atomics as every other path."""
    secret: bytes = b""
    """The job's secret (:mod:`vkshmem.core.auth`): a transport that listens admits only
    connections that prove they know it (``b""``: the job has none)."""
    liveness_words: int = 0
    """Address of the job's liveness words (``uint64_t``; :mod:`vkshmem.core.liveness.channel`):
    ``[0]`` is non-zero once a PE of the job failed, ``[1 + pe]`` once ``pe`` did; 0 when
    failure detection is off. A transport's blocking waits may read it when they wake and give
    up (raising its TransportError, which the core turns into PeerFailedError) instead of
    waiting for a dead peer until their own timeout."""
    shm: bool = True
    """Whether the core's shared-memory path is on (``VKSHMEM_SHM``): PEs of one node then
    reach each other's host heaps through it, so a transport need not connect them (and may,
    where it is off, allocate the heap in its own registered memory)."""


@dataclass(frozen=True)
class TransportSpec:
    """What a plugin declares about one transport.

    ``memory_kinds`` lists what it can register (``host``, ``cuda_va``, ``opaque_fd``,
    ``dmabuf``); ``kind_ops`` maps a kind to the operation classes (:data:`RMA`, :data:`AMO`)
    it carries on memory of that kind, where that is not all of them (a kind it does not name
    gets :data:`ALL_OPS`; the core routes the rest through the domain's proxy, see
    :meth:`Transport.carries`);
    ``reach`` is ``{"intra"}``, ``{"inter"}`` or both; ``amo_ops``/``amo_widths`` what it does
    natively (the core never asks for more); ``native_fence`` is False when fence = quiet.
    ``available()``, where set, is a cheap local probe (no library loaded, nothing opened):
    does this machine have what the transport needs at all (e.g. an RDMA device)? The
    automatic choice (neither ``VKSHMEM_TRANSPORTS`` nor ``VKSHMEM_RAIL<n>`` set) passes
    silently over a transport whose probe says False; a transport named by those variables is
    opened regardless, so that its factory's error says what is missing.
    """

    name: str
    factory: Callable[[TransportContext], Transport]
    priority: int = 0
    #: the plugin API version the spec was built for (:mod:`vkshmem.core.plugins.apiversion`)
    api_version: str | int = API_VERSION
    memory_kinds: frozenset[str] = frozenset({"host"})
    kind_ops: Mapping[str, frozenset[str]] = field(default_factory=dict, hash=False)
    reach: frozenset[str] = frozenset({"intra", "inter"})
    amo_ops: frozenset[AmoOp] = ALL_AMO_OPS
    amo_widths: frozenset[int] = frozenset({4, 8})
    native_fence: bool = True
    put_signal: bool = False
    available: Callable[[], bool] | None = None
    description: str = ""
    #: the plugin's own environment variables, ``(name, default, meaning)`` each, listed by
    #: ``vkshmem info`` with their current values (as ``DomainSpec.variables``)
    variables: tuple[tuple[str, str, str], ...] = ()

    def ops_on(self, kind: str, dmabuf: bool = False) -> frozenset[str]:
        """The operation classes this transport carries on a segment of memory ``kind`` (one
        with a dma-buf fd where ``dmabuf``) by its declaration: empty where it cannot register
        it, else ``kind_ops`` of the kind it registers it as (default :data:`ALL_OPS`)."""
        if kind in self.memory_kinds:
            return frozenset(self.kind_ops.get(kind, ALL_OPS))
        if dmabuf and "dmabuf" in self.memory_kinds:
            return frozenset(self.kind_ops.get("dmabuf", ALL_OPS))
        return frozenset()


@dataclass(frozen=True)
class CollectiveArgs:
    """One validated collective call, as an offloaded implementation receives it.

    ``name`` is one of ``broadcast``, ``collect``, ``fcollect``, ``alltoall``, ``alltoalls``,
    ``reduce``, ``sum_inscan``, ``sum_exscan``; ``team_pes`` the world PE numbers of the team
    in team order, ``me`` this PE's index in it. ``target`` is the symmetric destination as
    ``(segment id, byte offset)`` (same offset on every member) of ``target_nbytes`` bytes;
    ``source`` this PE's contiguous input bytes. ``dtype`` is the numpy dtype string (e.g.
    ``'<f8'``), ``nelems`` the element count (per PE block for collect/fcollect/alltoall(s);
    collect's may differ per PE). ``root`` (broadcast, team-relative), ``op`` (reduce: ``and``,
    ``or``, ``xor``, ``max``, ``min``, ``sum``, ``prod``), ``tst``/``sst`` (alltoalls strides,
    in elements) are set where they apply. Every member calls the implementation in the same
    order; it returns when this PE's part is done with the OpenSHMEM semantics of ``name``.
    """

    name: str
    team_pes: tuple[int, ...]
    me: int
    target: tuple[int, int]
    target_nbytes: int
    source: memoryview
    dtype: str
    nelems: int
    root: int | None = None
    op: str | None = None
    tst: int = 1
    sst: int = 1


class Transport(ABC):
    """An open transport on one rail of one PE. See the module docstring for the contract."""

    spec: TransportSpec

    @abstractmethod
    def register(self, segment: SegmentInfo) -> bytes:
        """Make ``segment`` reachable by peers; return its remote key blob."""

    @abstractmethod
    def address(self) -> bytes:
        """This PE's endpoint blob for this transport."""

    @abstractmethod
    def connect(self, peers: Mapping[int, PeerInfo]) -> None:
        """Learn every peer's address and keys (peers that did not open it have ``None``)."""

    def reaches(self, peer: PeerInfo) -> bool:
        """Whether this transport can carry traffic to ``peer`` (default: it published one)."""
        return peer.address is not None

    @abstractmethod
    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Copy ``src`` to ``(seg, offset)`` of ``pe``; ``src`` is reusable on return."""

    def put_nbi(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Start a put; ``src`` must stay unchanged until ``quiet``. Default: blocking put."""
        self.put(pe, seg, offset, src)

    @abstractmethod
    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Fill ``dst`` from ``(seg, offset)`` of ``pe``; complete on return."""

    def get_nbi(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Start a get; ``dst`` is filled by ``quiet``. Default: blocking get."""
        self.get(pe, seg, offset, dst)

    @abstractmethod
    def amo(
        self, pe: int, seg: int, offset: int, op: AmoOp, width: int,
        operand: int, compare: int, fetch: bool,
    ) -> int:
        """Apply ``op`` atomically to the ``width``-byte word; return the old value if ``fetch``
        (else anything). Operands are unsigned bit patterns; ``compare`` is used by CSWAP."""

    def carries(self, kind: str, dmabuf: bool = False) -> frozenset[str]:
        """The operation classes (:data:`RMA`, :data:`AMO`) this open transport carries on a
        segment of memory ``kind`` (``dmabuf``: the segment has a dma-buf fd); empty where it
        does not register such memory. Default: the spec's declaration
        (:meth:`TransportSpec.ops_on`); a transport may narrow it by its options. Asked by the
        core before it registers a memory domain's segment: without :data:`RMA` the
        transport does not register it; without :data:`AMO` it carries the peers' puts and
        gets while their AMOs go through the domain's proxy (so the transport never sees an
        AMO on such memory)."""
        return self.spec.ops_on(kind, dmabuf)

    def create_context(self) -> Transport:
        """An endpoint for a new communication context, with its own ordering and completion:
        ``quiet`` on it waits only for its own operations. ``close()`` on it releases only the
        endpoint. Default: ``self`` (correct, only less isolated: a context's quiet then also
        completes the default context's operations)."""
        return self

    @abstractmethod
    def fence(self) -> None:
        """Order every operation issued so far before later ones, per target PE."""

    @abstractmethod
    def quiet(self) -> None:
        """Return when every operation issued so far is complete at its target."""

    def collective(self, name: str,
                   team_pes: tuple[int, ...]) -> Callable[[CollectiveArgs], None] | None:
        """An offloaded implementation of collective ``name`` (a :class:`CollectiveArgs` name)
        for the team of world PEs ``team_pes``, or None (the default) to let the core run its
        own algorithm. The core asks only when every member of the team routes through this
        same transport object, asks once per team and name, and uses a non-None answer for
        every call of that collective on that team (so the answer must be the same on every
        member). The implementation must not return before this PE's target is complete and
        its source reusable."""
        return None

    def native_ops(self) -> int:
        """Optional: the address of a ``struct vk_native_ops`` (``vkshmem/core/_native.h``)
        whose C functions do this endpoint's blocking put/get and AMOs, and optionally its
        quiet and fence (kept valid until ``close``), or 0 (the default). The core's compiled
        hot path then calls them directly for plain numpy arrays of the host heap, instead of
        :meth:`put`/:meth:`get`/:meth:`amo` (which must stay equivalent, and still serve every
        other call), and, when every open transport offers quiet and fence there, for the
        default context's ``quiet``/``fence`` instead of :meth:`quiet`/:meth:`fence`. The
        compiled barrier also sends its non-fetching ADDs on the internal segment through
        ``amo`` (so that segment must be registered, as for :meth:`amo`)."""
        return 0

    def native_error(self, status: int, doing: str, pe: int, seg: int, offset: int,
                     nbytes: int, buffer: object) -> BaseException:
        """The exception for a nonzero ``status`` of a :meth:`native_ops` function (``doing``:
        ``'put to'``, ``'get from'``, ``'AMO on'``, or ``'quiet'``/``'fence'`` with ``pe``
        -1 and ``buffer`` None), as the Python method would raise it; ``buffer`` is the local
        array, to keep alive if the transport may still use it."""
        if pe < 0:
            return TransportError(self.spec.name, f"{doing} failed", status=status)
        return TransportError(self.spec.name, f"{doing} PE {pe} (segment {seg}, offset "
                              f"{offset}, {nbytes} bytes) failed", status=status)

    def progress(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Advance outstanding work (transports with their own progress thread do nothing)."""

    @abstractmethod
    def close(self) -> None:
        """Release every resource; safe to call twice."""
