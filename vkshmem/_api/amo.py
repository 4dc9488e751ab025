"""Atomic memory operations on 32- and 64-bit words (fetch/set/swap also on float32/64).

AMOs are atomic with respect to every other vkshmem AMO on the same word, whichever path
(shm, a transport's progress thread) carries them: all use the core's native ``vk_amo``.
Fetching AMOs return Python scalars.

The non-fetching AMOs (``atomic_set``, ``atomic_inc``, ``atomic_add``, ``atomic_and``,
``atomic_or``, ``atomic_xor``, ``atomic_op``) take ``stream=`` (keyword-only; see :mod:`.rma`
and :mod:`.streams`): on a CUDA stream of the cuda domain with the peer's heap mapped, a
one-thread kernel on the stream applies it (system-scope atomics) and the call returns at
once; otherwise the stream is synchronized and the blocking call made. Fetching AMOs refuse
``stream=`` (InvalidArgumentError): call them without it.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..core._native import ffi, lib
from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.fast import entry
from ..core.transports.contract import AmoOp
from . import state
from . import streams as _streams
from .args import ND, DomainArray, check_pe, locate, resolve, segment_route
from .enums import AMO

__all__ = [
    "atomic_add", "atomic_and", "atomic_compare_swap", "atomic_fetch", "atomic_fetch_add",
    "atomic_fetch_and", "atomic_fetch_inc", "atomic_fetch_op", "atomic_fetch_or",
    "atomic_fetch_xor", "atomic_inc", "atomic_op", "atomic_or", "atomic_set", "atomic_swap",
    "atomic_xor",
]


class _Kind:
    """How one dtype travels as an AMO word."""

    __slots__ = ("decode", "encode", "is_int", "width")

    def __init__(self, dt: np.dtype) -> None:
        self.width = dt.itemsize
        bits = 8 * self.width
        self.is_int = dt.kind in "iu"
        if self.is_int:
            mask = (1 << bits) - 1
            top = 1 << (bits - 1)
            wrap = 1 << bits

            def encode(v: Any) -> int:
                if type(v) is not int:
                    try:
                        v = v.__index__()
                    except AttributeError:
                        raise InvalidTypeError(
                            f"AMO operand {v!r} is not an integer (target dtype {dt})") from None
                return v & mask

            self.encode = encode
            if dt.kind == "i":
                self.decode = lambda u: u - wrap if u & top else u
            else:
                self.decode = int
        else:
            fmt_f, fmt_u = ("<f", "<I") if self.width == 4 else ("<d", "<Q")
            pf, pu = struct.Struct(fmt_f), struct.Struct(fmt_u)

            def encode_float(v: Any) -> int:
                try:
                    return pu.unpack(pf.pack(v))[0]
                except struct.error:
                    raise InvalidTypeError(
                        f"AMO operand {v!r} is not a real number (target dtype {dt})") from None

            self.encode = encode_float
            self.decode = lambda u: pf.unpack(pu.pack(u))[0]


_CSWAP = AmoOp.CSWAP
_SENTINEL = lib.VK_SENTINEL
_KINDS: dict[np.dtype, _Kind] = {}
for _c in "iIlLqQfd":
    _dt = np.dtype(_c)
    if _dt.itemsize in (4, 8):
        _KINDS[_dt] = _Kind(_dt)


def _word(target: np.ndarray, ints_only: bool, what: str) -> tuple[_Kind, int, int]:
    try:
        kind = _KINDS[target.dtype]
    except (KeyError, AttributeError):
        dt = getattr(target, "dtype", None)
        if dt is None:
            raise InvalidTypeError(f"{what}: the target must be a one-element symmetric numpy "
                                   f"array, got {type(target).__name__}") from None
        raise InvalidArgumentError(
            f"{what}: AMOs work on 32/64-bit integers (and fetch/set/swap on float32/64), "
            f"not {dt}") from None
    if ints_only and not kind.is_int:
        raise InvalidArgumentError(f"{what} needs an integer target, not {target.dtype}")
    if target.size != 1:
        raise InvalidArgumentError(
            f"{what}: the target must be one element (e.g. a[i:i+1]), got {target.size}")
    seg, off = locate(target, kind.width, what)
    if off & (kind.width - 1):
        raise InvalidArgumentError(f"{what}: target is not {kind.width}-byte aligned")
    return kind, seg, off


def _amo(target: np.ndarray, pe: int, op: AmoOp, value: Any, cond: Any, fetch: bool,
         ints_only: bool, what: str, ctx: Any) -> Any:
    rt = state.rt
    try:
        kind = _KINDS[target.dtype]
    except (KeyError, AttributeError, TypeError):
        kind = None
    if kind is None or target.size != 1 or (ints_only and not kind.is_int):
        _word(target, ints_only, what)  # raises the precise error
    enc = kind.encode
    operand = enc(value)
    compare = enc(cond) if op == _CSWAP else 0
    if ctx is None and type(target) is not ND and isinstance(target, DomainArray):
        # a domain's word: straight to its heap (checked there: aligned, in range)
        pe = check_pe(pe)
        if rt.liveness.any:
            rt.liveness.check(pe, f"operation on PE {pe}")
        heap = state.domain_heaps.get(target.domain)
        off = target.offset
        if heap is None or off & (kind.width - 1) or off + kind.width > heap.size:
            _word(target, ints_only, what)  # raises the precise error
        u = heap.amo(pe, heap.seg_id, off, op, kind.width, operand, compare, fetch)
        return kind.decode(u) if fetch else None
    pe, t = resolve(ctx, pe)
    if t is state.shm and (type(target) is ND or not isinstance(target, DomainArray)):
        # the shm fast path: one native call
        u = lib.vk_direct_amo(ffi.from_buffer(target), pe, op, kind.width, operand, compare)
        if u != _SENTINEL or lib.vk_last_error() == 0:
            return kind.decode(u) if fetch else None
    _k, seg, off = _word(target, ints_only, what)
    u = segment_route(t, seg).amo(pe, seg, off, op, kind.width, operand, compare, fetch)
    return kind.decode(u) if fetch else None


def _on_stream(target: Any, pe: int, op: AmoOp, value: Any, ints_only: bool, what: str,
               ctx: Any, stream: Any) -> bool:
    """A non-fetching AMO with ``stream``: True when enqueued (else the stream is
    synchronized and the caller makes the blocking call)."""
    kind, _seg, _off = _word(target, ints_only, what)  # raises the precise error
    return _streams.amo(target, pe, op, kind.width, kind.encode(value), ctx, stream)


def _no_stream(stream: Any, what: str) -> None:
    if stream is not None:
        raise InvalidArgumentError(f"{what} fetches a value, which a stream cannot return: call "
                                   "it without stream= (synchronize the stream first)")


def atomic_fetch(source: np.ndarray, pe: int, ctx: Any = None, *, stream: Any = None) -> Any:
    """Return the value of one-element ``source`` on ``pe``, read atomically."""
    _no_stream(stream, "atomic_fetch")
    return _amo(source, pe, AmoOp.FETCH, 0, 0, True, False, "atomic_fetch", ctx)


def atomic_set(target: np.ndarray, value: Any, pe: int, ctx: Any = None, *,
               stream: Any = None) -> None:
    """Atomically write ``value`` into ``target`` on ``pe``."""
    if stream is not None and _on_stream(target, pe, AmoOp.SET, value, False, "atomic_set",
                                         ctx, stream):
        return
    _amo(target, pe, AmoOp.SET, value, 0, False, False, "atomic_set", ctx)


def atomic_swap(target: np.ndarray, value: Any, pe: int, ctx: Any = None,
                *, stream: Any = None) -> Any:
    """Write ``value`` into ``target`` on ``pe``; return the prior value."""
    _no_stream(stream, "atomic_swap")
    return _amo(target, pe, AmoOp.SWAP, value, 0, True, False, "atomic_swap", ctx)


def atomic_compare_swap(target: np.ndarray, cond: Any, value: Any, pe: int,
                        ctx: Any = None, *, stream: Any = None) -> Any:
    """Write ``value`` into ``target`` on ``pe`` if it equals ``cond``; return the prior value."""
    _no_stream(stream, "atomic_compare_swap")
    return _amo(target, pe, AmoOp.CSWAP, value, cond, True, True, "atomic_compare_swap", ctx)


def atomic_inc(target: np.ndarray, pe: int, ctx: Any = None, *,
               stream: Any = None) -> None:
    """Atomically add 1 to ``target`` on ``pe``."""
    if stream is not None and _on_stream(target, pe, AmoOp.ADD, 1, True, "atomic_inc", ctx, stream):
        return
    _amo(target, pe, AmoOp.ADD, 1, 0, False, True, "atomic_inc", ctx)


def atomic_fetch_inc(target: np.ndarray, pe: int, ctx: Any = None, *, stream: Any = None) -> Any:
    """Atomically add 1 to ``target`` on ``pe``; return the prior value."""
    _no_stream(stream, "atomic_fetch_inc")
    return _amo(target, pe, AmoOp.ADD, 1, 0, True, True, "atomic_fetch_inc", ctx)


def atomic_add(target: np.ndarray, value: Any, pe: int, ctx: Any = None, *,
               stream: Any = None) -> None:
    """Atomically add ``value`` to ``target`` on ``pe``."""
    if stream is not None and _on_stream(target, pe, AmoOp.ADD, value, True, "atomic_add",
                                         ctx, stream):
        return
    _amo(target, pe, AmoOp.ADD, value, 0, False, True, "atomic_add", ctx)


def atomic_fetch_add(target: np.ndarray, value: Any, pe: int, ctx: Any = None,
                     *, stream: Any = None) -> Any:
    """Atomically add ``value`` to ``target`` on ``pe``; return the prior value."""
    _no_stream(stream, "atomic_fetch_add")
    return _amo(target, pe, AmoOp.ADD, value, 0, True, True, "atomic_fetch_add", ctx)


def atomic_and(target: np.ndarray, value: Any, pe: int, ctx: Any = None, *,
               stream: Any = None) -> None:
    """Atomic bitwise AND of ``target`` on ``pe`` with ``value``."""
    if stream is not None and _on_stream(target, pe, AmoOp.AND, value, True, "atomic_and",
                                         ctx, stream):
        return
    _amo(target, pe, AmoOp.AND, value, 0, False, True, "atomic_and", ctx)


def atomic_fetch_and(target: np.ndarray, value: Any, pe: int, ctx: Any = None,
                     *, stream: Any = None) -> Any:
    """Atomic bitwise AND; return the prior value."""
    _no_stream(stream, "atomic_fetch_and")
    return _amo(target, pe, AmoOp.AND, value, 0, True, True, "atomic_fetch_and", ctx)


def atomic_or(target: np.ndarray, value: Any, pe: int, ctx: Any = None, *,
              stream: Any = None) -> None:
    """Atomic bitwise OR of ``target`` on ``pe`` with ``value``."""
    if stream is not None and _on_stream(target, pe, AmoOp.OR, value, True, "atomic_or",
                                         ctx, stream):
        return
    _amo(target, pe, AmoOp.OR, value, 0, False, True, "atomic_or", ctx)


def atomic_fetch_or(target: np.ndarray, value: Any, pe: int, ctx: Any = None,
                    *, stream: Any = None) -> Any:
    """Atomic bitwise OR; return the prior value."""
    _no_stream(stream, "atomic_fetch_or")
    return _amo(target, pe, AmoOp.OR, value, 0, True, True, "atomic_fetch_or", ctx)


def atomic_xor(target: np.ndarray, value: Any, pe: int, ctx: Any = None, *,
               stream: Any = None) -> None:
    """Atomic bitwise XOR of ``target`` on ``pe`` with ``value``."""
    if stream is not None and _on_stream(target, pe, AmoOp.XOR, value, True, "atomic_xor",
                                         ctx, stream):
        return
    _amo(target, pe, AmoOp.XOR, value, 0, False, True, "atomic_xor", ctx)


def atomic_fetch_xor(target: np.ndarray, value: Any, pe: int, ctx: Any = None,
                     *, stream: Any = None) -> Any:
    """Atomic bitwise XOR; return the prior value."""
    _no_stream(stream, "atomic_fetch_xor")
    return _amo(target, pe, AmoOp.XOR, value, 0, True, True, "atomic_fetch_xor", ctx)


_OPS = {"set": AmoOp.SET, "inc": AmoOp.ADD, "add": AmoOp.ADD, "and": AmoOp.AND,
        "or": AmoOp.OR, "xor": AmoOp.XOR}


def _op(op: Any) -> tuple[AmoOp, bool]:
    name = str(op.value if hasattr(op, "value") else op).lower()
    try:
        return _OPS[name], name == "inc"
    except KeyError:
        raise InvalidArgumentError(
            f"unknown AMO {op!r}: use shmem.AMO.SET/INC/ADD/AND/OR/XOR") from None


def atomic_op(target: np.ndarray, value: Any, op: Any, pe: int, ctx: Any = None, *,
              stream: Any = None) -> None:
    """Apply AMO ``op`` (``AMO`` member or its name) with ``value`` to ``target`` on ``pe``."""
    code, inc = _op(op)
    if stream is not None and _on_stream(target, pe, code, 1 if inc else value,
                                         code != AmoOp.SET, "atomic_op", ctx, stream):
        return
    _amo(target, pe, code, 1 if inc else value, 0, False, code != AmoOp.SET, "atomic_op", ctx)


def atomic_fetch_op(target: np.ndarray, value: Any, op: Any, pe: int, ctx: Any = None,
                    *, stream: Any = None) -> Any:
    """Apply AMO ``op`` and return the prior value (``SET`` behaves as swap)."""
    _no_stream(stream, "atomic_fetch_op")
    code, inc = _op(op)
    if code == AmoOp.SET:
        code = AmoOp.SWAP
    return _amo(target, pe, code, 1 if inc else value, 0, True, code != AmoOp.SWAP,
                "atomic_fetch_op", ctx)


def op_map(fetching: bool) -> dict[Any, int]:
    """For the fast paths of ``atomic_op`` (``fetching``: ``atomic_fetch_op``): each ``op``
    argument they take as is (AMO members and lower-case names) -> ``code | inc << 4 |
    ints_only << 5`` (``SET`` fetching is a swap)."""
    out: dict[Any, int] = {}
    for member in AMO:
        code, inc = _OPS[member.value], member is AMO.INC
        if fetching and code == AmoOp.SET:
            code = AmoOp.SWAP
        plain = code in (AmoOp.SET, AmoOp.SWAP)
        out[member] = out[member.value] = int(code) | inc << 4 | (not plain) << 5
    return out


# The shm hot path of plain numpy arrays runs in C (vkshmem.core.fast); everything else, and
# every error, takes the Python functions above.
atomic_fetch = entry("amo", atomic_fetch, op=AmoOp.FETCH, fetch=True)
atomic_set = entry("amo", atomic_set, op=AmoOp.SET)
atomic_swap = entry("amo", atomic_swap, op=AmoOp.SWAP, fetch=True)
atomic_compare_swap = entry("amo", atomic_compare_swap, op=AmoOp.CSWAP, fetch=True,
                            ints_only=True)
atomic_inc = entry("amo", atomic_inc, op=AmoOp.ADD, ints_only=True)
atomic_fetch_inc = entry("amo", atomic_fetch_inc, op=AmoOp.ADD, fetch=True, ints_only=True)
atomic_add = entry("amo", atomic_add, op=AmoOp.ADD, ints_only=True)
atomic_fetch_add = entry("amo", atomic_fetch_add, op=AmoOp.ADD, fetch=True, ints_only=True)
atomic_and = entry("amo", atomic_and, op=AmoOp.AND, ints_only=True)
atomic_fetch_and = entry("amo", atomic_fetch_and, op=AmoOp.AND, fetch=True, ints_only=True)
atomic_or = entry("amo", atomic_or, op=AmoOp.OR, ints_only=True)
atomic_fetch_or = entry("amo", atomic_fetch_or, op=AmoOp.OR, fetch=True, ints_only=True)
atomic_xor = entry("amo", atomic_xor, op=AmoOp.XOR, ints_only=True)
atomic_fetch_xor = entry("amo", atomic_fetch_xor, op=AmoOp.XOR, fetch=True, ints_only=True)
atomic_op = entry("amo", atomic_op, opmap=op_map(False))
atomic_fetch_op = entry("amo", atomic_fetch_op, fetch=True, opmap=op_map(True))
