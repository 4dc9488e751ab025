"""Shared helpers of the multi-PE test scripts (run under ``vkshmem run``)."""

from __future__ import annotations

import numpy as np

#: Every numeric dtype the API must move.
DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128]


def data(dtype: type, n: int, seed: int) -> np.ndarray:
    """Deterministic random data of ``dtype`` (any PE can regenerate another PE's data)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    return rng.standard_normal(n).astype(dt)


def check(cond: object, what: str) -> None:
    """Assert with a message that names the PE (the launcher reports it)."""
    if not cond:
        from vkshmem import shmem

        raise AssertionError(f"PE {shmem.my_pe()}: {what}")


def check_fetch_sees_put(domain: str, rounds: int) -> None:
    """Collective: each PE puts a word into its right neighbour's ``domain`` array, then at
    once fetches it with an AMO (which may take another path than the put: it must see it)."""
    from vkshmem import shmem

    me = shmem.my_pe()
    right = (me + 1) % shmem.n_pes()
    word = shmem.zeros(1, np.int64, domain=domain)
    for i in range(1, rounds + 1):
        shmem.put(word, np.array([i * 1000 + me], np.int64), right)
        seen = int(shmem.atomic_fetch(word, right))
        check(seen == i * 1000 + me, f"fetch after put saw {seen}, not {i * 1000 + me}")
        shmem.barrier_all()
    shmem.free(word)
