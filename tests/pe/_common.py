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
