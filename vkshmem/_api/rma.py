"""Put and get: contiguous (``put/get``), non-blocking (``*_nbi``) and strided (``iput/iget``).

Blocking ``put`` returns when ``source`` may be reused (remote completion needs ``quiet``);
blocking ``get`` returns with ``target`` filled. Elements move in memory order; a local buffer
that is not contiguous is gathered/scattered through a temporary.

``put``, ``get`` and their ``_nbi`` forms take ``stream=`` (keyword-only): a CUDA stream (an
int handle, a torch or CuPy stream, a cuda.bindings ``CUstream``, an object with
``__cuda_stream__``) or any object with ``synchronize()``. The call is then ordered on that
stream: enqueued and returning at once where the memory domain can (:mod:`.streams`: GPU arrays
of the cuda domain, the peer's heap mapped here, host memory pinned), otherwise the stream is
synchronized and the blocking call made. ``stream=None`` (the default) is the blocking call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core._native import ffi, lib
from ..core.elements import count_of, element_count, host_copy
from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.fast import entry
from . import state
from . import streams as _streams
from .args import (
    ND,
    DomainArray,
    check_pe,
    contiguous,
    foreign,
    locate,
    place,
    resolve,
    same_dtype,
    segment_route,
)

__all__ = ["get", "get_nbi", "iget", "iput", "put", "put_nbi"]


def _sym(a: np.ndarray, nbytes: int, what: str) -> tuple[int, int]:
    if isinstance(a, DomainArray):
        return locate(a, nbytes, what)
    c = a if a.flags.c_contiguous else contiguous(a)
    return locate(a if c is None else c, nbytes, what)


def _src_bytes(source: np.ndarray, n: int, nbytes: int) -> memoryview:
    c = source if source.flags.c_contiguous else contiguous(source)
    if c is None:
        c = np.ascontiguousarray(source.reshape(-1)[:n])
    mv = memoryview(c).cast("B")
    return mv if mv.nbytes == nbytes else mv[:nbytes]


def _dst_bytes(target: np.ndarray, nbytes: int) -> memoryview | None:
    if not target.flags.writeable:
        raise InvalidArgumentError("get target is read-only")
    c = target if target.flags.c_contiguous else contiguous(target)
    if c is None:
        return None
    mv = memoryview(c).cast("B")
    return mv if mv.nbytes == nbytes else mv[:nbytes]


def put(target: np.ndarray, source: np.ndarray, pe: int, size: int | None = None,
        ctx: Any = None, *, stream: Any = None) -> None:
    """Copy ``size`` elements (default: the shorter array) of local ``source`` into symmetric
    ``target`` on ``pe``. Returns when ``source`` may be reused; ``quiet`` completes it. With
    ``stream``, ``source`` must not change before the stream has run the copy."""
    if stream is not None and _streams.rma(True, target, source, pe, size, ctx, stream):
        return
    rt = state.rt
    tt = type(target)
    if tt is not ND and ctx is None and size is None and isinstance(target, DomainArray):
        st = type(source)
        if st is tt and target.domain is source.domain:
            _within(target, source, pe, True)  # two arrays of one domain: its own copy
            return
        if st is ND and source.flags.c_contiguous:
            _host_side(target, source, pe, True)  # host bytes: the domain heap's put
            return
    dt = same_dtype(target, source)
    n = count_of(target, source, size)
    nbytes = n * dt.itemsize
    pe, t = resolve(ctx, pe)
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _put_device(target, source, pe, t, n, nbytes)
        return
    routing = rt.routing
    if t is routing.shm and target.flags.c_contiguous and source.flags.c_contiguous and \
            lib.vk_direct_put(ffi.from_buffer(target), ffi.from_buffer(source), nbytes, pe) == 0:
        return  # the shm fast path: one native call
    seg, off = _sym(target, nbytes, "put target")
    heap = state.seg_heaps[seg] if seg else None
    if heap is not None:  # a domain's CPU-addressable segment
        t = heap
    elif nbytes >= routing.stripe_threshold and ctx is None and routing.stripes[pe] is not None:
        routing.striped_put(pe, seg, off, _src_bytes(source, n, nbytes))
        return
    t.put(pe, seg, off, _src_bytes(source, n, nbytes))


def put_nbi(target: np.ndarray, source: np.ndarray, pe: int, size: int | None = None,
            ctx: Any = None, *, stream: Any = None) -> None:
    """Start a put; ``source`` must not change before the next ``quiet`` (with ``stream``:
    before the stream has run it, as for ``put``)."""
    if stream is not None and _streams.rma(True, target, source, pe, size, ctx, stream):
        return
    dt = same_dtype(target, source)
    n = count_of(target, source, size)
    nbytes = n * dt.itemsize
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        if ctx is None and _device_nbi(target, source, pe, n, nbytes, True):
            return
        put(target, source, pe, n, ctx)  # complete when it returns
        return
    seg, off = _sym(target, nbytes, "put_nbi target")
    pe, t = resolve(ctx, pe)
    segment_route(t, seg).put_nbi(pe, seg, off, _src_bytes(source, n, nbytes))


def get(target: np.ndarray, source: np.ndarray, pe: int, size: int | None = None,
        ctx: Any = None, *, stream: Any = None) -> None:
    """Copy ``size`` elements of symmetric ``source`` on ``pe`` into local ``target`` (with
    ``stream``: filled once the stream has run the copy)."""
    if stream is not None and _streams.rma(False, target, source, pe, size, ctx, stream):
        return
    rt = state.rt
    st = type(source)
    if st is not ND and ctx is None and size is None and isinstance(source, DomainArray):
        tt = type(target)
        if tt is st and target.domain is source.domain:
            _within(source, target, pe, False)
            return
        if tt is ND and target.flags.c_contiguous and target.flags.writeable:
            _host_side(source, target, pe, False)
            return
    dt = same_dtype(target, source)
    n = count_of(target, source, size)
    nbytes = n * dt.itemsize
    pe, t = resolve(ctx, pe)
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        _get_device(target, source, pe, t, n, nbytes)
        return
    flags = target.flags
    routing = rt.routing
    if t is routing.shm and flags.c_contiguous and flags.writeable and source.flags.c_contiguous \
            and lib.vk_direct_get(ffi.from_buffer(target, require_writable=True),
                                  ffi.from_buffer(source), nbytes, pe) == 0:
        return  # the shm fast path: one native call
    seg, off = _sym(source, nbytes, "get source")
    heap = state.seg_heaps[seg] if seg else None
    if heap is not None:  # a domain's CPU-addressable segment
        t = heap
    dst = _dst_bytes(target, nbytes)
    if dst is not None:
        if nbytes >= routing.stripe_threshold and ctx is None and routing.stripes[pe] is not None \
                and heap is None:
            routing.striped_get(pe, seg, off, dst)
        else:
            t.get(pe, seg, off, dst)
        return
    tmp = np.empty(n, dt)
    t.get(pe, seg, off, memoryview(tmp).cast("B"))
    target.flat[:n] = tmp


def get_nbi(target: np.ndarray, source: np.ndarray, pe: int, size: int | None = None,
            ctx: Any = None, *, stream: Any = None) -> None:
    """Start a get; ``target`` is filled by the next ``quiet`` (a non-contiguous ``target``
    is filled before this returns; with ``stream``: once the stream has run it)."""
    if stream is not None and _streams.rma(False, target, source, pe, size, ctx, stream):
        return
    dt = same_dtype(target, source)
    n = count_of(target, source, size)
    nbytes = n * dt.itemsize
    if (type(target) is not ND or type(source) is not ND) and foreign(target, source):
        if ctx is None and _device_nbi(source, target, pe, n, nbytes, False):
            return
        get(target, source, pe, n, ctx)
        return
    seg, off = _sym(source, nbytes, "get_nbi source")
    pe, t = resolve(ctx, pe)
    dst = _dst_bytes(target, nbytes)
    if dst is None:
        get(target, source, pe, n)  # pe is a world PE now
        return
    segment_route(t, seg).get_nbi(pe, seg, off, dst)


# The shm hot path of plain numpy arrays runs in C (vkshmem.core.fast); everything else, and
# every error, takes the Python functions above.
put = entry("put", put)
put_nbi = entry("put", put_nbi)
get = entry("get", get)
get_nbi = entry("get", get_nbi)


def _strided_count(target: np.ndarray, source: np.ndarray, tst: int, sst: int,
                   size: int | None) -> int:
    try:
        tst, sst = int(tst.__index__()), int(sst.__index__())
    except AttributeError:
        raise InvalidTypeError(f"strides must be integers, got tst={tst!r}, sst={sst!r}") \
            from None
    if tst < 1 or sst < 1:
        raise InvalidArgumentError(f"strides must be >= 1, got tst={tst}, sst={sst}")
    tlen = -(-target.size // tst)
    slen = -(-source.size // sst)
    if size is None:
        return min(tlen, slen)
    return element_count(size, tlen, slen)


def iput(target: np.ndarray, source: np.ndarray, pe: int, tst: int = 1, sst: int = 1,
         size: int | None = None, ctx: Any = None) -> None:
    """Strided put: element ``i*sst`` of ``source`` goes to element ``i*tst`` of ``target``
    on ``pe``, for ``size`` elements."""
    rt = state.rt
    dt = same_dtype(target, source)
    n = _strided_count(target, source, tst, sst, size)
    if n == 0:
        resolve(ctx, pe)  # a bad PE is an error even when nothing moves
        _sym(target, 0, "iput target")
        return
    isz = dt.itemsize
    span = (n - 1) * tst + 1
    seg, off = _sym(target, span * isz, "iput target")
    pe, t = resolve(ctx, pe)
    t = segment_route(t, seg)
    src = np.ascontiguousarray(host_copy(source).reshape(-1)[::sst][:n])
    if tst == 1:
        t.put(pe, seg, off, memoryview(src).cast("B"))
        return
    peer = rt.peer_buffer(pe, seg) if t is state.shm else None
    if peer is not None:
        np.ndarray((n,), dt, buffer=peer, offset=off, strides=(tst * isz,))[...] = src
        return
    mv = memoryview(src).cast("B")
    for i in range(n):
        t.put(pe, seg, off + i * tst * isz, mv[i * isz:(i + 1) * isz])


def iget(target: np.ndarray, source: np.ndarray, pe: int, tst: int = 1, sst: int = 1,
         size: int | None = None, ctx: Any = None) -> None:
    """Strided get: element ``i*sst`` of symmetric ``source`` on ``pe`` goes to element
    ``i*tst`` of local ``target``, for ``size`` elements."""
    dt = same_dtype(target, source)
    n = _strided_count(target, source, tst, sst, size)
    device_target = isinstance(target, DomainArray)
    if not device_target and not target.flags.writeable:
        raise InvalidArgumentError("iget target is read-only")
    if n == 0:
        resolve(ctx, pe)  # a bad PE is an error even when nothing moves
        _sym(source, 0, "iget source")
        return
    span = (n - 1) * sst + 1
    seg, off = _sym(source, span * dt.itemsize, "iget source")
    pe, t = resolve(ctx, pe)
    tmp = np.empty(span, dt)
    segment_route(t, seg).get(pe, seg, off, memoryview(tmp).cast("B"))
    if device_target:
        _scatter_device(target, tmp[::sst], tst)
    else:
        target.flat[0:(n - 1) * tst + 1:tst] = tmp[::sst]


# The shm hot path of plain, contiguous numpy arrays runs in C (vkshmem.core.fast);
# everything else, and every error, takes the Python functions above.
iput = entry("iput", iput)
iget = entry("iget", iget)


# The default context's put/get between a domain's array and a local array (the shorter
# length): the general path's checks, inline, then one call of the domain heap.

def _checked(remote: Any, local: Any, pe: int, is_put: bool) -> tuple[Any, int, int]:
    """``(heap, world PE, bytes)`` of a put (``is_put``) into or a get from ``remote``."""
    dt = remote.dtype
    if local.dtype != dt:
        same_dtype(remote, local) if is_put else same_dtype(local, remote)  # raises
    n = remote.size if remote.size < local.size else local.size
    pe = check_pe(pe)
    rt = state.rt
    if rt.liveness.any:
        rt.liveness.check(pe, f"operation on PE {pe}")
    heap = state.domain_heaps.get(remote.domain)
    nbytes = n * dt.itemsize
    if heap is None or remote.offset + nbytes > heap.size:
        place(remote, nbytes, "put target" if is_put else "get source")  # raises
    return heap, pe, nbytes


def _within(remote: Any, local: Any, pe: int, is_put: bool) -> None:
    """Between two arrays of one domain: the domain's device copy."""
    heap, pe, nbytes = _checked(remote, local, pe, is_put)
    loff = local.offset
    if loff + nbytes > heap.size:
        place(local, nbytes, "put source" if is_put else "get target")  # raises
    if is_put:
        heap.transfers.put_device(pe, remote.offset, loff, nbytes)
    else:
        heap.transfers.get_device(pe, remote.offset, loff, nbytes)


def _host_side(remote: Any, local: np.ndarray, pe: int, is_put: bool) -> None:
    """Between a domain's array and a C-contiguous numpy array (writable for a get)."""
    heap, pe, nbytes = _checked(remote, local, pe, is_put)
    mv = memoryview(local).cast("B")
    if mv.nbytes != nbytes:
        mv = mv[:nbytes]
    if is_put:
        heap.put(pe, heap.seg_id, remote.offset, mv)
    else:
        heap.get(pe, heap.seg_id, remote.offset, mv)


def _put_device(target: Any, source: Any, pe: int, t: Any, n: int, nbytes: int) -> None:
    """put with a domain's array on either side (``pe`` a world PE, ``t`` its endpoint)."""
    if not isinstance(target, DomainArray):  # device -> host: read locally, then a host put
        seg, off = _sym(target, nbytes, "put target")
        segment_route(t, seg).put(pe, seg, off,
                                  memoryview(source.ravel()[:n].to_numpy()).cast("B"))
        return
    heap, off = place(target, nbytes, "put target")
    if isinstance(source, DomainArray) and source.domain is target.domain:
        heap.transfers.put_device(pe, off, place(source, nbytes, "put source")[1], nbytes)
    else:
        heap.put(pe, heap.seg_id, off, _src_bytes(host_copy(source), n, nbytes))


def _get_device(target: Any, source: Any, pe: int, t: Any, n: int, nbytes: int) -> None:
    """get with a domain's array on either side (``pe`` a world PE, ``t`` its endpoint)."""
    if not isinstance(source, DomainArray):  # host -> device: a host get, then a local write
        seg, off = _sym(source, nbytes, "get source")
        tmp = np.empty(n, source.dtype)
        segment_route(t, seg).get(pe, seg, off, memoryview(tmp).cast("B"))
        target.ravel()[:n].copy_from(tmp)
        return
    heap, off = place(source, nbytes, "get source")
    seg = heap.seg_id
    if isinstance(target, DomainArray):
        if target.domain is source.domain:
            heap.transfers.get_device(pe, off, place(target, nbytes, "get target")[1], nbytes)
            return
        tmp = np.empty(n, source.dtype)
        heap.get(pe, seg, off, memoryview(tmp).cast("B"))
        target.ravel()[:n].copy_from(tmp)
        return
    dst = _dst_bytes(target, nbytes)
    if dst is not None:
        heap.get(pe, seg, off, dst)
        return
    tmp = np.empty(n, source.dtype)
    heap.get(pe, seg, off, memoryview(tmp).cast("B"))
    target.flat[:n] = tmp


def _device_nbi(remote: Any, local: Any, pe: int, n: int, nbytes: int, is_put: bool) -> bool:
    """Start a put (``is_put``) or get between ``remote`` (symmetric, on ``pe``) and ``local``
    where one of them is a domain's array and the domain may batch it (completed by
    ``quiet``): both arrays of one domain, or a domain's ``remote`` and a contiguous host
    ``local``. False when neither applies (the caller does it blocking)."""
    if not isinstance(remote, DomainArray):
        return False
    pe, _t = resolve(None, pe)
    heap, off = place(remote, nbytes, "put_nbi target" if is_put else "get_nbi source")
    if isinstance(local, DomainArray):
        if local.domain is not remote.domain:
            return False
        loc = place(local, nbytes, "put_nbi source" if is_put else "get_nbi target")[1]
        xfer = heap.transfers
        (xfer.put_device_nbi if is_put else xfer.get_device_nbi)(pe, off, loc, nbytes)
        return True
    if not isinstance(local, np.ndarray):
        return False
    if is_put:
        heap.put_nbi(pe, heap.seg_id, off, _src_bytes(local, n, nbytes))
        return True
    dst = _dst_bytes(local, nbytes)
    if dst is None:
        return False
    heap.get_nbi(pe, heap.seg_id, off, dst)
    return True


def _scatter_device(target: DomainArray, values: np.ndarray, stride: int) -> None:
    """Write ``values`` into every ``stride``-th element of local array ``target``."""
    flat = target.ravel()
    if stride == 1:
        flat[:values.size].copy_from(values)
        return
    for i, v in enumerate(values):
        flat[i * stride] = v
