"""Teams in the core: member lists, per-team symmetric *slots*, barriers and signal flags.

Every PE reserves, at start-up, an internal symmetric segment of ``VKSHMEM_TEAMS_MAX`` slots of
``VKSHMEM_TEAM_SCRATCH`` bytes each (a sparse memfd: untouched pages cost nothing). A team owns
one slot number on all its members; disjoint teams (the x-teams of a 2-D split, the shared
teams of different nodes) may share a number. A slot holds, at fixed offsets:

* the team's barrier counters (dissemination: one counter per round),
* two agreement words used when the team is split (AND of the members' free-slot masks),
* :data:`N_FLAGS` signal counters for collectives (``signal``/``wait``),
* the allocation-check records (world team only),
* scratch space for collectives (the rest of the slot).

Counters only ever grow; a waiter knows how many signals it expects on each one, so nothing has
to be reset between collectives. All of this is collective over the team's members.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import fast
from ._native import lib
from .errors import InvalidArgumentError, TransportError, VkshmemError
from .transports.contract import AmoOp

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["ALIGN", "INTERNAL_SEG", "N_FLAGS", "RING_MIN_BYTES", "TeamState", "scratch_layout"]

INTERNAL_SEG = 1
BARRIER_ROUNDS = 32
N_FLAGS = 256
_OFF_BARRIER = 0
_OFF_AGREE = 8 * BARRIER_ROUNDS
_OFF_FLAGS = _OFF_AGREE + 64
_OFF_CHECK = _OFF_FLAGS + 8 * N_FLAGS
SLOT_HEADER = 4096
ALL_ONES = (1 << 64) - 1
#: All-reduces of at least this many bytes use the ring (reduce-scatter + allgather).
RING_MIN_BYTES = 64 << 10
ALIGN = 64


def scratch_layout(scratch_bytes: int, n: int) -> tuple[int, int, int]:
    """The collectives' use of a team's scratch (see :mod:`.collectives`): ``(half, rd_bytes,
    rd_fast)``: the bytes of each of its two halves, of one butterfly phase, and the largest
    all-reduce done in one butterfly phase (-1 for a team of one)."""
    half = (scratch_bytes // 2) // ALIGN * ALIGN
    rounds = n.bit_length() - 1
    rd_bytes = (half // (rounds + 2)) // ALIGN * ALIGN
    return half, rd_bytes, min(rd_bytes, RING_MIN_BYTES - 1) if n > 1 else -1


class TeamState:
    """One team as seen by one PE (a member or not)."""

    def __init__(self, rt: Runtime, pes: Sequence[int], slot: int, parent: TeamState | None):
        self.rt = rt
        self.pes = tuple(pes)
        self.size = len(self.pes)
        self.index = {pe: i for i, pe in enumerate(self.pes)}
        self.me = self.index.get(rt.my_pe, -1)
        self.slot = slot
        self.parent = parent
        self.base = slot * rt.slot_bytes  # offset of the slot in the internal segment
        self.scratch_offset = self.base + SLOT_HEADER
        self.scratch_bytes = rt.slot_bytes - SLOT_HEADER
        self.check_offset = self.base + _OFF_CHECK
        self._addr = rt.internal.address + self.base
        self._epoch = 0
        self._splits = 0
        self.destroyed = False
        # transports of the members, in team order (world PE numbers go to the transport)
        self.routes = [rt.routing.route_transport[pe] for pe in self.pes]
        #: the waits of its barrier and collectives: bounded by VKSHMEM_COLLECTIVE_TIMEOUT too
        self.waiter = rt.waiter.for_collectives(rt.config.collective_timeout)
        self.half, self.rd_bytes, self.rd_fast = scratch_layout(self.scratch_bytes, self.size)
        #: the team's barrier and small collectives in C when every member takes the shm path
        self.native = fast.native_team(self, self.half, self.rd_fast)
        #: per flag, the signal count waited for so far; then the collectives' phase (at
        #: fast.PHASE) and the barrier epoch: the native team's, when there is one
        self._expect: Any = [0] * fast.N_COUNTERS if self.native is None \
            else memoryview(self.native).cast("Q")

    # -- synchronisation ---------------------------------------------------------------------

    def sync(self) -> None:
        """Collective over the team: dissemination barrier (does not complete earlier puts)."""
        if self.native is not None:
            if not self.native.valid:
                raise VkshmemError("this team belongs to a runtime that was finalized")
            self.native.sync()
            return
        n = self.size
        if n == 1:
            return
        self._epoch += 1
        epoch = self._epoch
        me = self.me
        dist, k = 1, 0
        waiter = self.waiter
        while dist < n:
            to = (me + dist) % n
            pe = self.pes[to]
            self.routes[to].amo(pe, INTERNAL_SEG, self.base + _OFF_BARRIER + 8 * k, AmoOp.ADD, 8,
                                1, 0, False)
            addr = self._addr + _OFF_BARRIER + 8 * k
            waiter.wait(lambda a=addr: lib.vk_amo(a, AmoOp.FETCH, 8, 0, 0) >= epoch, addr, 8,
                        f"team barrier round {k} (waiting for PE {self.pes[(me - dist) % n]})")
            dist <<= 1
            k += 1

    def signal(self, member: int, flag: int) -> None:
        """Add 1 to counter ``flag`` of team member ``member`` (ordered after this PE's earlier
        operations to it by a fence, so data put before the signal is there first)."""
        pe = self.pes[member]
        t = self.routes[member]
        try:
            if t.spec.native_fence:
                t.fence()
            else:
                t.quiet()
            t.amo(pe, INTERNAL_SEG, self.base + _OFF_FLAGS + 8 * flag, AmoOp.ADD, 8, 1, 0,
                  False)
        except TransportError as exc:  # PeerFailedError when a failed PE caused it
            raise self.rt.waiter.translate(exc, pe)  # noqa: B904 (it keeps the cause)

    def wait(self, flag: int, count: int = 1, what: str = "collective") -> None:
        """Wait for ``count`` more signals on this PE's counter ``flag``."""
        self._expect[flag] += count
        want = self._expect[flag]
        addr = self._addr + _OFF_FLAGS + 8 * flag
        self.waiter.wait(lambda: lib.vk_amo(addr, AmoOp.FETCH, 8, 0, 0) >= want, addr, 8,
                         f"{what} (signal {flag} of team slot {self.slot})")

    # -- splitting ---------------------------------------------------------------------------

    def agree_slots(self, count: int) -> list[int]:
        """Collective over this team: ``count`` slot numbers free on every member."""
        rt = self.rt
        k = self._splits
        self._splits += 1
        root_pe = self.pes[0]
        root_t = self.routes[0]
        word = self.base + _OFF_AGREE + 8 * (k % 2)
        root_t.amo(root_pe, INTERNAL_SEG, word, AmoOp.AND, 8, rt.free_slots, 0, False)
        root_t.quiet()
        self.sync()
        agreed = root_t.amo(root_pe, INTERNAL_SEG, word, AmoOp.FETCH, 8, 0, 0, True)
        if self.me == 0:  # ready the other word for the next split (used after the next sync)
            lib.vk_amo(self._addr + _OFF_AGREE + 8 * ((k + 1) % 2), AmoOp.SET, 8, ALL_ONES, 0)
        slots = [s for s in range(64) if agreed >> s & 1][:count]
        if len(slots) < count:
            raise VkshmemError(
                f"no free team slot left on some PE of this team (each PE has "
                f"{rt.teams_max}); destroy unused teams or raise VKSHMEM_TEAMS_MAX")
        return slots

    def split(self, families: Sequence[Sequence[Sequence[int]]]) -> list[TeamState | None]:
        """Collective over this team: make new teams. Each family is a list of disjoint groups
        of this team's PE indices sharing one new slot; returns, per family, the team holding
        this PE (None when this PE is in none of the family's groups)."""
        if self.me < 0:
            raise InvalidArgumentError("only members of a team can split it")
        rt = self.rt
        slots = self.agree_slots(len(families))
        out: list[TeamState | None] = []
        for slot, family in zip(slots, families, strict=True):
            mine = next((g for g in family if self.me in g), None)
            if mine is None:
                out.append(None)
                continue
            team = TeamState(rt, [self.pes[i] for i in mine], slot, self)
            rt.free_slots &= ~(1 << slot)
            team.reset_slot()
            out.append(team)
        self.sync()  # no member signals into a new slot before every owner has reset it
        return out

    def destroy(self) -> None:
        """Collective over the team: release its slot on this PE."""
        if self.destroyed:
            return
        self.sync()
        self.destroyed = True
        self.rt.free_slots |= 1 << self.slot

    def reset_slot(self) -> None:
        """Zero this PE's copy of the slot header (a new team starts from scratch)."""
        import ctypes

        ctypes.memset(self._addr, 0, SLOT_HEADER)
        lib.vk_amo(self._addr + _OFF_AGREE, AmoOp.SET, 8, ALL_ONES, 0)
        lib.vk_amo(self._addr + _OFF_AGREE + 8, AmoOp.SET, 8, ALL_ONES, 0)

    def translate(self, pe: int, other: TeamState) -> int:
        """Team PE ``pe`` of this team as a PE number of ``other`` (-1 if not a member)."""
        if not 0 <= pe < self.size:
            raise InvalidArgumentError(f"PE {pe} is not in this team of {self.size} PEs")
        return other.index.get(self.pes[pe], -1)
