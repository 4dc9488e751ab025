"""Signals (OpenSHMEM 1.5/1.6): put-with-signal, signal fetch/wait, and 1.6's signal_add/set.

A signal is a symmetric 64-bit word (``new_signal()`` gives a one-element ``uint64`` array;
any one-element, 8-byte aligned, 64-bit integer symmetric array works). Signal values are
unsigned 64-bit: every value given is taken modulo ``2**64``, every value returned is in
``[0, 2**64)``.

``put_signal`` delivers its data before its signal on every transport: it issues the put (the
``put``/``put_nbi`` of :mod:`.rma`), then orders it (the transport's ``fence``, or ``quiet``
where the transport has no native fence or a non-blocking put may have been split over
several rails; on the shm path the copy is complete and the sequentially consistent atomic
that follows is itself the fence), then the signal update (an 8-byte atomic SET or ADD) on
the same transport endpoint. A PE that sees the signal (``signal_wait_until`` and
``signal_fetch`` read it with sequentially consistent atomic loads, so later reads are not
hoisted above them) therefore sees the data.
Updates are atomic with respect to every other vkshmem AMO on the word.

``put_signal(_nbi)``, ``signal_add``/``signal_set`` and ``signal_wait_until`` take ``stream=``
(keyword-only; see :mod:`.rma` and :mod:`.streams`): on a CUDA stream of the cuda domain, with
the peer's heap mapped and the signal in the same heap, the copy and then the signal's update
(data first, by stream order) or the bounded wait are enqueued and the call returns at once
(``signal_wait_until`` then returns None); otherwise the stream is synchronized and the
blocking call made.
"""

from __future__ import annotations

import enum
import operator
from typing import Any

import numpy as np

from ..core._native import ffi, lib
from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.fast import entry
from ..core.transports.contract import AmoOp
from . import state
from . import streams as _streams
from .alloc import free, new_array
from .args import ND, DomainArray, heap_of, locate, resolve, segment_route
from .enums import cmp_codes, cmp_function
from .rma import put, put_nbi

__all__ = [
    "SIGNAL", "SIGNAL_ADD", "SIGNAL_SET", "del_signal", "new_signal", "put_signal",
    "put_signal_nbi", "signal_add", "signal_fetch", "signal_set", "signal_wait_until",
]

_MASK64 = (1 << 64) - 1
_FETCH = int(AmoOp.FETCH)


class SIGNAL(enum.IntEnum):
    """How ``put_signal`` updates the signal word."""

    SET = 1
    """Atomically write the value into the signal."""
    ADD = 2
    """Atomically add the value to the signal (modulo 2**64)."""


SIGNAL_SET: SIGNAL = SIGNAL.SET
SIGNAL_ADD: SIGNAL = SIGNAL.ADD

_SIGOPS = {SIGNAL.SET: AmoOp.SET, SIGNAL.ADD: AmoOp.ADD}


def _sigop(sigop: Any) -> AmoOp:
    try:
        return _SIGOPS[sigop]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"unknown signal operation {sigop!r}: use shmem.SIGNAL.SET or shmem.SIGNAL.ADD"
        ) from None


def _value(value: Any, what: str) -> int:
    try:
        return operator.index(value) & _MASK64
    except TypeError:
        raise InvalidTypeError(f"{what}: the signal value must be an integer, got "
                               f"{value!r}") from None


_MASK48 = (1 << 48) - 1
_CMP_CODES = {cmp_function(code): code for code in range(1, 7)}  # comparison -> CMP code
_SENTINEL = lib.VK_SENTINEL
_DTYPES = frozenset(np.dtype(c) for c in "lLqQ")  # native 64-bit integers


def _signal_word(signal: Any, what: str) -> tuple[int, int]:
    """``(segment, offset)`` of a signal word, or an InvalidArgumentError saying what is wrong."""
    try:
        r = lib.vk_locate(ffi.from_buffer(signal), 8) \
            if signal.dtype in _DTYPES and signal.size == 1 else -1
    except (AttributeError, TypeError, BufferError, ValueError):
        r = -1
    if r >= 0 and not r & 7:
        return r >> 48, r & _MASK48
    dt = getattr(signal, "dtype", None)
    if isinstance(signal, DomainArray) and dt in _DTYPES and signal.size == 1 \
            and not signal.offset & 7:
        return heap_of(signal, what).seg_id, signal.offset
    if not isinstance(signal, (np.ndarray, DomainArray)) or dt is None:
        raise InvalidTypeError(f"{what}: a signal is a one-element symmetric uint64 array "
                               f"(from shmem.new_signal()), got {type(signal).__name__}")
    if dt.kind not in "iu" or dt.itemsize != 8 or not dt.isnative:
        raise InvalidArgumentError(f"{what}: a signal must be a 64-bit integer word (uint64), "
                                   f"not {dt}")
    if signal.size != 1:
        raise InvalidArgumentError(f"{what}: a signal is one element (e.g. sig[i:i+1]), got "
                                   f"{signal.size}")
    _seg, off = locate(signal, 8, f"{what} signal")  # raises: not symmetric
    raise InvalidArgumentError(f"{what}: the signal is not 8-byte aligned (offset {off})")


def _read(signal: Any, what: str) -> int:
    """This PE's signal word, read atomically (a seq-cst load: later reads stay after it)."""
    try:
        if signal.dtype in _DTYPES and signal.size == 1:
            u = lib.vk_direct_amo(ffi.from_buffer(signal), state.rt.my_pe, _FETCH, 8, 0, 0)
            if u != _SENTINEL or lib.vk_last_error() == 0:
                return int(u)
    except (AttributeError, TypeError, BufferError, ValueError):
        pass
    seg, off = _signal_word(signal, what)  # raises the precise error
    heap = state.seg_heaps[seg]
    if heap is not None:
        return heap.amo_on(heap.local, off, AmoOp.FETCH, 8, 0, 0)
    raise InvalidArgumentError(f"{what}: this PE's signal memory is not mapped")


def new_signal(domain: str = "host") -> Any:
    """Collective: a new signal, a one-element symmetric ``uint64`` array set to 0 (in the
    memory of ``domain``: a DeviceArray with ``domain='gpu'``, where shaders can watch it)."""
    return new_array(1, np.uint64, domain=domain)


def del_signal(signal: np.ndarray) -> None:
    """Collective: release a signal from :func:`new_signal`."""
    free(signal)


def _put_signal(target: np.ndarray, source: np.ndarray, pe: int, signal: np.ndarray,
                value: Any, sigop: Any, size: int | None, ctx: Any, nbi: bool,
                what: str) -> None:
    op = _sigop(sigop)
    v = value & _MASK64 if type(value) is int else _value(value, what)
    sseg, soff = _signal_word(signal, what)  # checked before anything is written
    if nbi:
        put_nbi(target, source, pe, size, ctx)
    else:
        put(target, source, pe, size, ctx)
    rt = state.rt
    wpe, t = resolve(ctx, pe)
    device = type(target) is not ND and isinstance(target, DomainArray)
    if device or state.seg_heaps[sseg] is not None:
        # puts into a domain's memory imported here or through its proxy are complete on
        # return; a put a transport carries is complete after a quiet
        if not device or heap_of(target, what).carrier[wpe] is not None:
            rt.quiet()
        segment_route(t, sseg).amo(wpe, sseg, soff, op, 8, v, 0, False)
        return
    if t is state.shm:  # the copy is done, and the seq-cst atomic that follows is ordered
        lib.vk_shm_amo(sseg, wpe, soff, op, 8, v, 0)  # after it (its fence is built in)
        return
    if nbi and ctx is None and len(rt.routing.rails) > 1:
        rt.quiet()  # a non-blocking put may have been split over several rails
    elif t.spec.native_fence:
        t.fence()  # a blocking put took this transport, or was split and completed
    else:
        t.quiet()
    t.amo(wpe, sseg, soff, op, 8, v, 0, False)


def put_signal(target: np.ndarray, source: np.ndarray, pe: int, signal: np.ndarray,
               value: int, sigop: SIGNAL, size: int | None = None, ctx: Any = None, *,
               stream: Any = None) -> None:
    """Copy ``size`` elements (default: the shorter array) of local ``source`` into symmetric
    ``target`` on ``pe``, then update ``signal`` on ``pe`` with ``value`` (``sigop``:
    ``SIGNAL.SET`` or ``SIGNAL.ADD``). The data is delivered before the signal; ``source`` may
    be reused on return (with ``stream``: once the stream has run it); ``quiet`` completes
    both."""
    if stream is not None and _streamed(target, source, pe, signal, value, sigop, size, ctx,
                                        stream, "put_signal"):
        return
    _put_signal(target, source, pe, signal, value, sigop, size, ctx, False, "put_signal")


def put_signal_nbi(target: np.ndarray, source: np.ndarray, pe: int, signal: np.ndarray,
                   value: int, sigop: SIGNAL, size: int | None = None,
                   ctx: Any = None, *, stream: Any = None) -> None:
    """Start a ``put_signal``: ``source`` must not change before the next ``quiet``, which
    completes the put and the signal update (the data is still delivered before the signal;
    ``stream``: as for ``put_signal``)."""
    if stream is not None and _streamed(target, source, pe, signal, value, sigop, size, ctx,
                                        stream, "put_signal_nbi"):
        return
    _put_signal(target, source, pe, signal, value, sigop, size, ctx, True, "put_signal_nbi")


def _streamed(target: Any, source: Any, pe: int, signal: Any, value: Any, sigop: Any,
              size: Any, ctx: Any, stream: Any, what: str) -> bool:
    """put_signal(_nbi) with ``stream``: True when enqueued (else the stream is synchronized)."""
    op = _sigop(sigop)
    v = value & _MASK64 if type(value) is int else _value(value, what)
    return _streams.put_signal(target, source, pe, signal, op, v, size, ctx, stream)


def _update(signal: np.ndarray, value: Any, pe: int, ctx: Any, op: AmoOp, what: str,
            stream: Any = None) -> None:
    v = value & _MASK64 if type(value) is int else _value(value, what)
    if stream is not None and isinstance(signal, DomainArray) and \
            _streams.amo(signal, pe, op, 8, v, ctx, stream):
        return
    if stream is not None and not isinstance(signal, DomainArray):
        _streams.sync(stream)
    seg, off = _signal_word(signal, what)
    pe, t = resolve(ctx, pe)
    segment_route(t, seg).amo(pe, seg, off, op, 8, v, 0, False)


def signal_add(signal: np.ndarray, value: int, pe: int, ctx: Any = None, *,
               stream: Any = None) -> None:
    """Atomically add ``value`` (modulo 2**64) to ``signal`` on ``pe`` (OpenSHMEM 1.6).
    Unordered with respect to earlier puts unless a ``fence`` separates them (on a
    ``stream``: ordered after the stream's earlier work)."""
    _update(signal, value, pe, ctx, AmoOp.ADD, "signal_add", stream)


def signal_set(signal: np.ndarray, value: int, pe: int, ctx: Any = None, *,
               stream: Any = None) -> None:
    """Atomically set ``signal`` on ``pe`` to ``value`` (modulo 2**64) (OpenSHMEM 1.6).
    Unordered with respect to earlier puts unless a ``fence`` separates them (on a
    ``stream``: ordered after the stream's earlier work)."""
    _update(signal, value, pe, ctx, AmoOp.SET, "signal_set", stream)


def signal_fetch(signal: np.ndarray) -> int:
    """The value of this PE's ``signal``, read atomically (an int in ``[0, 2**64)``). Data
    delivered before the signal (``put_signal``) is visible to reads after this one."""
    return _read(signal, "signal_fetch")


def signal_wait_until(signal: np.ndarray, cmp: Any, value: int, *,
                      stream: Any = None) -> int | None:
    """Block until this PE's ``signal`` satisfies ``signal cmp value`` (unsigned 64-bit
    comparison, ``cmp`` as for ``wait_until``); return the signal value that satisfied it.
    Honours ``VKSHMEM_WAIT_TIMEOUT`` and Ctrl-C. Data delivered before the signal is visible
    to reads after the return. With ``stream`` and a GPU signal of the cuda domain the wait is
    enqueued instead (a one-thread kernel, bounded by ``VKSHMEM_WAIT_TIMEOUT``, else
    ``VKSHMEM_GPU_TIMEOUT``; a timeout raises WaitTimeoutError at the next call given a
    stream, ``quiet``, ``barrier_all`` or finalize): the stream's later work sees the data, and
    None is returned."""
    f = cmp_function(cmp)
    v = value & _MASK64 if type(value) is int else _value(value, "signal_wait_until")
    if stream is not None and _streams.wait(signal, _CMP_CODES[f], v, stream):
        return None
    seen = _read(signal, "signal_wait_until")
    if f(seen, v):
        return seen
    rt = state.rt
    seg, off = _signal_word(signal, "signal_wait_until")
    what = f"signal_wait_until(signal {cmp} {v})"
    box = [seen]
    heap = state.seg_heaps[seg]
    addr = heap.watch_address(off) if heap is not None \
        else int(lib.vk_peer_base(seg, rt.my_pe)) + off
    if not addr:  # device memory the CPU cannot watch: poll copies of it
        assert heap is not None
        snap = np.zeros(1, np.uint64)

        def poll() -> bool:
            box[0] = int(snap[0])
            return bool(f(box[0], v))

        heap.wait(poll, off, memoryview(snap).cast("B"), what)
        return box[0]
    amo = lib.vk_amo

    def pred() -> bool:
        box[0] = int(amo(addr, _FETCH, 8, 0, 0))  # seq-cst: later reads stay after it
        return bool(f(box[0], v))

    rt.waiter.wait(pred, addr, 8, what)
    return box[0]


# The shm path of a plain signal array of the host heap runs in C (vkshmem.core.fast);
# everything else, and every error, takes the Python functions above.
_SIGOP_CODES = {k: int(v) for k, v in _SIGOPS.items()}
put_signal = entry("put_signal", put_signal, opmap=_SIGOP_CODES)
put_signal_nbi = entry("put_signal", put_signal_nbi, opmap=_SIGOP_CODES)
signal_add = entry("signal_update", signal_add, op=AmoOp.ADD)
signal_set = entry("signal_update", signal_set, op=AmoOp.SET)
signal_fetch = entry("signal_fetch", signal_fetch)
signal_wait_until = entry("signal_wait", signal_wait_until, opmap=cmp_codes())
