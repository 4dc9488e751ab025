"""Collectives in the core: broadcast, collect/fcollect, alltoall(s), reductions and scans.

Everything here is built from the transport contract (put, AMO) and the team's signal
counters (:class:`~vkshmem.core.teams.TeamState`); a transport may replace any of these
algorithms through :meth:`Transport.collective <vkshmem.core.transport.Transport.collective>`
(:func:`find_offload`). The public, validating layer is :mod:`vkshmem._api.collectives` and
:mod:`vkshmem._api.reductions`; the functions here take already checked, flat, contiguous numpy
arrays.

Algorithms (``n`` = team size, all of them correct for any ``n``):

* **broadcast**: binomial tree rooted at ``root`` (children of relative rank ``v`` are
  ``v + 2**k`` for ``2**k > v``, largest subtree first). Up to :data:`BCAST_CHUNK` bytes the
  data is *pushed*: each parent puts straight from its ``target`` (the root: from ``source``)
  into its children's targets and signals them. Above it the data is *pulled* in chunks of
  :data:`BCAST_CHUNK`, pipelined down the tree: a parent announces chunk ``k`` of its target,
  the child gets it into its own target and announces it to its children while the parent
  prepares chunk ``k + 1``; every PE copies the data once, the copies run on different
  cores, and a parent returns when its children signal that they are done reading.
* **fcollect / collect**: dissemination (Bruck) allgather, ``ceil(log2 n)`` rounds; in round
  ``r`` a PE puts every block it holds so far (up to ``2**r``) straight into the targets of
  PE ``me - 2**r``, at their final positions (so no local rotation and no scratch). collect
  first runs the same exchange on the per-PE sizes (through the scratch), then on the data.
* **alltoall(s)**: every PE puts block ``j`` into PE ``j``'s target, then signals it, and
  waits for ``n - 1`` signals. alltoalls with a target stride other than 1 goes through the
  scratch (packed blocks, unpacked by the receiver), in chunks.
* **reduce** (all-reduce): recursive doubling (butterfly) with the standard fold for
  non-powers of two (the first ``2 * (n - 2**k)`` PEs pair up, the even one hands its data to
  the odd one and gets the result back) up to :data:`RING_MIN_BYTES`; above that, and when
  every block gets at least one element, a ring reduce-scatter followed by a ring allgather
  that writes the reduced blocks straight into the targets. Both run through the scratch in
  chunks when the data exceeds it.
* **sum_inscan / sum_exscan**: the recursive-doubling scan (exchange of running totals with the
  butterfly partner, with the same fold), through the scratch in chunks.

Signals and flags. A signal is "+1 on counter ``flag`` of a member" after a fence, so data put
before it is visible when the counter moves; a receiver waits for the count it expects
(``TeamState._expect``: counters only grow). Counters carry no identity, so correctness
rests on one of two rules for every (receiver, flag) pair:

1. *One sender.* Broadcast (flag ``F_BCAST + r``: the parent is at team distance ``2**r``
   whatever the root; ``F_BCAST_DONE + r``: the child at distance ``2**r``), Bruck
   (``F_BRUCK + r``: from ``me + 2**r``), the butterfly (``F_RD + r``: the partner of round
   ``r``; ``F_FOLD``/``F_FOLD_BACK``: the pair neighbour) and the ring (``F_RING_*``: the
   left neighbour) all have exactly one possible sender per receiver and flag, in every
   call. Signals of one sender to one PE arrive in order (fence), so a receiver's ``k``-th
   wait on the flag is satisfied exactly by that sender's ``k``-th signal, however far the
   sender has run ahead.
2. *Phases.* Collectives that have many senders per flag (alltoall) or that use the scratch
   (reduce, scans, collect's size exchange, strided alltoalls) run in *phases*: each chunk of
   each such collective is one phase, numbered by a per-team counter that advances alike on
   every member. Every phase is *all-dependent*: no member completes it before every member
   has entered it (each member's result needs every member's data). A phase uses half
   ``phase % 2`` of the scratch and flag ``F_A2A + phase % 2``. A member S writes half ``h``
   (or signals flag ``F_A2A + h``) of member q in phase ``j`` only while S is inside ``j``;
   S got there by completing phase ``j - 1``, which q had therefore entered, so q had
   completed phase ``j - 2``, the last one that used half ``h``: q no longer reads it, nor
   waits on that flag for an older phase. A fast PE can thus be at most one phase ahead of a
   slow one, and the two never share a half. Within a phase, every region of the half is
   written by one sender once (per-round regions).

Nothing here protects the user's ``target``: as OpenSHMEM requires, a target must be ready
before any member enters the collective (a program that reuses one target in consecutive
collectives must synchronise in between, e.g. with ``team.sync()``), and ``source``/``target``
must not change until the call returns on this PE.

Waiting. A receiver first checks its counter; then, while no transport needs progress calls,
it spins in native code with the GIL released (``pause``, then ``sched_yield``), or, on a
node with more PEs than CPUs, polls after each ``sched_yield`` (the PE it waits for may need
the CPU); after about a millisecond the runtime's waiter takes over (``VKSHMEM_WAIT_TIMEOUT``,
transport progress, Ctrl-C).

Flags ``0..135`` of each team are the collectives'; ``136..255`` are free for other users of
``TeamState.signal``/``wait``.

Native teams. A team whose members all take the shm path (while no transport needs progress
calls) has a :class:`~vkshmem.core.fast.NativeTeam`: its barrier, the broadcasts (pushed and
pulled), fcollect, collect, alltoall and alltoalls (strided: through the scratch), and the
all-reduces (butterfly, ring, chunked) and scans of the types C computes run in C
(:mod:`vkshmem.core.fast`), flag for flag and region for region the algorithms below, with
the expected counts and the phase shared through the NativeTeam's buffer: a member running
one of these functions meets a member running the C version.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._native import ffi, lib
from .errors import InvalidArgumentError, TransportError
from .fast import PHASE
from .teams import _OFF_FLAGS, ALIGN, INTERNAL_SEG, RING_MIN_BYTES, TeamState
from .transport import AmoOp, CollectiveArgs, Transport

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = [
    "BCAST_CHUNK",
    "RING_MIN_BYTES",
    "CollTeam",
    "alltoall",
    "alltoalls",
    "broadcast",
    "coll_team",
    "collect",
    "fcollect",
    "find_offload",
    "overlap",
    "reduce",
    "scan",
]

#: Broadcasts above this many bytes are pulled in chunks of it, pipelined down the tree.
BCAST_CHUNK = 256 << 10

# Flags (counter numbers of the team slot) used by the collectives; see the module docstring.
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
        self.direct = [t is rt.shm for t in ts.routes]
        self.expect = ts._expect  # shared with TeamState.wait: one count per counter
        self.flag_off = ts.base + _OFF_FLAGS  # of flag 0, in INTERNAL_SEG, on every member
        self.flag_addr = rt.internal.address + self.flag_off
        self.flag_ptr = ffi.cast("uint64_t *", self.flag_addr)
        self.snap = ffi.new("uint64_t[1]")
        self.crowded = len(rt.node_pes) > (os.cpu_count() or 1)
        self.waiter = rt.waiter
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
                         f"{what} (signal {flag} of team slot {self.ts.slot})")

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


# -- broadcast --------------------------------------------------------------------------------


def _tree(ct: CollTeam, root: int) -> tuple[int, list[tuple[int, int]]]:
    """(flag to wait on or -1 at the root, [(child member, its flag)]) of the binomial tree
    rooted at team PE ``root``: the children of relative rank ``v`` are ``v + 2**k`` for
    ``2**k > v``, largest subtree first; a child waits on ``F_BCAST + k``."""
    tree = ct.trees.get(root)
    if tree is None:
        n, me = ct.n, ct.me
        v = (me - root) % n
        kids: list[tuple[int, int]] = []
        k = v.bit_length()
        while v + (1 << k) < n:
            kids.append(((me + (1 << k)) % n, F_BCAST + k))
            k += 1
        kids.reverse()
        tree = ct.trees[root] = (F_BCAST + v.bit_length() - 1 if v else -1, kids)
    return tree


def broadcast(ct: CollTeam, tgt: np.ndarray, seg: int, off: int, src: np.ndarray,
              root: int) -> None:
    """Collective over the team: ``tgt`` (at ``(seg, off)``) = root's ``src`` (same dtype and
    length), on every member including the root."""
    flag_in, kids = _tree(ct, root)
    if tgt.nbytes > BCAST_CHUNK:
        _broadcast_pull(ct, tgt, seg, off, src, flag_in, kids)
        return
    put_signal = ct.put_signal
    if flag_in < 0:
        for m, flag in kids:
            put_signal(m, seg, off, src, flag)
        _copy(tgt, src)
        return
    ct.wait(flag_in, 1, "broadcast")
    for m, flag in kids:
        put_signal(m, seg, off, tgt, flag)


def _broadcast_pull(ct: CollTeam, tgt: np.ndarray, seg: int, off: int, src: np.ndarray,
                    flag_in: int, kids: list[tuple[int, int]]) -> None:
    """Large broadcasts: pipelined in chunks of :data:`BCAST_CHUNK`, and *pulled*. The root
    copies chunk ``k`` into its own target and tells its children; a child gets the chunk
    from its parent's target into its own and tells its children, while its parent prepares
    chunk ``k + 1``. Every PE thus copies the data once and the copies of a chunk's path run
    on different cores. A child signals its parent when it has got everything (flag
    ``F_BCAST_DONE + k`` for the child at distance ``2**k``), and a parent returns only then:
    its target is read until that moment."""
    isz = tgt.itemsize
    chunks = _chunks(tgt.size, max(1, BCAST_CHUNK // isz))
    if flag_in < 0:
        if overlap(src, seg, off, tgt.nbytes):
            src = src.copy()  # a partial overlap: chunk k must not clobber chunk k + 1
        same = overlap(src, seg, off, tgt.nbytes, True)  # now: the same memory, or disjoint
        for lo, hi in chunks:
            if not same:
                np.copyto(tgt[lo:hi], src[lo:hi])
            for m, flag in kids:
                ct.signal(m, flag)
    else:
        k_in = flag_in - F_BCAST
        parent = (ct.me - (1 << k_in)) % ct.n
        for lo, hi in chunks:
            ct.wait(flag_in, 1, "broadcast")
            ct.get(parent, seg, off + lo * isz, tgt[lo:hi])
            for m, flag in kids:
                ct.signal(m, flag)
        ct.signal(parent, F_BCAST_DONE + k_in)
    for _m, flag in kids:
        ct.wait(F_BCAST_DONE + flag - F_BCAST, 1, "broadcast")


# -- fcollect / collect (Bruck) ---------------------------------------------------------------


def _bruck(ct: CollTeam, seg: int, off: int, local: np.ndarray, bounds: Sequence[int],
           what: str) -> None:
    """Dissemination allgather of blocks already placed in ``local`` (this PE's copy of the
    symmetric buffer at ``(seg, off)``): block ``i`` is elements ``bounds[i]:bounds[i+1]``,
    and this PE's own block is in place on entry."""
    n = ct.n
    me = ct.me
    isz = local.itemsize
    d, r = 1, 0
    while d < n:
        c = min(d, n - d)
        dest = (me - d) % n
        last = me + c  # blocks me..last-1 (mod n)
        lo = bounds[me]
        if last <= n:
            ct.put_signal(dest, seg, off + lo * isz, local[lo:bounds[last]], F_BRUCK + r)
        else:  # wraps around: two pieces
            ct.put(dest, seg, off + lo * isz, local[lo:bounds[n]])
            ct.put_signal(dest, seg, off, local[:bounds[last - n]], F_BRUCK + r)
        ct.wait(F_BRUCK + r, 1, what)
        d <<= 1
        r += 1


def _schedule(ct: CollTeam) -> list[tuple[int, int, int, int]]:
    """The dissemination rounds of this PE: (destination, flag, first block, block count)."""
    sched = ct.bruck
    if sched is None:
        n, me = ct.n, ct.me
        sched = []
        d, r = 1, 0
        while d < n:
            sched.append(((me - d) % n, F_BRUCK + r, me, min(d, n - d)))
            d <<= 1
            r += 1
        ct.bruck = sched
    return sched


def fcollect(ct: CollTeam, tgt: np.ndarray, seg: int, off: int, src: np.ndarray) -> None:
    """Collective over the team: ``tgt`` = every member's ``src`` (same length everywhere)
    concatenated in team order. Round 0 sends ``src`` itself; later rounds send from
    ``tgt``, where the blocks received so far are."""
    bs = src.size
    n = ct.n
    me = ct.me
    bb = bs * tgt.itemsize
    own = tgt[me * bs:(me + 1) * bs]
    _check_in_place(src, seg, off, tgt.nbytes, off + me * bb, "fcollect")
    for dest, flag, first, c in _schedule(ct):
        if first + c <= n:
            piece = src if c == 1 else tgt[first * bs:(first + c) * bs]
            ct.put_signal(dest, seg, off + first * bb, piece, flag)
        else:  # wraps around: two pieces
            ct.put(dest, seg, off + first * bb, tgt[first * bs:])
            ct.put_signal(dest, seg, off, tgt[:(first + c - n) * bs], flag)
        if flag == F_BRUCK:
            _copy(own, src)  # while the first block travels
        ct.wait(flag, 1, "fcollect")
    if n == 1:
        _copy(own, src)


def collect(ct: CollTeam, tgt: np.ndarray, seg: int, off: int, src: np.ndarray) -> int:
    """Collective over the team: the members' ``src`` (lengths may differ) concatenated in
    team order into ``tgt`` (the whole target). Returns the total element count; raises
    InvalidArgumentError (on every member alike, before any data moves) when it exceeds
    ``tgt``."""
    n = ct.n
    me = ct.me
    if n == 1:
        counts = [src.size]
    else:
        # the sizes: a dissemination allgather through the scratch (one phase)
        if 8 * n > ct.half:
            raise InvalidArgumentError(f"collect: a team of {n} PEs needs {8 * n} bytes of "
                                       "scratch per phase; raise VKSHMEM_TEAM_SCRATCH")
        rel = ct.begin_phase()
        table = ct.view(rel, _I8, n)
        table[me] = src.size
        _bruck(ct, INTERNAL_SEG, ct.scratch_off + rel, table, range(n + 1), "collect sizes")
        counts = table.tolist()
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    if bounds[-1] > tgt.size:
        raise InvalidArgumentError(
            f"collect: the {n} PEs contribute {bounds[-1]} elements in all (per PE: "
            f"{counts}), but target holds {tgt.size}")
    _check_in_place(src, seg, off, tgt.nbytes, off + bounds[me] * tgt.itemsize, "collect")
    _copy(tgt[bounds[me]:bounds[me + 1]], src)
    if n > 1:
        _bruck(ct, seg, off, tgt, bounds, "collect")
    return bounds[-1]


# -- alltoall(s) ------------------------------------------------------------------------------


def alltoall(ct: CollTeam, tgt: np.ndarray, seg: int, off: int,
             blocks: Callable[[int], np.ndarray], bs: int) -> None:
    """Collective over the team: ``blocks(j)`` (``bs`` elements) goes to block ``me`` of
    member ``j``'s ``tgt`` (at ``(seg, off)``)."""
    n = ct.n
    me = ct.me
    if n > 1:
        ct.begin_phase()
        flag = ct.a2a_flag()
        boff = off + me * bs * tgt.itemsize
        for k in range(1, n):
            j = (me + k) % n
            ct.put_signal(j, seg, boff, blocks(j), flag)
    _copy(tgt[me * bs:(me + 1) * bs], blocks(me))
    if n > 1:
        ct.wait(flag, n - 1, "alltoall")


def alltoalls(ct: CollTeam, tgt: np.ndarray, src: np.ndarray, nelems: int, tst: int,
              sst: int) -> None:
    """Collective over the team: strided alltoall through the scratch. ``tgt``/``src`` are
    flat typed arrays; element ``i`` of the block for PE ``j`` is ``src[(j*nelems+i)*sst]``
    and lands in ``tgt[(me*nelems+i)*tst]`` of PE ``j``."""
    n = ct.n
    me = ct.me
    dt = src.dtype
    isz = dt.itemsize
    slot = (ct.half // n) // _ALIGN * _ALIGN
    per = slot // isz
    if per == 0:
        raise InvalidArgumentError(f"alltoalls: the team scratch is too small for {n} PEs of "
                                   f"{isz}-byte elements; raise VKSHMEM_TEAM_SCRATCH")
    for e0, e1 in _chunks(nelems, per):
        m = e1 - e0
        rel = ct.begin_phase()
        flag = ct.a2a_flag()
        for k in range(1, n):
            j = (me + k) % n
            s0 = (j * nelems + e0) * sst
            packed = np.ascontiguousarray(src[s0:s0 + (m - 1) * sst + 1:sst])
            ct.put_signal(j, INTERNAL_SEG, ct.scratch_off + rel + me * slot, packed, flag)
        t0 = (me * nelems + e0) * tst
        s0 = (me * nelems + e0) * sst
        tgt[t0:t0 + (m - 1) * tst + 1:tst] = src[s0:s0 + (m - 1) * sst + 1:sst]
        ct.wait(flag, n - 1, "alltoalls")
        for j in range(n):
            if j != me:
                t0 = (j * nelems + e0) * tst
                tgt[t0:t0 + (m - 1) * tst + 1:tst] = ct.view(rel + j * slot, dt, m)


# -- reductions -------------------------------------------------------------------------------


def overlap(src: np.ndarray, seg: int, off: int, tbytes: int, same: bool = False) -> bool:
    """Whether local ``src`` overlaps the ``tbytes`` at symmetric ``(seg, off)`` of this PE
    (exactly the same memory counts only when ``same``)."""
    nb = src.nbytes
    if not nb or not tbytes:
        return False
    r = lib.vk_locate(_from_buffer(src), nb)
    if r < 0 or r >> 48 != seg:
        return False
    soff = r & _MASK48
    if soff == off and nb == tbytes:
        return same
    return soff < off + tbytes and off < soff + nb


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


def reduce(ct: CollTeam, tgt: np.ndarray, seg: int, off: int, src: np.ndarray,
           ufunc: np.ufunc) -> None:
    """Collective over the team: ``tgt`` (typed, at ``(seg, off)``) = ``ufunc`` over every
    member's ``src`` (typed, same length), on every member."""
    nb = tgt.nbytes
    if nb <= ct.rd_fast:
        _reduce_rd(ct, tgt, seg, off, src, ufunc)
        return
    n = ct.n
    cnt = tgt.size
    if n == 1:
        _copy(tgt, src)
        return
    isz = tgt.itemsize
    if nb >= RING_MIN_BYTES and cnt >= n:
        if overlap(src, seg, off, nb):
            src = src.copy()
        _reduce_ring(ct, tgt, seg, off, src, ufunc)
        return
    per = ct.rd_bytes // isz
    if per == 0:
        raise InvalidArgumentError(f"reduce: the team scratch is too small for {n} PEs of "
                                   f"{isz}-byte elements; raise VKSHMEM_TEAM_SCRATCH")
    if overlap(src, seg, off, nb):
        src = src.copy()  # chunk k's result must not overwrite chunk k+1's input
    for e0, e1 in _chunks(cnt, per):
        _reduce_rd(ct, tgt[e0:e1], seg, off + e0 * isz, src[e0:e1], ufunc)


def _reduce_rd(ct: CollTeam, tgt: np.ndarray, seg: int, off: int, src: np.ndarray,
               ufunc: np.ufunc) -> None:
    """One phase of the butterfly all-reduce (scratch regions: 0 fold, 2 + r round r). The
    shm case of the exchange is written out: this is the latency-critical path."""
    p = ct.phase
    ct.phase = p + 1
    rel = (p & 1) * ct.half
    sbase = ct.scratch_off + rel
    role, _rounds, steps = ct.bfly
    me = ct.me
    if role == 2:  # folded out: hand the data to the odd neighbour, get the result back
        ct.put_signal(me + 1, INTERNAL_SEG, sbase, src, F_FOLD)
        ct.wait(F_FOLD_BACK, 1, "reduce")
        return
    dt = tgt.dtype
    cnt = tgt.size
    nb = tgt.nbytes
    rb = -(-nb // _ALIGN) * _ALIGN
    acc = src
    if role == 1:
        ct.wait(F_FOLD, 1, "reduce")
        ufunc(src, ct.view(rel, dt, cnt), tgt)
        acc = tgt
    direct, pes, foff, exp = ct.direct, ct.pes, ct.flag_off, ct.expect
    for partner, flag, region in steps:
        region = region * rb
        if direct[partner]:
            pe = pes[partner]
            _vk_shm_put(INTERNAL_SEG, pe, sbase + region, _from_buffer(acc), nb)
            _vk_shm_amo(INTERNAL_SEG, pe, foff + 8 * flag, _ADD, 8, 1, 0)
        else:
            ct.put_signal(partner, INTERNAL_SEG, sbase + region, acc, flag)
        want = exp[flag] + 1
        if _vk_amo(ct.flag_addr + 8 * flag, _FETCH, 8, 0, 0) >= want:
            exp[flag] = want
        else:
            ct.wait(flag, 1, "reduce")
        ufunc(acc, ct.view(rel + region, dt, cnt), tgt)
        acc = tgt
    if role == 1:  # the folded-out neighbour's result goes straight into its target
        ct.put_signal(me - 1, seg, off, tgt, F_FOLD_BACK)


def _reduce_ring(ct: CollTeam, tgt: np.ndarray, seg: int, off: int, src: np.ndarray,
                 ufunc: np.ufunc) -> None:
    """Ring reduce-scatter (through the scratch, one region per step) then ring allgather
    (straight into the targets), one phase per chunk. ``src`` may be ``tgt`` itself: the
    allgather writes block ``b`` of this PE's target only after this PE folded its own
    block ``b`` in (the value it writes depends on that), and block ``me`` is read only
    by the first step."""
    n = ct.n
    me = ct.me
    dt = tgt.dtype
    isz = dt.itemsize
    cnt = tgt.size
    right = (me + 1) % n
    region = (ct.half // (n - 1)) // _ALIGN * _ALIGN  # per step: one block
    if region // isz == 0:
        raise InvalidArgumentError(f"reduce: the team scratch is too small for {n} PEs of "
                                   f"{isz}-byte elements; raise VKSHMEM_TEAM_SCRATCH")
    per = (region // isz) * n  # elements per chunk (n blocks)
    tmp = np.empty(min(cnt, per) // n + 1, dt)
    for e0, e1 in _chunks(cnt, per):
        m = e1 - e0
        bl = [e0 + (i * m) // n for i in range(n + 1)]  # block i: bl[i]:bl[i+1]
        rel = ct.begin_phase()
        sbase = ct.scratch_off + rel
        ct.put_signal(right, INTERNAL_SEG, sbase, src[bl[me]:bl[me + 1]], F_RING_RS)
        for s in range(n - 1):
            b = (me - 1 - s) % n
            lo, hi = bl[b], bl[b + 1]
            ct.wait(F_RING_RS, 1, "reduce")
            got = ct.view(rel + s * region, dt, hi - lo)
            if s < n - 2:
                part = tmp[:hi - lo]
                ufunc(got, src[lo:hi], part)
                ct.put_signal(right, INTERNAL_SEG, sbase + (s + 1) * region, part, F_RING_RS)
            else:  # b == me + 1: this PE's block is complete
                ufunc(got, src[lo:hi], tgt[lo:hi])
        b = (me + 1) % n
        for _ in range(n - 1):
            lo, hi = bl[b], bl[b + 1]
            ct.put_signal(right, seg, off + lo * isz, tgt[lo:hi], F_RING_AG)
            ct.wait(F_RING_AG, 1, "reduce")
            b = (b - 1) % n


# -- scans ------------------------------------------------------------------------------------


def scan(ct: CollTeam, tgt: np.ndarray, seg: int, off: int, src: np.ndarray,
         inclusive: bool) -> None:
    """Collective over the team: prefix sums of the members' ``src`` (typed) in team order
    into ``tgt`` (typed, at ``(seg, off)``): inclusive (``sum_inscan``) or exclusive
    (``sum_exscan``: the first member gets zeros)."""
    n = ct.n
    cnt = tgt.size
    if n == 1:
        if inclusive:
            _copy(tgt, src)
        else:
            tgt[...] = 0
        return
    role, _rounds, steps = ct.bfly
    isz = tgt.itemsize
    per = ct.rd_bytes // isz
    if cnt <= per:
        _scan_phase(ct, tgt, src, inclusive, role, steps)
        return
    if per == 0:
        raise InvalidArgumentError(f"scan: the team scratch is too small for {n} PEs of "
                                   f"{isz}-byte elements; raise VKSHMEM_TEAM_SCRATCH")
    if overlap(src, seg, off, cnt * isz):
        src = src.copy()
    for e0, e1 in _chunks(cnt, per):
        _scan_phase(ct, tgt[e0:e1], src[e0:e1], inclusive, role, steps)


def _scan_phase(ct: CollTeam, tgt: np.ndarray, x: np.ndarray, inclusive: bool, role: int,
                steps: list[tuple[int, int, int]]) -> None:
    """One phase of the recursive-doubling scan (scratch regions: 0 fold, 1 fold back,
    2 + r round r). Each (virtual) PE keeps ``tot``, the sum over the block of PEs merged so
    far, and ``pre``, the sum over the PEs of that block before it; a folded pair acts as
    one virtual PE whose odd member returns ``pre`` to the even one."""
    me = ct.me
    dt = tgt.dtype
    cnt = tgt.size
    rel = ct.begin_phase()
    rb = -(-cnt * dt.itemsize // _ALIGN) * _ALIGN
    sbase = ct.scratch_off + rel
    add = np.add
    if role == 2:
        ct.put_signal(me + 1, INTERNAL_SEG, sbase, x, F_FOLD)
        ct.wait(F_FOLD_BACK, 1, "scan")
        pre = ct.view(rel + rb, dt, cnt)
        if inclusive:
            add(pre, x, tgt)
        else:
            tgt[...] = pre
        return
    xe = None
    if role == 1:
        ct.wait(F_FOLD, 1, "scan")
        xe = ct.view(rel, dt, cnt)  # the even neighbour's data: valid for this whole phase
        tot = add(xe, x)
    else:
        tot = x.copy()
    pre: np.ndarray | None = None
    for partner, flag, region in steps:
        region *= rb
        ct.put_signal(partner, INTERNAL_SEG, sbase + region, tot, flag)
        ct.wait(flag, 1, "scan")
        other = ct.view(rel + region, dt, cnt)
        if partner < me:  # the partner's block comes first
            pre = other.copy() if pre is None else add(other, pre, pre)
        add(tot, other, tot)
    if pre is None:
        pre = np.zeros(cnt, dt)
    if xe is not None:
        ct.put_signal(me - 1, INTERNAL_SEG, sbase + rb, pre, F_FOLD_BACK)
        add(pre, xe, pre)
    if inclusive:
        add(pre, x, tgt)
    else:
        tgt[...] = pre
