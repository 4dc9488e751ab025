"""Property-based fuzzing of the public API (hypothesis; scripts tests/pe/fuzz_*.py) under the
launcher at 1, 2 and 4 PEs: one-sided calls (fuzz_rma) over the shm path, hostproxy, and at
2 PEs UCX and libfabric over tcp; collectives and allocation (fuzz_coll); calls before init
and after finalize (fuzz_lifecycle). Faulty calls must raise a VkshmemError naming the
problem and change no heap byte (canary words, whole-heap snapshots); correct calls are
checked against a model. Derandomized, without an example database: every run draws the
same examples, FUZZ_EXAMPLES per property (fewer at 4 PEs, where 4 processes share this
machine's cores), so CI is reproducible and bounded (about a minute in all)."""

from __future__ import annotations

import pytest
from test_multipe import MODES, check_run, launch

SMALL = {"VKSHMEM_SYMMETRIC_SIZE": "4M"}  # the fuzzers snapshot the whole heap per example


def examples(npes: int) -> dict[str, str]:
    return {"FUZZ_EXAMPLES": "150" if npes < 4 else "50"}


CASES = [(npes, mode) for mode in ("shm", "hostproxy") for npes in (1, 2, 4)]


@pytest.mark.parametrize(("npes", "mode"), [*CASES, (2, "ucx-tcp"), (2, "ofi-tcp")])
def test_fuzz_rma(npes: int, mode: str) -> None:
    r = launch("fuzz_rma", npes, {**MODES[mode], **SMALL, **examples(npes)})
    check_run(r, "fuzz_rma", npes, mode)


@pytest.mark.parametrize(("npes", "mode"), CASES)
def test_fuzz_collectives(npes: int, mode: str) -> None:
    r = launch("fuzz_coll", npes, {**MODES[mode], **SMALL, **examples(npes)})
    check_run(r, "fuzz_coll", npes, mode)


@pytest.mark.parametrize(("npes", "mode"), [(1, "shm"), (2, "shm"), (4, "shm"),
                                            (2, "hostproxy")])
def test_fuzz_lifecycle(npes: int, mode: str) -> None:
    r = launch("fuzz_lifecycle", npes,
               {**MODES[mode], **SMALL, **examples(npes), "VKSHMEM_AUTO_INIT": "0"})
    check_run(r, "fuzz_lifecycle", npes, mode)


@pytest.mark.parametrize(("npes", "mode"), [(1, "shm"), (2, "shm"), (4, "shm"),
                                            (2, "hostproxy")])
def test_collective_mismatch_check(npes: int, mode: str) -> None:
    """VKSHMEM_CHECK_COLLECTIVES=1 turns arguments that differ across PEs into an error on
    every PE (tests/pe/mismatch_coll.py); the fuzzers above then pass with it on too."""
    env = {**MODES[mode], "VKSHMEM_CHECK_COLLECTIVES": "1"}
    check_run(launch("mismatch_coll", npes, env), "mismatch_coll", npes, mode)
    if npes == 2:
        r = launch("fuzz_coll", npes, {**env, **SMALL, "FUZZ_EXAMPLES": "60"})
        check_run(r, "fuzz_coll", npes, mode)
