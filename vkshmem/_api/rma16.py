"""OpenSHMEM 1.6 RMA additions: blocked strided put/get (``ibput``/``ibget``) and ``pe_quiet``.

``ibput``/``ibget`` move ``nblocks`` blocks of ``bsize`` contiguous elements; block ``i``
starts at element ``i * sst`` of the source and lands at element ``i * tst`` of the target
(strides in elements, as ``iput``/``iget``). Each block travels as one contiguous put/get (over
the shm path, as one strided copy into the mapped peer memory). Blocks are applied in order, so
overlapping target blocks (``tst < bsize``) end with the later block's data.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..core.elements import element_count, host_copy
from ..core.errors import InvalidArgumentError
from . import state
from .args import DomainArray, resolve, same_dtype, segment_route
from .rma import _scatter_device, _sym
from .sync import quiet

__all__ = ["ibget", "ibput", "pe_quiet"]


def _shape(target: np.ndarray, source: np.ndarray, tst: Any, sst: Any, bsize: Any,
           nblocks: Any, what: str) -> tuple[np.dtype, int, int, int, int]:
    dt = same_dtype(target, source)
    tst, sst = element_count(tst), element_count(sst)
    bsize, nblocks = element_count(bsize), element_count(nblocks)
    if nblocks > 1 and (tst < 1 or sst < 1):
        raise InvalidArgumentError(f"{what}: strides must be >= 1, got tst={tst}, sst={sst}")
    if nblocks and bsize:
        for name, arr, stride in (("target", target, tst), ("source", source, sst)):
            span = (nblocks - 1) * stride + bsize
            if span > arr.size:
                raise InvalidArgumentError(
                    f"{what}: {nblocks} blocks of {bsize} elements {stride} apart need "
                    f"{span} elements of the {name}, which has {arr.size}")
    return dt, tst, sst, bsize, nblocks


def _flat(a: np.ndarray) -> np.ndarray:
    flat = a.reshape(-1)
    return flat if flat.flags.c_contiguous else np.ascontiguousarray(flat)


def _blocks_view(flat: np.ndarray, stride: int, bsize: int, nblocks: int,
                 writeable: bool = False) -> np.ndarray:
    isz = flat.dtype.itemsize
    return as_strided(flat, (nblocks, bsize), (stride * isz, isz), writeable=writeable)


def ibput(target: np.ndarray, source: np.ndarray, pe: int, tst: int, sst: int, bsize: int,
          nblocks: int, ctx: Any = None) -> None:
    """Blocked strided put: ``nblocks`` blocks of ``bsize`` elements, block ``i`` from element
    ``i*sst`` of local ``source`` to element ``i*tst`` of symmetric ``target`` on ``pe``.
    Returns when ``source`` may be reused; ``quiet`` completes it (OpenSHMEM 1.6)."""
    rt = state.rt
    dt, tst, sst, bsize, nblocks = _shape(target, source, tst, sst, bsize, nblocks, "ibput")
    if not (nblocks and bsize):
        return
    isz = dt.itemsize
    span = (nblocks - 1) * tst + bsize
    seg, off = _sym(target, span * isz, "ibput target")
    pe, t = resolve(ctx, pe)
    t = segment_route(t, seg)
    src = np.ascontiguousarray(_blocks_view(_flat(host_copy(source)), sst, bsize, nblocks))
    peer = rt.peer_buffer(pe, seg) if t is state.shm and tst >= bsize else None
    if peer is not None:
        np.ndarray((nblocks, bsize), dt, buffer=peer, offset=off,
                   strides=(tst * isz, isz))[...] = src
        return
    mv = memoryview(src).cast("B")
    bb = bsize * isz
    for i in range(nblocks):
        t.put(pe, seg, off + i * tst * isz, mv[i * bb:(i + 1) * bb])


def ibget(target: np.ndarray, source: np.ndarray, pe: int, tst: int, sst: int, bsize: int,
          nblocks: int, ctx: Any = None) -> None:
    """Blocked strided get: ``nblocks`` blocks of ``bsize`` elements, block ``i`` from element
    ``i*sst`` of symmetric ``source`` on ``pe`` to element ``i*tst`` of local ``target``.
    Returns with ``target`` filled (OpenSHMEM 1.6)."""
    rt = state.rt
    dt, tst, sst, bsize, nblocks = _shape(target, source, tst, sst, bsize, nblocks, "ibget")
    if not (nblocks and bsize):
        return
    device_target = isinstance(target, DomainArray)
    if not device_target and not target.flags.writeable:
        raise InvalidArgumentError("ibget target is read-only")
    isz = dt.itemsize
    span = (nblocks - 1) * sst + bsize
    seg, off = _sym(source, span * isz, "ibget source")
    pe, t = resolve(ctx, pe)
    t = segment_route(t, seg)
    tmp = np.empty((nblocks, bsize), dt)
    peer = rt.peer_buffer(pe, seg) if t is state.shm else None
    if peer is not None:
        tmp[...] = np.ndarray((nblocks, bsize), dt, buffer=peer, offset=off,
                              strides=(sst * isz, isz))
    else:
        mv = memoryview(tmp).cast("B")
        bb = bsize * isz
        for i in range(nblocks):
            t.get(pe, seg, off + i * sst * isz, mv[i * bb:(i + 1) * bb])
    if device_target:
        flat_t = target.ravel()
        for i in range(nblocks):  # in order: with overlapping blocks the later one wins
            _scatter_device(flat_t[i * tst:i * tst + bsize], tmp[i], 1)
        return
    if tst >= bsize and target.flags.c_contiguous:
        _blocks_view(target.reshape(-1), tst, bsize, nblocks, writeable=True)[...] = tmp
        return
    flat = target.flat
    for i in range(nblocks):  # in order: with overlapping blocks the later one wins
        flat[i * tst:i * tst + bsize] = tmp[i]


def pe_quiet(pes: Iterable[int] | int, ctx: Any = None) -> None:
    """Complete every operation this PE issued (on ``ctx``) to the PEs ``pes`` (numbers in
    ``ctx``'s team; world PEs by default) (OpenSHMEM 1.6). This implementation completes
    every outstanding operation, as ``quiet`` does, after checking the PEs."""
    if isinstance(pes, (int, np.integer)):
        pes = (pes,)
    try:
        for pe in pes:
            resolve(ctx, pe)
    except TypeError:
        raise InvalidArgumentError(f"pe_quiet takes a sequence of PE numbers, got "
                                   f"{pes!r}") from None
    quiet(ctx)
