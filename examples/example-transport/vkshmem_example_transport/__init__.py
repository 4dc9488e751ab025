"""vkshmem-example-transport: a small, complete, out-of-tree vkshmem transport plugin.

The ``example`` transport reaches PEs on the same node only. It maps each peer's memfd-backed
segment into this process by opening ``/proc/<pid>/fd/<fd>`` (the peer's pid and fd travel in
the segment's remote key), then does puts and gets as ``memoryview`` copies and AMOs by calling
the core's native ``vk_amo`` through :mod:`ctypes`. It counts the operations it carries and,
with the rail option ``stats=PATH``, writes them as JSON to ``PATH.<pe>`` when it is closed.

Pure Python, no compiler: see ``README.md`` for the walk-through of how it was written. It
imports :mod:`vkshmem.plugin` only; its tests (``tests/``) run :mod:`vkshmem.testing`.
Select it with ``VKSHMEM_RAIL0=example`` (or ``VKSHMEM_RAIL0=example:stats=/tmp/counts``).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vkshmem.plugin import (
    AmoOp,
    ConfigError,
    InvalidArgumentError,
    PeerInfo,
    SegmentInfo,
    Transport,
    TransportContext,
    TransportError,
    TransportSpec,
    hookimpl,
)

__all__ = ["SPEC", "ExampleTransport", "register_transports"]

NAME = "example"
OPTIONS = ("stats",)

#: Remote key of a segment: owner's pid, the fd of its memfd in the owner, the size.
_RKEY = struct.Struct("<qiQ")
_MASKS = {4: 0xFFFF_FFFF, 8: 0xFFFF_FFFF_FFFF_FFFF}

#: ``uint64_t vk_amo(uintptr_t addr, int op, int width, uint64_t operand, uint64_t compare)``
#: (``vkshmem/plugin.h``, ``vkshmem.plugin.get_include()``); ctypes releases the GIL.
AmoFunction = ctypes.CFUNCTYPE(
    ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
    ctypes.c_uint64,
)


class _Window:
    """One peer segment as seen from here: a byte view and its base address."""

    __slots__ = ("address", "map", "size", "view")

    def __init__(self, view: memoryview, address: int, size: int,
                 owned: mmap.mmap | None) -> None:
        self.view = view
        self.address = address
        self.size = size
        self.map = owned  # None when it is our own segment (the core owns that mapping)

    @classmethod
    def open(cls, pid: int, fd: int, size: int) -> _Window:
        """Map the peer's memfd by opening it through procfs."""
        path = f"/proc/{pid}/fd/{fd}"
        local_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            mapping = mmap.mmap(local_fd, size)
        finally:
            os.close(local_fd)  # the mapping keeps the memory alive
        probe = ctypes.c_char.from_buffer(mapping)
        address = ctypes.addressof(probe)
        del probe  # release the export, or mmap.close() would refuse later
        return cls(memoryview(mapping), address, size, mapping)

    def close(self) -> None:
        self.view.release()  # our own view, also of our own segment: let the core unmap it
        if self.map is not None:
            self.map.close()


class ExampleTransport(Transport):
    """Same-node transport over procfs-mapped memfd segments (see the module docstring)."""

    spec: TransportSpec

    def __init__(self, context: TransportContext) -> None:
        unknown = sorted(set(context.options) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"VKSHMEM_RAIL{context.rail}",
                              f"example: unknown option(s) {', '.join(unknown)} "
                              f"(known: {', '.join(OPTIONS)})")
        self.context = context
        self._stats_path = context.options.get("stats")
        self._vk_amo = AmoFunction(context.amo_function)
        self._local: dict[int, SegmentInfo] = {}
        self._windows: dict[int, dict[int, _Window]] = {}
        self._fence_word = ctypes.c_uint64(0)
        self._lock = threading.Lock()
        self.counts = {"puts": 0, "gets": 0, "amos": 0}
        self._closed = False

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    # -- set-up -----------------------------------------------------------------------------

    def register(self, segment: SegmentInfo) -> bytes:
        """Remember the segment; its key tells peers where to find the memfd."""
        if segment.kind != "host":
            raise TransportError(NAME, f"cannot register memory of kind {segment.kind!r}")
        self._local[segment.seg_id] = segment
        return _RKEY.pack(os.getpid(), segment.fd, segment.size)

    def address(self) -> bytes:
        """Our pid (peers check ``node_id`` to know whether they can use it)."""
        return json.dumps({"pid": os.getpid()}).encode()

    def reaches(self, peer: PeerInfo) -> bool:
        """Only PEs of this node that opened the transport too."""
        return peer.address is not None and peer.node_id == self.context.node_id

    def connect(self, peers: Mapping[int, PeerInfo]) -> None:
        """Map every segment of every reachable peer."""
        for pe, info in peers.items():
            if not self.reaches(info):
                continue
            windows = self._windows.setdefault(pe, {})
            for seg, key in info.rkeys.items():
                if seg in windows:
                    continue
                if pe == self.context.my_pe and seg in self._local:
                    mine = self._local[seg]
                    windows[seg] = _Window(mine.buffer.cast("B"), mine.address, mine.size, None)
                    continue
                pid, fd, size = _RKEY.unpack(key)
                try:
                    windows[seg] = _Window.open(pid, fd, size)
                except OSError as exc:
                    raise TransportError(NAME, f"cannot map segment {seg} of PE {pe} through "
                                         f"/proc/{pid}/fd/{fd}: {exc}",
                                         status=exc.errno) from None

    # -- data path --------------------------------------------------------------------------

    def _window(self, pe: int, seg: int, offset: int, n: int) -> _Window:
        try:
            win = self._windows[pe][seg]
        except KeyError:
            raise TransportError(NAME, f"PE {pe} segment {seg} is not mapped (not on this "
                                 "node, or the transport is closed)") from None
        if offset < 0 or offset + n > win.size:
            raise InvalidArgumentError(f"example: {n} bytes at offset {offset} are outside "
                                       f"segment {seg} of PE {pe} ({win.size} bytes)")
        return win

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        """Copy into the peer's mapping; complete (and source reusable) on return."""
        n = src.nbytes
        win = self._window(pe, seg, offset, n)
        if src.format != "B" or src.ndim != 1:
            src = src.cast("B")
        win.view[offset:offset + n] = src
        self._count("puts")

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        """Copy from the peer's mapping."""
        n = dst.nbytes
        win = self._window(pe, seg, offset, n)
        if dst.format != "B" or dst.ndim != 1:
            dst = dst.cast("B")
        dst[:] = win.view[offset:offset + n]
        self._count("gets")

    def amo(
        self, pe: int, seg: int, offset: int, op: AmoOp, width: int,
        operand: int, compare: int, fetch: bool,
    ) -> int:
        """Apply the AMO with the core's ``vk_amo`` on the mapped word."""
        mask = _MASKS.get(width)
        if mask is None:
            raise InvalidArgumentError(f"example: AMO width {width} (4 or 8 bytes only)")
        win = self._window(pe, seg, offset, width)
        if (win.address + offset) % width:
            raise InvalidArgumentError(f"example: AMO at offset {offset} is not aligned to "
                                       f"its width {width}")
        old = self._vk_amo(win.address + offset, int(op), width, operand & mask,
                           compare & mask)
        self._count("amos")
        return int(old)

    def fence(self) -> None:
        """A full memory barrier (a sequentially consistent atomic RMW on a private word)."""
        self._vk_amo(ctypes.addressof(self._fence_word), int(AmoOp.ADD), 8, 0, 0)

    def quiet(self) -> None:
        """Every copy is complete on return already; only order the stores."""
        self.fence()

    # -- shutdown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap peers' segments and write the counters if ``stats=PATH`` was given."""
        if self._closed:
            return
        self._closed = True
        for windows in self._windows.values():
            for win in windows.values():
                win.close()
        self._windows.clear()
        self._local.clear()
        if self._stats_path:
            path = Path(f"{self._stats_path}.{self.context.my_pe}")
            path.write_text(json.dumps(self.counts))


ExampleTransport.spec = SPEC = TransportSpec(
    name=NAME,
    factory=ExampleTransport,
    priority=1,  # below hostproxy: used only when asked for by name
    memory_kinds=frozenset({"host"}),
    reach=frozenset({"intra"}),
    amo_ops=frozenset(AmoOp),
    amo_widths=frozenset({4, 8}),
    native_fence=True,
    description="example plugin: same-node peers through /proc/<pid>/fd (pure Python)",
)


@hookimpl
def register_transports(register: Callable[[Any], None]) -> None:
    """Offer the ``example`` transport."""
    register(SPEC)
