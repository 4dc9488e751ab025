"""Calls before ``init`` and after ``finalize``: every public function of ``vkshmem.shmem`` that
needs the runtime raises a VkshmemError saying so.

Each function is called first with well-formed arguments (the message must say that vkshmem
is not initialised), then with arguments hypothesis draws per parameter (any VkshmemError is
right: an argument error may come first; any other exception, a hang or a crash is wrong).
Then init, a symmetric array, finalize, the same again, init once more, and the array of the
finalized runtime must be refused by the new one. Run with ``VKSHMEM_AUTO_INIT=0``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from fuzzkit import SETTINGS, check, expect_error
from hypothesis import given
from hypothesis import strategies as st

from vkshmem import VkshmemError, shmem

assert os.environ.get("VKSHMEM_AUTO_INIT") == "0", "run with VKSHMEM_AUTO_INIT=0"

#: callable without a runtime, by design (queries of the library, pure helpers, init itself)
NO_RUNTIME = {"init", "init_thread", "finalize", "query_initialized", "query_thread",
              "info_get_name", "info_get_version", "pcontrol", "global_exit", "fromalloc",
              "gpu_kernel", "offset_of", "pack_push"}
FUNCS = sorted(n for n in shmem.__all__ if callable(getattr(shmem, n))
               and not isinstance(getattr(shmem, n), type) and n not in NO_RUNTIME)
NOT_INIT = ["not initialised"]


def _params(name: str) -> list[str]:
    fn = getattr(shmem, name)
    sig = inspect.signature(getattr(fn, "__wrapped__", fn))
    return [p.name for p in sig.parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def good_value(func: str, param: str) -> Any:
    """A well-formed argument (wrong only in that nothing is initialised)."""
    if param == "signal":
        return np.zeros(1, np.uint64)
    if param in ("op",):
        return shmem.OP.SUM if func.endswith("reduce") else shmem.AMO.ADD
    return {"cmp": shmem.CMP.EQ, "sigop": shmem.SIGNAL.SET, "values": [0], "pes": [0],
            "obj": [1], "team": shmem.TEAM_WORLD, "pe": 0, "root": 0, "value": 1, "cond": 1,
            "fill_value": 1, "count": 1, "shape": 1, "tst": 1, "sst": 1, "bsize": 1,
            "nblocks": 1}.get(param, np.zeros(1, np.int64))


ARRAYS = st.sampled_from([np.zeros(1, np.int64), np.zeros(4, np.int32),
                          np.zeros(1, np.uint64), np.zeros(3, np.float32), [0], None, b"x"])
SCALARS = st.one_of(st.integers(-3, 5), st.sampled_from([None, 1.5, "x", 2**70]))
DRAWN: dict[str, st.SearchStrategy[Any]] = {
    "cmp": st.sampled_from([shmem.CMP.EQ, "ne", "bogus", 7, None]),
    "op": st.sampled_from([shmem.AMO.ADD, shmem.OP.SUM, "sum", "mul", None]),
    "sigop": st.sampled_from([shmem.SIGNAL.SET, 9, None]),
    "team": st.sampled_from([shmem.TEAM_WORLD, None, "team"]),
    "values": st.sampled_from([[0], [0, 1, 2, 3], None]),
    "pes": st.sampled_from([[0], [], None, [-1]]),
    "obj": st.sampled_from([[1], "abc", None]),
}
for _p in ("pe", "root", "value", "cond", "fill_value", "count", "shape", "tst", "sst",
           "bsize", "nblocks"):
    DRAWN[_p] = SCALARS


def call_all(phase: str) -> None:
    wrong = []
    for name in FUNCS:
        fn = getattr(shmem, name)
        args = [good_value(name, p) for p in _params(name)]
        try:
            expect_error(lambda fn=fn, args=args: fn(*args), NOT_INIT, f"{phase}: {name}")
        except AssertionError as exc:
            wrong.append(str(exc))
    check(not wrong, "\n".join(wrong))


@st.composite
def any_call(draw: st.DrawFn) -> tuple[str, list[Any]]:
    name = draw(st.sampled_from(FUNCS))
    return name, [draw(DRAWN.get(p, ARRAYS)) for p in _params(name)]


def fuzz(phase: str) -> Callable[[], None]:
    @given(any_call())
    @SETTINGS
    def run(case: tuple[str, list[Any]]) -> None:
        name, args = case
        fn = getattr(shmem, name)
        try:
            fn(*args)
        except VkshmemError:
            return
        except Exception as exc:
            raise AssertionError(f"{phase}: {name}{tuple(args)} raised {type(exc).__name__}"
                                 f"({exc}), not a VkshmemError") from exc
        if name in ("free", "del_array", "del_signal") and args[0] is None:
            return  # freeing nothing (C's NULL) is a no-op, with or without a runtime
        raise AssertionError(f"{phase}: {name}{tuple(args)} did not raise")

    return run


check(not shmem.query_initialized(), "not initialised at first")
call_all("before init")
fuzz("before init")()
shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
old = shmem.zeros(4, np.int64)
shmem.put(old[:1], np.ones(1, np.int64), (me + 1) % n)
shmem.barrier_all()
check(old[0] == 1, "a put in the first runtime")
shmem.finalize()
check(not shmem.query_initialized(), "not initialised after finalize")
call_all("after finalize")
fuzz("after finalize")()
expect_error(lambda: shmem.put(old, np.ones(4, np.int64), 0), NOT_INIT, "put after finalize")
shmem.init()
new = shmem.zeros(4, np.int64)  # the new runtime's first allocation
expect_error(lambda: shmem.put(old, np.ones(4, np.int64), (me + 1) % n),
             ["not in the symmetric heap", "no live symmetric allocation"],
             "a put to an array of the finalized runtime")
shmem.barrier_all()
check(not new.any(), "the refused put changed nothing")
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"fuzz_lifecycle ok: {n} PEs")
shmem.finalize()
