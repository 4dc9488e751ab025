"""Non-blocking fetching AMOs (``atomic_*_nbi``, OpenSHMEM 1.5): the prior value lands in a
local one-element array ``fetch`` instead of being returned.

The value is in ``fetch`` by the next ``quiet`` (of ``ctx``); an implementation may complete
earlier, and this one does: every ``*_nbi`` call has applied the AMO and filled ``fetch`` when it
returns (no transport offers deferred fetching AMOs yet). Portable code reads ``fetch`` only
after ``quiet``. ``fetch`` must have the dtype of the target and be writable; it is checked
before anything happens at the target.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.fast import entry
from ..core.transports.contract import AmoOp
from .amo import _amo, _op, op_map
from .args import DomainArray

__all__ = [
    "atomic_compare_swap_nbi", "atomic_fetch_add_nbi", "atomic_fetch_and_nbi",
    "atomic_fetch_inc_nbi", "atomic_fetch_nbi", "atomic_fetch_op_nbi", "atomic_fetch_or_nbi",
    "atomic_fetch_xor_nbi", "atomic_swap_nbi",
]


def _nbi(fetch: np.ndarray, target: np.ndarray, pe: int, op: AmoOp, value: Any, cond: Any,
         ints_only: bool, what: str, ctx: Any) -> None:
    device = isinstance(fetch, DomainArray)
    if not device and not isinstance(fetch, np.ndarray):
        raise InvalidTypeError(f"{what}: fetch must be a one-element numpy array (or a "
                               f"domain's array such as a DeviceArray), got "
                               f"{type(fetch).__name__}")
    tdt = getattr(target, "dtype", None)
    if tdt is not None and fetch.dtype != tdt:
        raise InvalidArgumentError(f"{what}: fetch has dtype {fetch.dtype}, the target {tdt}; "
                                   "they must match")
    if fetch.size != 1:
        raise InvalidArgumentError(f"{what}: fetch must be one element, got {fetch.size}")
    if not device and not fetch.flags.writeable:
        raise InvalidArgumentError(f"{what}: fetch is read-only")
    old = _amo(target, pe, op, value, cond, True, ints_only, what, ctx)
    if device:
        fetch[...] = old
    else:
        fetch.flat[0] = old


def atomic_fetch_nbi(fetch: np.ndarray, source: np.ndarray, pe: int, ctx: Any = None) -> None:
    """Fetch one-element ``source`` on ``pe`` into local ``fetch`` (filled by the next
    ``quiet``; here already on return)."""
    _nbi(fetch, source, pe, AmoOp.FETCH, 0, 0, False, "atomic_fetch_nbi", ctx)


def atomic_swap_nbi(fetch: np.ndarray, target: np.ndarray, value: Any, pe: int,
                    ctx: Any = None) -> None:
    """Write ``value`` into ``target`` on ``pe``; its prior value lands in ``fetch`` by the
    next ``quiet`` (here already on return)."""
    _nbi(fetch, target, pe, AmoOp.SWAP, value, 0, False, "atomic_swap_nbi", ctx)


def atomic_compare_swap_nbi(fetch: np.ndarray, target: np.ndarray, cond: Any, value: Any,
                            pe: int, ctx: Any = None) -> None:
    """Write ``value`` into ``target`` on ``pe`` if it equals ``cond``; the prior value lands
    in ``fetch`` by the next ``quiet`` (here already on return)."""
    _nbi(fetch, target, pe, AmoOp.CSWAP, value, cond, True, "atomic_compare_swap_nbi", ctx)


def atomic_fetch_inc_nbi(fetch: np.ndarray, target: np.ndarray, pe: int,
                         ctx: Any = None) -> None:
    """Atomically add 1 to ``target`` on ``pe``; the prior value lands in ``fetch`` by the next
    ``quiet`` (here already on return)."""
    _nbi(fetch, target, pe, AmoOp.ADD, 1, 0, True, "atomic_fetch_inc_nbi", ctx)


def atomic_fetch_add_nbi(fetch: np.ndarray, target: np.ndarray, value: Any, pe: int,
                         ctx: Any = None) -> None:
    """Atomically add ``value`` to ``target`` on ``pe``; the prior value lands in ``fetch`` by
    the next ``quiet`` (here already on return)."""
    _nbi(fetch, target, pe, AmoOp.ADD, value, 0, True, "atomic_fetch_add_nbi", ctx)


def atomic_fetch_and_nbi(fetch: np.ndarray, target: np.ndarray, value: Any, pe: int,
                         ctx: Any = None) -> None:
    """Atomic bitwise AND of ``target`` on ``pe`` with ``value``; the prior value lands in
    ``fetch`` by the next ``quiet`` (here already on return)."""
    _nbi(fetch, target, pe, AmoOp.AND, value, 0, True, "atomic_fetch_and_nbi", ctx)


def atomic_fetch_or_nbi(fetch: np.ndarray, target: np.ndarray, value: Any, pe: int,
                        ctx: Any = None) -> None:
    """Atomic bitwise OR of ``target`` on ``pe`` with ``value``; the prior value lands in
    ``fetch`` by the next ``quiet`` (here already on return)."""
    _nbi(fetch, target, pe, AmoOp.OR, value, 0, True, "atomic_fetch_or_nbi", ctx)


def atomic_fetch_xor_nbi(fetch: np.ndarray, target: np.ndarray, value: Any, pe: int,
                         ctx: Any = None) -> None:
    """Atomic bitwise XOR of ``target`` on ``pe`` with ``value``; the prior value lands in
    ``fetch`` by the next ``quiet`` (here already on return)."""
    _nbi(fetch, target, pe, AmoOp.XOR, value, 0, True, "atomic_fetch_xor_nbi", ctx)


def atomic_fetch_op_nbi(fetch: np.ndarray, target: np.ndarray, value: Any, op: Any, pe: int,
                        ctx: Any = None) -> None:
    """Apply AMO ``op`` (``AMO`` member or its name; ``SET`` behaves as swap) with ``value`` to
    ``target`` on ``pe``; the prior value lands in ``fetch`` by the next ``quiet`` (here
    already on return)."""
    code, inc = _op(op)
    if code == AmoOp.SET:
        code = AmoOp.SWAP
    _nbi(fetch, target, pe, code, 1 if inc else value, 0, code != AmoOp.SWAP,
         "atomic_fetch_op_nbi", ctx)


# The shm hot path of plain numpy arrays runs in C (vkshmem.core.fast), the prior value
# written into ``fetch`` there; everything else, and every error, takes the functions above.
atomic_fetch_nbi = entry("amo", atomic_fetch_nbi, op=AmoOp.FETCH)
atomic_swap_nbi = entry("amo", atomic_swap_nbi, op=AmoOp.SWAP)
atomic_compare_swap_nbi = entry("amo", atomic_compare_swap_nbi, op=AmoOp.CSWAP,
                                ints_only=True)
atomic_fetch_inc_nbi = entry("amo", atomic_fetch_inc_nbi, op=AmoOp.ADD, ints_only=True)
atomic_fetch_add_nbi = entry("amo", atomic_fetch_add_nbi, op=AmoOp.ADD, ints_only=True)
atomic_fetch_and_nbi = entry("amo", atomic_fetch_and_nbi, op=AmoOp.AND, ints_only=True)
atomic_fetch_or_nbi = entry("amo", atomic_fetch_or_nbi, op=AmoOp.OR, ints_only=True)
atomic_fetch_xor_nbi = entry("amo", atomic_fetch_xor_nbi, op=AmoOp.XOR, ints_only=True)
atomic_fetch_op_nbi = entry("amo", atomic_fetch_op_nbi, opmap=op_map(True))
