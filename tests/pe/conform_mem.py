"""shmem4py 1.0 / OpenSHMEM 1.6 conformance, memory side (docs/conformance.md): fills cast as
shmem4py's, zero-size allocations and transfers, free of every kind of array an allocation
returns, the built-in exceptions shmem4py's ``except`` clauses expect, and empty wait/test sets.
"""

from __future__ import annotations

import warnings

import numpy as np
from _common import DTYPES, check

from vkshmem import InvalidArgumentError, InvalidTypeError, NotAllocatedError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt
warnings.simplefilter("ignore")  # numpy warns about the lossy casts these fills ask for


def offset(a: np.ndarray | memoryview) -> int:
    return int(shmem.ffi.cast("uintptr_t", shmem.ffi.from_buffer(a))) - rt.host.segment.address


def raises(kinds: type | tuple[type, ...], fn, *args, match: str = "", **kw) -> BaseException:
    """``fn(*args)`` raises one of ``kinds`` whose message contains ``match``."""
    try:
        fn(*args, **kw)
    except kinds as exc:
        check(match in str(exc), f"{fn.__name__}: {exc!s} lacks {match!r}")
        return exc
    check(False, f"{fn.__name__}{args} did not raise {kinds}")
    raise AssertionError  # not reached


# -- fills: the value as an array of its own dtype, cast unsafely (shmem4py's np.copyto) ----
for value, dt, want in ((-1, np.uint8, 255), (300, np.uint8, 44), (-1, np.uint64, 2**64 - 1),
                        (2.7, np.int32, 2), (-1.5, np.uint8, 255), (1 + 2j, np.float64, 1.0),
                        (70000, np.int16, 70000 - 65536), (-1, np.float16, -1.0)):
    for order in "CF":
        a = shmem.full((2, 3), value, dtype=dt, order=order)
        check(a.dtype == dt and (a == want).all(), f"full({value}, {dt.__name__}) gave {a}")
        check(a.flags.f_contiguous if order == "F" else a.flags.c_contiguous, "fill order")
        peer = np.empty_like(a)
        shmem.get(peer, a, right)  # filled before the allocation's closing barrier
        check((peer == want).all(), f"peer's full({value}, {dt.__name__}) gave {peer}")
        shmem.free(a)
for dt in DTYPES:
    for value in (-1, 255, 2.5, -3.75):
        want = np.asarray(value).astype(dt)  # numpy's unsafe cast: shmem4py's reference
        a = shmem.full(4, value, dtype=dt)
        check(np.array_equal(a, np.full(4, want)), f"full({value}, {np.dtype(dt)}) gave {a}")
        shmem.free(a)
    o = shmem.ones((2, 2), dt, order="F")
    check((o == 1).all() and o.dtype == dt, f"ones {np.dtype(dt)}")
    shmem.free(o)
check(shmem.full(1, -1).dtype == np.array(-1).dtype, "full without dtype takes the value's")
# a value numpy cannot cast at all fails before anything is allocated (no leak, no desync)
probe = shmem.zeros(1, np.int8)
start = offset(probe)
shmem.free(probe)
raises(OverflowError, shmem.full, 4, 2**70, dtype=np.uint8)
raises(ValueError, shmem.full, (2, 3), [1, 2], dtype=np.int8)  # cannot broadcast
probe = shmem.zeros(1, np.int8)
check(offset(probe) == start, "a failed fill leaked its block")
shmem.free(probe)

# -- zero-size allocations: real, distinct, symmetric, freeable --------------------------------
made = [shmem.alloc(0, hints=shmem.MALLOC_SIGNAL_REMOTE), shmem.alloc(0, 8, clear=False),
        shmem.zeros(0, hints=shmem.MALLOC_ATOMICS_REMOTE), shmem.empty(0, np.int8),
        shmem.ones(0, np.int32), shmem.full(0, 5), shmem.array([]), shmem.array(np.empty((0, 3))),
        shmem.new_array((0, 3)), shmem.new_array((3, 0), np.int16, order="F"),
        shmem.zeros((0, 0), order="F")]
check(len({offset(m) for m in made}) == len(made), "zero-size allocations share a block")
check(all(len(m) == 0 if isinstance(m, memoryview) else m.size == 0 for m in made), "sizes")
check(all(shmem.addr_accessible(m, right) for m in made if isinstance(m, np.ndarray)),
      "a zero-size array is symmetric")
check(shmem.fromalloc(made[1], dtype=np.int32).shape == (0,), "fromalloc of 0 bytes")
for m in (made[2], shmem.array(5.0)):  # a zero-size and a 0-d array: ptr keeps their shape
    view = shmem.ptr(m, me)
    check(view is None or (view.shape == m.shape and view.dtype == m.dtype), f"ptr {view!r}")
for m in made:
    shmem.free(m)
    raises(NotAllocatedError, shmem.free, m)

# -- zero-size transfers move nothing; put_signal of no data still signals --------------------
buf = shmem.full(8, 7, np.int64)
sig = shmem.new_signal()
empty = shmem.zeros(0, np.int64)
src = np.arange(8, dtype=np.int64) + 100
local = np.full(8, -5, np.int64)
shmem.put(buf, src, right, size=0)
shmem.put_nbi(buf, src, right, size=0)
shmem.get(local, buf, right, size=0)
shmem.get_nbi(local, buf, right, size=0)
shmem.iput(buf, src, right, 2, 2, size=0)
shmem.iget(local, buf, right, 2, 2, size=0)
shmem.ibput(buf, src, right, 2, 2, 1, 0)
shmem.ibget(local, buf, right, 2, 2, 1, 0)
shmem.put(empty, src[:0], right)
shmem.get(local[:0], empty, right)
shmem.put_signal(buf, src, right, sig, 3 + me, shmem.SIGNAL_SET, size=0)
shmem.fence()  # the SET lands before the ADD
shmem.put_signal_nbi(empty, src[:0], right, sig, 10, shmem.SIGNAL_ADD)
shmem.atomic_fetch_nbi(local[:1], buf[:1], right)  # a one-element op among them completes too
shmem.quiet()
check(int(local[0]) == 7 and (local[1:] == -5).all(), f"size-0 gets wrote {local}")
shmem.broadcast(buf, buf, 0, size=0)
shmem.fcollect(empty, empty)
shmem.collect(empty, empty)
shmem.alltoall(buf, src, size=0)
shmem.alltoalls(buf, src, size=0)
shmem.sum_reduce(buf, buf, size=0)
shmem.sum_inscan(empty, empty)
shmem.barrier_all()
check((buf == 7).all(), f"a size-0 transfer wrote {buf}")
check(shmem.signal_fetch(sig) == 3 + left + 10, f"signal {shmem.signal_fetch(sig)}")
shmem.del_signal(sig)

# -- free: every kind of array the allocation routines return; a second free is a KeyError ---
kinds = {
    "zeros": lambda s, o: shmem.zeros(s, np.float32, o),
    "empty": lambda s, o: shmem.empty(s, np.int16, o),
    "ones": lambda s, o: shmem.ones(s, np.uint8, o),
    "full": lambda s, o: shmem.full(s, -1, np.uint32, o),
    "new_array": lambda s, o: shmem.new_array(s, np.complex64, o, clear=False),
    "array": lambda s, o: shmem.array(np.ones(s), order=o),
}
for name, make in kinds.items():
    for shape in (5, (2, 3), (3, 1), (1, 3), (2, 2, 2), (), 0, (0, 4)):
        for order in "CF":
            a = make(shape, order)
            check(a.shape == np.empty(shape).shape, f"{name}{shape} shape")
            shmem.free(a)
            exc = raises(KeyError, shmem.free, a, match="no live symmetric allocation")
            check(isinstance(exc, NotAllocatedError) and "'" not in str(exc)[:5], str(exc))
mem = shmem.alloc(6, 8)
shmem.free(shmem.fromalloc(mem, (2, 3), np.float64, order="F"))  # the view fromalloc gave
raises(KeyError, shmem.free, mem)
mem = shmem.alloc(6, 8)
shmem.free(mem)
raises(KeyError, shmem.free, mem)
raises(KeyError, shmem.del_array, shmem.fromalloc(mem, dtype=np.int8))
g = shmem.realloc(shmem.zeros((2, 3), np.int64, order="F"), 12)
check(g.shape == (12,) and not g[:6].any(), "realloc of a Fortran array")
shmem.free(g)
raises(KeyError, shmem.realloc, g, 4)
a = shmem.zeros(10)
raises(NotAllocatedError, shmem.free, a[1:])  # a slice does not start the allocation
exc = raises(InvalidArgumentError, shmem.free, a[::2], match="strided view")
check(not isinstance(exc, KeyError), "a strided view is a ValueError, not a KeyError")
raises(TypeError, shmem.free, [1, 2])
if me == 0:  # free(None) does nothing: were it collective, the next allocation would not match
    shmem.free(None)
shmem.free(a)

# -- the built-in exceptions shmem4py's except clauses expect ----------------------------------
w = shmem.zeros(4, np.int64)
raises(TypeError, shmem.put, [1, 2], src, right)
raises(InvalidTypeError, shmem.get, local, "abc", right)
raises(TypeError, shmem.put, w, src[:4], 1.5)
raises(TypeError, shmem.atomic_add, w[:1], 1.5, right)
raises(TypeError, shmem.atomic_fetch, [0], right)
raises(TypeError, shmem.wait_until, [0], shmem.CMP_EQ, 0)
raises(TypeError, shmem.broadcast, w, w, "0")
raises(ValueError, shmem.put, w, src[:4], n)
ro = np.zeros(4, np.int64)
ro.flags.writeable = False
raises(ValueError, shmem.get, ro, w, right, match="read-only")
raises(RuntimeError, shmem.TEAM_INVALID.n_pes)

# -- wait/test sets that are empty: no variables, or status excluding every one (1.6) ---------
e = shmem.zeros(0, np.int64)
none = np.empty(0, np.int64)
three = shmem.zeros(3, np.int64)
all_out = [1, 1, 1]
for ivars, status in ((e, None), (three, all_out)):
    vals = np.full(ivars.size, 99, np.int64)
    check(shmem.wait_until_all(ivars, shmem.CMP_EQ, 99, status) is None, "wait_until_all")
    check(shmem.wait_until_any(ivars, "==", 99, status) is None, "wait_until_any: None")
    check(shmem.wait_until_some(ivars, "eq", 99, status) == [], "wait_until_some: []")
    shmem.wait_until_all_vector(ivars, shmem.CMP_EQ, vals, status)
    check(shmem.wait_until_any_vector(ivars, shmem.CMP_EQ, vals, status) is None, "any_vector")
    check(shmem.wait_until_some_vector(ivars, shmem.CMP_EQ, vals, status) == [], "some_vector")
    check(shmem.test_all(ivars, shmem.CMP_EQ, 99, status) is True, "test_all of no set is True")
    check(shmem.test_any(ivars, shmem.CMP_EQ, 99, status) is None, "test_any: None")
    check(shmem.test_some(ivars, shmem.CMP_EQ, 99, status) == [], "test_some: []")
    check(shmem.test_all_vector(ivars, shmem.CMP_EQ, vals, status) is True, "all_vector")
    check(shmem.test_any_vector(ivars, shmem.CMP_EQ, vals, status) is None, "any_vector")
    check(shmem.test_some_vector(ivars, shmem.CMP_EQ, vals, status) == [], "some_vector")
check(shmem.test_some(three, shmem.CMP_EQ, 0, status=[0, 1, 0, 1]) == [0, 2], "long status")
check(shmem.test_all_vector(three, shmem.CMP_EQ, [0, 0, 0, 5]), "long values")
raises(InvalidArgumentError, shmem.test_all, three, shmem.CMP_EQ, 0, status=[0, 0])
raises(InvalidArgumentError, shmem.test, e, shmem.CMP_EQ, 0, match="one element")
raises(InvalidArgumentError, shmem.wait_until, e, shmem.CMP_EQ, 0, match="one element")
shmem.barrier_all()
shmem.atomic_set(three[1:2], 5 + me, right)  # the left neighbour sets our middle word
check(shmem.wait_until_any(three, shmem.CMP_GE, 5, status=[1, 0, 1]) == 1, "status mask")
check(int(three[1]) == 5 + left, f"the left neighbour's word {three}")
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"conform_mem ok: {n} PEs")
