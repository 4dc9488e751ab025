"""Direct access: ``ptr`` (a numpy view of a peer's symmetric array, where its memory is mapped
here) and ``addr_accessible``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.domains.contract import DomainArray
from ..core.errors import InvalidArgumentError
from . import state
from .args import check_pe, heap_of, locate
from .lifecycle import pe_accessible

__all__ = ["addr_accessible", "ptr"]


def addr_accessible(addr: Any, pe: int) -> bool:
    """Whether ``addr`` is symmetric (usable as a remote address on ``pe``)."""
    state.require()
    if isinstance(addr, DomainArray):
        return pe_accessible(pe) and addr.domain in state.domain_heaps
    if not pe_accessible(pe) or not isinstance(addr, np.ndarray):
        return False
    try:
        _symmetric_offset(addr)
    except InvalidArgumentError:
        return False
    return True


def _symmetric_offset(a: np.ndarray) -> tuple[int, int]:
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    start = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    seg, off = locate(base, 0, "ptr target")
    return seg, off + start


def ptr(target: np.ndarray, pe: int) -> np.ndarray | None:
    """A numpy view of symmetric ``target`` on ``pe`` for direct loads and stores, or None
    when ``pe``'s memory is not mapped here (another node, or ``VKSHMEM_SHM=0``)."""
    rt = state.rt
    pe = check_pe(pe)
    if isinstance(target, DomainArray):  # a CPU view of a peer's device heap, if one exists
        heap = heap_of(target, "ptr target")
        mem = heap.direct[pe]
        view = heap.domain.host_view(mem) if mem is not None else None
        if view is None:  # a device-usable view, where the domain offers one
            return None if mem is None else heap.domain.device_view(
                mem, target.offset, target.shape, target.dtype)
        return np.frombuffer(view, target.dtype, target.size, target.offset).reshape(
            target.shape)
    seg, off = _symmetric_offset(target)
    buf = rt.peer_buffer(pe, seg)
    if buf is None:
        return None
    view = np.ndarray(target.shape, target.dtype, buffer=buf, offset=off,
                      strides=target.strides)
    view.flags.writeable = target.flags.writeable
    return view
