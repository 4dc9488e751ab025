"""put/get/AMOs/quiet/fence over the ofi transport through the core's compiled hot path, which
calls the transport's C data path (``OfiTransport.native_ops``, csrc/vko_native.c): the
results are checked, and so is the path itself: the transport's Python put/get/amo are not
called during the operations while its ``native_calls`` count grows by at least one per
operation. Run with ``VKSHMEM_SHM=0`` and the ofi transport (any provider; the rail option
``emulate=`` makes the provider-lacks-the-AMO fallback run under the same calls)."""

from __future__ import annotations

import os

import numpy as np
from _common import check, data

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
rt = shmem._state.rt
t = rt.routing.route_transport[right]
check(t.spec.name == "ofi" and t.native_ops() != 0, f"route to PE {right}: {t.spec.name}")
python_calls = {"put": 0, "get": 0, "amo": 0}
emulated_in_c = [0]  # AMOs the C path ran as compare-and-swap loops, in the sections


def counted(name: str) -> None:
    """Count calls of the transport's Python method ``name`` (instance attribute)."""
    method = getattr(t, name)

    def call(*args: object, **kw: object) -> object:
        python_calls[name] += 1
        return method(*args, **kw)

    setattr(t, name, call)


for name in python_calls:
    counted(name)


def native_section(what: str, ops: int) -> object:
    """A context manager: the body's ``ops`` operations ran in C, none through Python."""

    class Section:
        def __enter__(self) -> None:
            shmem.barrier_all()
            st = t.stats()
            self.calls, self.emulated = st["native_calls"], st["emulated_amos"]
            python_calls.update(dict.fromkeys(python_calls, 0))

        def __exit__(self, *exc: object) -> None:
            if exc[0] is None:
                st = t.stats()
                got = st["native_calls"] - self.calls
                emulated_in_c[0] += st["emulated_amos"] - self.emulated
                check(got >= ops, f"{what}: {got} native calls for {ops} operations")
                check(not any(python_calls.values()), f"{what}: Python path {python_calls}")
            shmem.barrier_all()

    return Section()


# -- put / get (small: copied and posted with the GIL held; large: blocking, GIL released) --
for size in (1, 8, 256, 257, 70_000):
    src = data(np.int64, size, seed=1000 * me + size)
    dst = shmem.zeros(size, np.int64)
    back = np.zeros(size, np.int64)
    with native_section(f"put/get {size}", 2):
        shmem.put(dst, src, right)
        shmem.quiet()
        shmem.get(back, dst, right)
    check(np.array_equal(back, src), f"put+get {size} elements to PE {right}")
    check(np.array_equal(dst, data(np.int64, size, seed=1000 * left + size)),
          f"put {size} elements from PE {left}")
    with native_section(f"put_nbi/get_nbi {size}", 2):
        shmem.put_nbi(dst, src[::-1].copy(), right)
        shmem.quiet()
        shmem.get_nbi(back, dst, right)
        shmem.quiet()
    check(np.array_equal(back, src[::-1]), f"put_nbi+get_nbi {size}")
    shmem.free(dst)

# -- fence orders puts to one PE: the flag is seen only after the data --
payload = shmem.zeros(64, np.int64)
flag = shmem.zeros(1, np.int64)
with native_section("put, fence, put", 3):
    shmem.put(payload, np.full(64, me + 1, np.int64), right)
    shmem.fence()
    shmem.put(flag, np.ones(1, np.int64), right)
shmem.wait_until(flag, shmem.CMP.EQ, 1)
check(np.all(payload == left + 1), "fenced payload")

# -- AMOs: contention on PE 0's words, neighbours' words, every op and width --
ROUNDS = 100
for dt in (np.int32, np.int64, np.uint32, np.uint64):
    ctr = shmem.zeros(1, dt)
    ops = 3 * ROUNDS if me != 0 else 0  # PE 0's own word: the core's CPU atomic
    with native_section(f"fetch_inc/inc/add {np.dtype(dt)}", ops):
        seen = [shmem.atomic_fetch_inc(ctr, 0) for _ in range(ROUNDS)]
        for _ in range(ROUNDS):
            shmem.atomic_inc(ctr, 0)
            shmem.atomic_add(ctr, 2, 0)
        shmem.quiet()
    check(len(set(seen)) == ROUNDS, f"fetch_inc {np.dtype(dt)}: repeated values")
    if me == 0:
        check(int(ctr[0]) == 4 * ROUNDS * n, f"counter {np.dtype(dt)}: {ctr[0]}")
    word = shmem.zeros(1, dt)
    top = int(np.array([1 << (8 * np.dtype(dt).itemsize - 1)], np.uint64).astype(dt)[0])
    shmem.barrier_all()
    with native_section(f"set/fetch/or/and/xor/swap/cswap {np.dtype(dt)}", 10 if n > 1 else 0):
        shmem.atomic_set(word, 6, right)  # only this PE touches its right neighbour's word
        check(shmem.atomic_fetch(word, right) == 6, "set/fetch")
        check(shmem.atomic_fetch_or(word, 1, right) == 6, "fetch_or")
        shmem.atomic_and(word, 5, right)
        check(shmem.atomic_fetch_xor(word, 3, right) == 5, "fetch_and/and")
        shmem.atomic_xor(word, top, right)
        check(shmem.atomic_swap(word, 9, right) == int(np.array([6 ^ top]).astype(dt)[0]),
              "xor/swap")
        check(shmem.atomic_compare_swap(word, 1, 4, right) == 9, "cswap miss")
        check(shmem.atomic_compare_swap(word, 9, 4, right) == 9, "cswap hit")
        check(shmem.atomic_fetch_add(word, 1, right) == 4, "fetch_add")
        shmem.quiet()
    check(int(word[0]) == 5, f"{np.dtype(dt)}: neighbour's word {word[0]}")
    shmem.free(word)
    shmem.free(ctr)

st = t.stats()
if me == 0:
    print(f"emulated: {list(st['emulated'])}", flush=True)
if n > 1:  # the provider-lacks-it fallback (forced by emulate=) ran under the C path
    check(bool(st["emulated"]) == (emulated_in_c[0] > 0),
          f"emulated {st['emulated']}, {emulated_in_c[0]} compare-and-swap loops in C")
print(f"ofi native ok ({st['provider']}, {st['native_calls']} native calls, "
      f"{emulated_in_c[0]} emulated, {os.environ.get('VKSHMEM_RAIL0', '')})", flush=True)
