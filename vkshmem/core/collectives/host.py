"""Collectives in the core: broadcast, collect/fcollect, alltoall(s), reductions and scans.

Everything here is built from the transport contract (put, AMO) and the team's signal
counters (:class:`~vkshmem.core.teams.TeamState`); a transport may replace any of these
algorithms through :meth:`Transport.collective
<vkshmem.core.transports.contract.Transport.collective>`
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
the CPU); after about a millisecond the team's waiter takes over (``Waiter.for_collectives``:
``VKSHMEM_COLLECTIVE_TIMEOUT``, or a shorter ``VKSHMEM_WAIT_TIMEOUT``; transport progress;
Ctrl-C). Its WaitTimeoutError names the PE the wait was for (:meth:`CollTeam.waited_for`,
fast_team.c's ``flag_sender``: one sender per flag, by rule 1 above). That bound is how a
mismatch ends: signals carry no count, so a PE whose count differs by more than a chunk
(another number of chunks, or push against pull) waits for signals that never come, and a
PE that returned anyway waits in its next barrier or collective (docs/errors.md).

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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InvalidArgumentError
from ..teams import INTERNAL_SEG, RING_MIN_BYTES

if TYPE_CHECKING:
    pass

from .reduce import overlap, reduce, scan
from .team import (
    _ALIGN,
    _I8,
    BCAST_CHUNK,
    F_BCAST,
    F_BCAST_DONE,
    F_BRUCK,
    CollTeam,
    _check_in_place,
    _chunks,
    _copy,
)

__all__ = [
    "BCAST_CHUNK",
    "RING_MIN_BYTES",
    "CollTeam",
    "alltoall",
    "alltoalls",
    "broadcast",
    "collect",
    "fcollect",
    "overlap",
    "reduce",
    "scan",
]

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
