"""What the fuzzing scripts (tests/pe/fuzz_*.py) share: hypothesis settings, canary-guarded
allocations with a whole-heap snapshot, and the check that a faulty call raised the right
error."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings

from vkshmem import VkshmemError

#: Reproducible and bounded: the same examples on every run and every PE, no database.
SETTINGS = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")), deadline=None,
                    derandomize=True, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))
#: one thing wrong per example, by kind of call
FAULTS_RMA = ["pe_range", "pe_type", "size_range", "size_type", "dtype", "local", "freed",
              "noncontig", "readonly", "not_array", "stride", "signal", "sigop", "ctx",
              "object"]
FAULTS_AMO = ["pe_range", "pe_type", "width", "count", "misaligned", "local", "freed",
              "not_array", "operand", "amo_op", "ctx"]
CANARY = 0xC0DEC0DE5AFE5AFE


def me() -> int | str:
    """This PE's number (from the launcher's variable while vkshmem is not initialised)."""
    from vkshmem import shmem

    try:
        return shmem.my_pe()
    except VkshmemError:
        return os.environ.get("VKSHMEM_PE", "?")


def check(cond: object, what: str) -> None:
    """Assert with a message that names the PE (works before init and after finalize)."""
    if not cond:
        raise AssertionError(f"PE {me()}: {what}")


def expect_error(call: Callable[[], Any], names: list[str], what: str) -> VkshmemError:
    """``call()`` must raise a VkshmemError whose message contains one of ``names``."""
    try:
        call()
    except VkshmemError as exc:
        msg = str(exc)
        if not any(w in msg for w in names):
            raise AssertionError(f"PE {me()}: {what}: {type(exc).__name__}({msg!r}) names "
                                 f"none of {names}") from exc
        return exc
    except Exception as exc:
        raise AssertionError(f"PE {me()}: {what} raised {type(exc).__name__}({exc}), not a "
                             "VkshmemError") from exc
    raise AssertionError(f"PE {me()}: {what} did not raise")


class Heap:
    """This PE's host heap, guarded: allocations made with :meth:`guarded` sit between two
    canary allocations, and :meth:`verify` proves that nothing changed since
    :meth:`snapshot` but the ranges of allocations marked ``scratch``."""

    def __init__(self, shmem: Any) -> None:
        self.shmem = shmem
        self.buf = np.frombuffer(shmem._state.rt.host.segment.buffer, np.uint8)
        self.base = self.buf.__array_interface__["data"][0]
        self.guards: list[np.ndarray] = []
        self.scratch: list[tuple[int, int]] = []
        self.snap: np.ndarray | None = None
        self.mask: np.ndarray | None = None

    def guarded(self, arr_or_make: Any, scratch: bool = False) -> Any:
        """Collective: canary words, then the allocation (an array, or a function making
        one), then canary words."""
        self.guards.append(self.shmem.full(8, CANARY, np.uint64))
        arr = arr_or_make() if callable(arr_or_make) else arr_or_make
        self.guards.append(self.shmem.full(8, CANARY, np.uint64))
        if scratch:
            start = arr.__array_interface__["data"][0] - self.base
            self.scratch.append((start, start + arr.nbytes))
        return arr

    def allow(self, arr: Any) -> None:
        """Let ``arr``'s memory change from the next snapshot on (a freed array that a later
        allocation may reuse)."""
        start = arr.__array_interface__["data"][0] - self.base
        self.scratch.append((start, start + arr.nbytes))

    def snapshot(self, tail: bool = False) -> None:
        """Collective: remember the heap (after a barrier, so every PE's set-up is done);
        with ``tail``, the free space after the last guard may change (new allocations)."""
        self.shmem.barrier_all()
        self.snap = self.buf.copy()
        self.mask = np.ones(self.buf.size, bool)
        for lo, hi in self.scratch:
            self.mask[lo:hi] = False
        if tail and self.guards:
            last = self.guards[-1]
            self.mask[last.__array_interface__["data"][0] - self.base + last.nbytes:] = False

    def verify(self, what: str, final: bool = False) -> None:
        """Every canary intact, no heap byte changed outside the scratch allocations."""
        for g in self.guards:
            if not (g == CANARY).all():
                raise AssertionError(f"PE {me()}: after {what}: canary words at heap offset "
                                     f"{g.__array_interface__['data'][0] - self.base} were "
                                     f"overwritten: {g}")
        assert self.snap is not None and self.mask is not None
        changed = np.flatnonzero((self.buf != self.snap) & self.mask)
        if changed.size:
            raise AssertionError(
                f"PE {me()}: after {what}{' (all PEs done)' if final else ''}: {changed.size} "
                f"heap bytes changed outside the target, first at offset {changed[0]}")
