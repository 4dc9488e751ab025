"""What the core's collectives keep per team (:class:`CollTeam`: routes, flag addresses,
scratch views, phase), their flag numbers, and the helpers both halves share: the data
movement in :mod:`vkshmem.core.collectives.host` and the reductions and scans in
:mod:`vkshmem.core.collectives.reduce` (whose docstrings describe the algorithms and the flag
rules).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .._native import ffi, lib
from ..errors import InvalidArgumentError, TransportError
from ..fast import PHASE
from ..teams import _OFF_FLAGS, ALIGN, INTERNAL_SEG, TeamState
from ..transports.contract import AmoOp, CollectiveArgs, Transport

if TYPE_CHECKING:
    from ..runtime import Runtime


__all__ = ["BCAST_CHUNK", "CollTeam", "coll_team", "find_offload"]

#: Broadcasts above this many bytes are pulled in chunks of it, pipelined down the tree.
BCAST_CHUNK = 256 << 10

# Flags (counter numbers of the team slot) used by the collectives; see the docstring of
# vkshmem.core.collectives.host.
F_BCAST = 0  # + r, r < 32: from the tree parent at distance 2**r
F_BRUCK = 32  # + r: from me + 2**r (fcollect, collect sizes and data)
F_RD = 64  # + r: from the butterfly partner of round r (reduce, scans)
F_FOLD = 96  # from me - 1 (even -> odd of a folded pair)
F_FOLD_BACK = 97  # from me + 1 (odd -> even)
F_RING_RS = 98  # from the left neighbour: reduce-scatter steps
F_RING_AG = 99  # from the left neighbour: allgather steps
F_A2A = 100  # + phase parity: from every member (alltoall, alltoalls)
F_BCAST_DONE = 104  # + k: from the tree child at distance 2**k (large broadcasts)

_FETCH = int(AmoOp.FETCH)
_ADD = int(AmoOp.ADD)
_ALIGN = ALIGN
_SPINS = 20  # native spins of _SPIN_NS on a counter before the runtime's waiter takes over
_SPIN_NS = 50_000
_YIELDS = 2000  # polls, each after a sched_yield, on a crowded node (more PEs than CPUs)
_VIEW_CACHE = 256
_SAME_CHECK = 4096  # below this, copying onto itself is cheaper than checking

_I8 = np.dtype(np.int64)
_MASK48 = (1 << 48) - 1
_vk_amo = lib.vk_amo
_vk_shm_amo = lib.vk_shm_amo
_vk_shm_put = lib.vk_shm_put
_vk_shm_get = lib.vk_shm_get
_vk_spin_change = lib.vk_spin_change
_sched_yield = os.sched_yield
_from_buffer = ffi.from_buffer


def find_offload(routes: Sequence[Transport], name: str,
                 team_pes: tuple[int, ...]) -> Callable[[CollectiveArgs], None] | None:
    """The transport's offloaded implementation of collective ``name`` when every member of
    the team (``routes[i]``: the transport that reaches member ``i``) routes through one and
    the same transport object and it offers one; else None."""
    if not routes:
        return None
    first = routes[0]
    for t in routes:
        if t is not first:
            return None
    return first.collective(name, team_pes)


class CollTeam:
    """What the collectives keep per team: routes, flag addresses, scratch views, phase."""

    def __init__(self, ts: TeamState) -> None:
        rt: Runtime = ts.rt
        self.ts = ts
        self.rt = rt
        self.n = ts.size
        self.me = ts.me
        self.pes = ts.pes
        self.routes = ts.routes
        self.direct = [t is rt.routing.shm for t in ts.routes]
        self.expect = ts._expect  # shared with TeamState.wait: one count per counter
        self.flag_off = ts.base + _OFF_FLAGS  # of flag 0, in INTERNAL_SEG, on every member
        self.flag_addr = rt.internal.address + self.flag_off
        self.flag_ptr = ffi.cast("uint64_t *", self.flag_addr)
        self.snap = ffi.new("uint64_t[1]")
        self.crowded = len(rt.node_pes) > (os.cpu_count() or 1)
        #: the waits of collectives: bounded by VKSHMEM_COLLECTIVE_TIMEOUT too
        self.waiter = ts.waiter
        self.scratch_off = ts.scratch_offset
        self.half = ts.half
        self.scratch = np.frombuffer(rt.internal.buffer, np.uint8, count=2 * self.half,
                                     offset=ts.scratch_offset)
        self.bfly = _butterfly(self.n, self.me)
        # one butterfly phase (regions: fold, fold back, one per round) holds this many bytes;
        # smaller all-reduces take the fast path (one phase, no ring)
        self.rd_bytes = ts.rd_bytes
        self.rd_fast = ts.rd_fast
        #: the team's NativeTeam (None: its members are not all on the shm path)
        self.native = ts.native
        self.bruck: list[tuple[int, int, int, int]] | None = None
        self.trees: dict[int, tuple[int, list[tuple[int, int]]]] = {}
        self._views: dict[tuple[int, np.dtype, int], np.ndarray] = {}
        self._offloads: dict[str, Callable[[CollectiveArgs], None] | None] = {}

    @property
    def phase(self) -> int:
        """Phases begun so far on this team (shared with the native team, if any)."""
        return int(self.expect[PHASE])

    @phase.setter
    def phase(self, value: int) -> None:
        self.expect[PHASE] = value

    # -- offload -------------------------------------------------------------------------------

    def offload(self, name: str) -> Callable[[CollectiveArgs], None] | None:
        """The transport's implementation of ``name`` for this team (cached), or None."""
        try:
            return self._offloads[name]
        except KeyError:
            impl = find_offload(self.routes, name, self.pes)
            self._offloads[name] = impl
            return impl

    # -- primitives ----------------------------------------------------------------------------

    def put(self, m: int, seg: int, off: int, buf: np.ndarray) -> None:
        """Copy local contiguous ``buf`` to ``(seg, off)`` of member ``m`` (never this PE)."""
        if self.direct[m]:
            _vk_shm_put(seg, self.pes[m], off, _from_buffer(buf), buf.nbytes)
        elif buf.nbytes:
            try:
                self.routes[m].put(self.pes[m], seg, off, memoryview(buf).cast("B"))
            except TransportError as exc:  # PeerFailedError when a failed PE caused it
                raise self.waiter.translate(exc, self.pes[m])  # noqa: B904 (keeps the cause)

    def signal(self, m: int, flag: int) -> None:
        """+1 on counter ``flag`` of member ``m``, ordered after earlier puts to it."""
        if self.direct[m]:
            # a sequentially consistent RMW: earlier stores to the peer are visible first
            _vk_shm_amo(INTERNAL_SEG, self.pes[m], self.flag_off + 8 * flag, _ADD, 8, 1, 0)
        else:
            self.ts.signal(m, flag)

    def get(self, m: int, seg: int, off: int, buf: np.ndarray) -> None:
        """Fill local contiguous ``buf`` from ``(seg, off)`` of member ``m``."""
        if self.direct[m]:
            _vk_shm_get(seg, self.pes[m], off, _from_buffer(buf, require_writable=True),
                        buf.nbytes)
        elif buf.nbytes:
            try:
                self.routes[m].get(self.pes[m], seg, off, memoryview(buf).cast("B"))
            except TransportError as exc:  # PeerFailedError when a failed PE caused it
                raise self.waiter.translate(exc, self.pes[m])  # noqa: B904 (keeps the cause)

    def put_signal(self, m: int, seg: int, off: int, buf: np.ndarray, flag: int) -> None:
        """``put`` then ``signal`` (one call: this is the hot path of every algorithm)."""
        if self.direct[m]:
            pe = self.pes[m]
            _vk_shm_put(seg, pe, off, _from_buffer(buf), buf.nbytes)
            _vk_shm_amo(INTERNAL_SEG, pe, self.flag_off + 8 * flag, _ADD, 8, 1, 0)
        else:
            if buf.nbytes:
                try:
                    self.routes[m].put(self.pes[m], seg, off, memoryview(buf).cast("B"))
                except TransportError as exc:  # PeerFailedError when a failed PE caused it
                    raise self.waiter.translate(exc, self.pes[m])  # noqa: B904
            self.ts.signal(m, flag)

    def wait(self, flag: int, count: int = 1, what: str = "collective") -> None:
        """Wait for ``count`` more signals on this PE's counter ``flag``. While no transport
        needs progress calls: spin in native code (GIL released, ``pause`` then yield), or,
        when this node runs more PEs than it has CPUs, poll and yield the CPU at once (the
        PE being waited for may need it); then hand over to the runtime's waiter (timeout,
        progress, interrupts)."""
        exp = self.expect
        want = exp[flag] + count
        exp[flag] = want
        addr = self.flag_addr + 8 * flag
        v = _vk_amo(addr, _FETCH, 8, 0, 0)
        if v >= want:
            return
        if not self.waiter.progress:
            if self.crowded:
                for _ in range(_YIELDS):
                    _sched_yield()
                    if _vk_amo(addr, _FETCH, 8, 0, 0) >= want:
                        return
            else:
                ptr = self.flag_ptr + flag
                snap = self.snap
                for _ in range(_SPINS):
                    snap[0] = v
                    _vk_spin_change(ptr, snap, 8, _SPIN_NS)
                    v = _vk_amo(addr, _FETCH, 8, 0, 0)
                    if v >= want:
                        return
        self.waiter.wait(lambda: _vk_amo(addr, _FETCH, 8, 0, 0) >= want, addr, 8,
                         f"{what} ({self.waited_for(flag)}; signal {flag} of team slot "
                         f"{self.ts.slot})")

    def waited_for(self, flag: int) -> str:
        """Who sends the signals on ``flag`` to this member, for errors: "waiting for PE 3"
        (world PE numbers; as fast_team.c's what_signal says it)."""
        n, me = self.n, self.me
        if F_A2A <= flag < F_A2A + 4:
            return f"waiting for every PE of the team {list(self.pes)}"
        if F_BCAST <= flag < F_BRUCK:
            m = me - (1 << (flag - F_BCAST))
        elif F_BRUCK <= flag < F_RD:
            m = me + (1 << (flag - F_BRUCK))
        elif F_RD <= flag < F_FOLD:
            m = next((p for p, f, _ in self.bfly[2] if f == flag), me)
        elif flag == F_FOLD or flag in (F_RING_RS, F_RING_AG):
            m = me - 1
        elif flag == F_FOLD_BACK:
            m = me + 1
        elif F_BCAST_DONE <= flag < F_BCAST_DONE + 32:
            m = me + (1 << (flag - F_BCAST_DONE))
        else:
            return f"team of PEs {list(self.pes)}"
        return f"waiting for PE {self.pes[m % n]}"

    def begin_phase(self) -> int:
        """Start a phase; the offset (within the scratch) of the half it owns."""
        p = self.phase
        self.phase = p + 1
        return (p & 1) * self.half

    def a2a_flag(self) -> int:
        """The many-senders flag of the phase just begun."""
        return F_A2A + ((self.phase - 1) & 1)

    def view(self, rel: int, dtype: np.dtype, count: int) -> np.ndarray:
        """``count`` elements of ``dtype`` at ``rel`` bytes into this PE's scratch."""
        key = (rel, dtype, count)
        v = self._views.get(key)
        if v is None:
            if len(self._views) >= _VIEW_CACHE:
                self._views.clear()
            v = self.scratch[rel:rel + count * dtype.itemsize].view(dtype)
            self._views[key] = v
        return v


_TEAMS: dict[TeamState, CollTeam] = {}


def coll_team(ts: TeamState) -> CollTeam:
    """The collectives' state of team ``ts`` (made on first use)."""
    ct = _TEAMS.get(ts)
    if ct is None:
        for old in [t for t in _TEAMS if t.destroyed or t.rt.closed]:
            del _TEAMS[old]
        ct = _TEAMS[ts] = CollTeam(ts)
    return ct


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """Local copy ``src`` -> ``dst`` (same length); skipped when both are the same memory
    (numpy handles a partial overlap)."""
    if dst.nbytes > _SAME_CHECK and _from_buffer(dst) == _from_buffer(src):
        return
    np.copyto(dst, src)


def _check_in_place(src: np.ndarray, seg: int, off: int, nbytes: int, own: int,
                    what: str) -> None:
    """Refuse a ``src`` that overlaps the ``nbytes`` of this PE's target at ``(seg, off)``
    anywhere but exactly at byte offset ``own`` (this PE's own block, where it may sit in
    place): peers may write the rest of the target before this PE has even entered."""
    if src.base is None:  # owns its memory: not a view of the symmetric heap
        return
    nb = src.nbytes
    r = lib.vk_locate(_from_buffer(src), nb)
    if r < 0 or r >> 48 != seg or not nb:
        return
    soff = r & _MASK48
    if soff != own and soff < off + nbytes and off < soff + nb:
        raise InvalidArgumentError(f"{what}: source overlaps target (only this PE's own block "
                                   "of the target may be its source)")


def _chunks(total: int, chunk: int) -> list[tuple[int, int]]:
    if total <= chunk:
        return [(0, total)]
    return [(lo, min(lo + chunk, total)) for lo in range(0, total, chunk)]

def _butterfly(n: int, me: int) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Member ``me``'s part of the butterfly with fold over ``n`` members: (role, rounds,
    per-round list of (partner member, flag, region index)). Role: 0 plain, 1 folded-in odd
    PE (receives the even neighbour's data and returns the result), 2 folded-out even PE."""
    k = n.bit_length() - 1
    rem = n - (1 << k)
    if me < 2 * rem:
        role, v = (1, me >> 1) if me & 1 else (2, -1)
    else:
        role, v = 0, me - rem
    steps = []
    if role != 2:
        for r in range(k):
            u = v ^ (1 << r)
            steps.append((2 * u + 1 if u < rem else u + rem, F_RD + r, 2 + r))
    return role, k, steps
