"""All-reduces and scans of the core's collectives (the algorithms, flags and phases are
described in :mod:`vkshmem.core.collectives.host`): recursive doubling with the fold for
non-powers of two, the ring reduce-scatter + allgather above ``RING_MIN_BYTES``, and the
recursive-doubling scan, through the team's scratch in chunks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._native import lib
from ..errors import InvalidArgumentError
from ..teams import INTERNAL_SEG, RING_MIN_BYTES

if TYPE_CHECKING:
    pass

from .team import (
    _ADD,
    _ALIGN,
    _FETCH,
    _MASK48,
    F_FOLD,
    F_FOLD_BACK,
    F_RING_AG,
    F_RING_RS,
    CollTeam,
    _chunks,
    _copy,
    _from_buffer,
    _vk_amo,
    _vk_shm_amo,
    _vk_shm_put,
)

__all__ = ["overlap", "reduce", "scan"]

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
