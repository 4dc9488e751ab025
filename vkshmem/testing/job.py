"""Hand-made jobs of one process: the transports of a few PEs, opened as the core would.

A :class:`Job` opens one transport per PE and rail through a factory (a
:class:`~vkshmem.core.transports.contract.TransportSpec`'s, usually), registers memfd-backed
:class:`~vkshmem.testing.segments.Segment` objects with each, and connects them through
:class:`~vkshmem.core.transports.contract.PeerInfo` exchanged as the core's bootstrap would. The
checks of
:mod:`vkshmem.testing.transport` and :mod:`vkshmem.testing.amo` drive it; so may a plugin's own
tests (subclass :class:`Job` with ``transport``, ``default_options`` and ``seg_sizes``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import pytest

from vkshmem.core._native import lib as native
from vkshmem.core.config import Config
from vkshmem.core.config import load as load_config
from vkshmem.core.plugins.loader import load_plugins
from vkshmem.core.transports import contract as core_transport
from vkshmem.core.transports.contract import AmoOp, PeerInfo, Transport, TransportContext

from .segments import Segment

if TYPE_CHECKING:
    from vkshmem.core.plugins.loader import Registry
    from vkshmem.core.transports.contract import TransportSpec

__all__ = [
    "ALL_OPS",
    "NON_FETCHING_OPS",
    "SECRET",
    "WIDTHS",
    "Job",
    "amo_model",
    "context",
    "fd_count",
    "registered_host_transport",
    "run_threads",
    "set_word",
    "thread_count",
    "word",
]

T = TypeVar("T", bound=Transport)
J = TypeVar("J", bound="Job")

WIDTHS = pytest.mark.parametrize("width", [4, 8])
ALL_OPS = pytest.mark.parametrize("op", list(AmoOp))
NON_FETCHING_OPS = pytest.mark.parametrize("op", [op for op in AmoOp if not op.fetching_only])


# -- the job ---------------------------------------------------------------------------------


#: The job secret of the hand-made jobs of the unit tests.
SECRET = b"transport-unit-test-job-secret"


def context(pe: int, n: int, rail: int = 0, options: dict[str, str] | None = None,
            secret: bytes = SECRET, shm: bool | None = None) -> TransportContext:
    """The context the core would give PE ``pe`` of ``n`` on one node, for rail ``rail``;
    ``shm`` (whether the core's shm path is on) as ``VKSHMEM_SHM`` says where None."""
    return TransportContext(
        my_pe=pe, n_pes=n, rail=rail, options=dict(options or {}), node_id="node0",
        host_address="127.0.0.1", amo_function=native.vk_amo_address(), secret=secret,
        shm=load_config().shm if shm is None else shm,
    )


class Job(Generic[T]):
    """``n`` PEs of one node, each with one transport per rail (``t[rail][pe]``), each PE with
    memfd-backed segments of ``sizes`` (segment id to bytes) registered with all of them."""

    transport: ClassVar[Callable[[TransportContext], Any]]
    default_options: ClassVar[dict[str, str]] = {}
    seg_sizes: ClassVar[dict[int, int]]
    #: the contexts' ``shm`` (None: as ``VKSHMEM_SHM`` says when the job is made)
    shm: ClassVar[bool | None] = None

    def __init__(self, n: int = 2, rails: int = 1, options: dict[str, str] | None = None,
                 sizes: dict[int, int] | None = None) -> None:
        self.sizes = self.seg_sizes if sizes is None else sizes
        self.segs = [{s: Segment(s, size) for s, size in self.sizes.items()} for _ in range(n)]
        self.t: list[list[T]] = []  # [rail][pe]
        opts = self.default_options if options is None else options
        try:
            for rail in range(rails):
                row: list[T] = []
                self.t.append(row)
                for pe in range(n):
                    row.append(self.transport(context(pe, n, rail, opts, shm=self.shm)))
                peers = {}
                for pe, tr in enumerate(row):
                    keys = {s: tr.register(seg.info()) for s, seg in self.segs[pe].items()}
                    peers[pe] = PeerInfo(pe, "node0", True, tr.address(), keys)
                for tr in row:
                    tr.connect(peers)
        except BaseException:
            self.close()
            raise

    def __enter__(self: J) -> J:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def of(cls, factory: Callable[[TransportContext], Transport],
           options: dict[str, str] | None = None,
           seg_sizes: dict[int, int] | None = None) -> type[Job[Any]]:
        """A job class opening its transports with ``factory`` (a spec's, usually), with rail
        ``options`` and segments of ``seg_sizes`` (default: 1 MiB as 0 and 64 KiB as 1)."""
        return type(f"{cls.__name__}Of", (cls,), {
            "transport": staticmethod(factory),
            "default_options": dict(options or {}),
            "seg_sizes": dict(seg_sizes or {0: 1 << 20, 1: 64 * 1024}),
        })

    def mem(self, pe: int, seg: int = 0) -> memoryview:
        """The bytes of segment ``seg`` of PE ``pe``, as the owner sees them."""
        return self.segs[pe][seg].view

    def close(self) -> None:
        """Close every transport, then every segment (which fails with BufferError where a
        transport still holds a view of it)."""
        for row in self.t:
            for tr in row:
                tr.close()
        for segs in self.segs:
            for seg in segs.values():
                seg.close()


# -- helpers ---------------------------------------------------------------------------------


def amo_model(op: AmoOp, width: int, old: int, operand: int, compare: int) -> int:
    """The word an AMO leaves behind (``old`` being the word before it)."""
    mask = (1 << (8 * width)) - 1
    operand &= mask
    if op is AmoOp.FETCH:
        return old
    if op in (AmoOp.SET, AmoOp.SWAP):
        return operand
    if op is AmoOp.CSWAP:
        return operand if old == compare & mask else old
    if op is AmoOp.ADD:
        return (old + operand) & mask
    if op is AmoOp.AND:
        return old & operand
    if op is AmoOp.OR:
        return old | operand
    return old ^ operand


def word(m: memoryview, offset: int, width: int) -> int:
    """The little-endian unsigned word of ``width`` bytes at ``offset`` of ``m``."""
    return int.from_bytes(m[offset:offset + width], "little")


def set_word(m: memoryview, offset: int, width: int, value: int) -> None:
    """Store ``value`` as the little-endian word of ``width`` bytes at ``offset`` of ``m``."""
    m[offset:offset + width] = value.to_bytes(width, "little")


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def thread_count() -> int:
    """Threads of this process (native ones included)."""
    return len(os.listdir("/proc/self/task"))


def run_threads(threads: list[threading.Thread]) -> None:
    """Start them all, then wait for them all."""
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def registered_host_transport(name: str, dist: str) -> tuple[Registry, TransportSpec]:
    """The registry and the spec of transport ``name``, which distribution ``dist`` registers
    through its entry point: it reaches PEs on this node and others, on host memory (puts, gets
    and AMOs; other kinds the transport's own tests check), with every AMO of 4 and 8 bytes and
    a fence of its own."""
    reg = load_plugins(Config({}))
    spec = reg.transports[name]
    assert reg.origin[name] == dist
    assert spec.reach == {"intra", "inter"}
    assert "host" in spec.memory_kinds and spec.ops_on("host") == core_transport.ALL_OPS
    assert spec.amo_ops == set(AmoOp)
    assert spec.amo_widths == {4, 8}
    assert spec.native_fence
    return reg, spec


