"""Property-based fuzzing (hypothesis) of the collective API: collectives (broadcast,
collect, fcollect, alltoall, reduce, scans) and allocation routines (alloc, zeros, full,
free, realloc).

Every PE draws the same examples (derandomized), so a faulty call is faulty on every PE, as
a program's would be when all its PEs run the same code: each must raise a VkshmemError
naming the problem on every PE, change no heap byte outside the target (canary words and a
whole-heap snapshot, as in fuzz_rma.py), and leave the job usable: a barrier and the next
example (a correct collective is checked against numpy; a correct allocation by the
runtime's own cross-PE allocation check) still work. Arguments that differ across PEs are
not fuzzed here: docs/errors.md says which of those are detected.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from fuzzkit import SETTINGS, Heap, check, expect_error
from hypothesis import given
from hypothesis import strategies as st

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
H = Heap(shmem)
N = 8  # elements each PE contributes
victim = H.guarded(shmem.array(np.arange(64, dtype=np.int64) + 7))
target = H.guarded(shmem.zeros(N * n, np.int64), scratch=True)
ftarget = H.guarded(shmem.zeros(N * n, np.float64), scratch=True)
freed = H.guarded(shmem.zeros(N * n, np.int64))
shmem.free(freed)
H.snapshot()

COLLS = ["broadcast", "collect", "fcollect", "alltoall", "reduce", "sum_inscan",
         "sum_exscan"]
OPS = ["sum", "prod", "max", "min", "and", "or", "xor"]
FAULTS = ["local", "freed", "dtype", "readonly", "noncontig", "not_array", "size_range",
          "size_type", "root_range", "root_type", "team_type", "team_invalid", "op_name",
          "op_dtype", "object"]
NAMES = {"local": ["not in the symmetric heap"], "freed": ["freed"],
         "dtype": ["dtype mismatch"], "readonly": ["read-only"],
         "noncontig": ["contiguous"], "not_array": ["numpy array"],
         "size_range": ["larger than", ">= 0", "do not fit", "fit"],
         "size_type": ["size must be an integer"], "root_range": ["root"],
         "root_type": ["root must be an integer"], "team_type": ["shmem.Team"],
         "team_invalid": ["TEAM_INVALID"], "op_name": ["unknown reduction op"],
         "op_dtype": ["not defined for dtype"], "object": ["Python objects", "dtype"]}


def source_of(pe: int, dtype: Any = np.int64) -> np.ndarray:
    return (np.arange(N * n, dtype=np.int64) * 3 + 11 * pe + 1).astype(dtype)


def expected(name: str, op: str, root: int, cnt: int) -> np.ndarray:
    srcs = [source_of(p)[:cnt] for p in range(n)]
    if name == "broadcast":
        return srcs[root]
    if name in ("collect", "fcollect"):
        return np.concatenate(srcs)
    if name == "alltoall":
        return np.concatenate([source_of(p)[me * cnt:(me + 1) * cnt] for p in range(n)])
    if name == "sum_inscan":
        return np.sum(srcs[:me + 1], axis=0)
    if name == "sum_exscan":
        return np.sum(srcs[:me], axis=0) if me else None  # PE 0's target is undefined
    f = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
         "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
    return f.reduce(srcs)


@st.composite
def coll_case(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    name = draw(st.sampled_from(COLLS))
    fault = draw(st.sampled_from([None, *FAULTS]))
    a: dict[str, Any] = {"op": draw(st.sampled_from(OPS)), "root": draw(st.integers(0, n - 1)),
                         "size": draw(st.one_of(st.none(), st.integers(0, N)))}
    if fault == "size_range":
        a["size"] = draw(st.sampled_from([-1, N * n + 1, 2**40]))
    elif fault == "size_type":
        a["size"] = draw(st.sampled_from([1.5, "2", [1]]))
    elif fault == "root_range":
        a["root"] = draw(st.sampled_from([-1, n, 2**63]))
    elif fault == "root_type":
        a["root"] = draw(st.sampled_from([0.0, "0", None]))
    elif fault == "op_name":
        a["op"] = draw(st.sampled_from(["mul", "", None, 7]))
    elif fault == "team_type":
        a["team"] = draw(st.sampled_from(["world", 0, object()]))
    return name, fault or "", a


def _fault_applies(name: str, fault: str, a: dict[str, Any]) -> bool:
    if fault in ("root_range", "root_type"):
        return name == "broadcast"
    if fault in ("op_name", "op_dtype"):
        return name == "reduce"
    if fault == "size_range" and name == "broadcast" and a["size"] == -1:
        return True
    return True


@given(coll_case())
@SETTINGS
def test_collective(case: tuple[str, str, dict[str, Any]]) -> None:
    name, fault, a = case
    if fault and not _fault_applies(name, fault, a):
        fault = ""
    op, root, size = a["op"], a["root"], a["size"]
    cnt = N if size is None else size
    if name == "alltoall":
        size = cnt = N if size is None else size  # N per PE fits both arrays
    if name in ("sum_inscan", "sum_exscan", "reduce") and fault == "" and size is None:
        cnt = N
    tgt, src = target, source_of(me)[: N if name in ("collect", "fcollect",
                                                     "broadcast") else N * n]
    if name not in ("alltoall",):
        src = src[:N]
    team = a.get("team", shmem.TEAM_WORLD)
    if fault == "team_invalid":
        team = shmem.TEAM_INVALID
    if fault == "local":
        tgt = np.zeros(N * n, np.int64)
    elif fault == "freed":
        tgt = freed
    elif fault == "dtype":
        src = src.astype(np.int32)
    elif fault == "readonly":
        tgt = target[:]
        tgt.flags.writeable = False
    elif fault == "noncontig":
        tgt = victim[::2][: N * n]
    elif fault == "not_array":
        tgt = list(range(N * n))
    elif fault == "op_dtype":
        tgt, src = ftarget, src.astype(np.float64)
        op = "and"
    elif fault == "object":
        src = src.astype(object)
    if name == "reduce" and fault != "op_dtype" and op in ("prod",):
        src = src % 3  # keep products small
    fn = getattr(shmem, name)
    if name == "broadcast":
        args: tuple[Any, ...] = (tgt, src, root, size, team)
    elif name == "reduce":
        args = (tgt, src, op, size, team)
    else:
        args = (tgt, src, size, team)
    if fault:
        expect_error(lambda: fn(*args), NAMES[fault], f"{name} with {fault}")
    else:
        shmem.barrier_all()  # every PE is done with the last example's targets
        target[:] = -1
        shmem.barrier_all()  # nobody writes a target before every PE reset its own
        fn(*args)
        want = expected(name, op, root, cnt) if name != "reduce" or op != "prod" else \
            np.prod([source_of(p)[:cnt] % 3 for p in range(n)], axis=0)
        if want is not None:
            got = target[: want.size]
            check((got == want).all(), f"{name}(op={op}, root={root}, size={size}) gave "
                                       f"{got}, numpy {want}")
    H.verify(f"{name} fault={fault or 'none'}")


ALLOC_FAULTS = {"count_neg": ["negative"], "count_type": ["must be an integer", "integers"],
                "align": ["power of two"], "domain": ["domain"], "dtype": ["data type"],
                "object": ["Python objects"], "huge": ["VKSHMEM_SYMMETRIC_SIZE"],
                "double_free": ["no live symmetric allocation"],
                "free_slice": ["no live symmetric allocation"],
                "free_local": ["not in the symmetric heap"], "fill": ["cannot fill"]}


@given(st.sampled_from([None, *ALLOC_FAULTS]), st.integers(0, 40))
@SETTINGS
def test_alloc(fault: str | None, count: int) -> None:
    if fault is None:
        a = shmem.full(count, me, np.int32)
        check((a == me).all(), "full")
        b = shmem.realloc(a, count + 3)
        check((b[:count] == me).all(), "realloc keeps the contents")
        shmem.free(b)
    else:
        fresh = shmem.zeros(count + 2, np.int64) if "free" in fault else None
        call = {"count_neg": lambda: shmem.zeros(-count - 1, np.int64),
                "count_type": lambda: shmem.alloc("x"),
                "align": lambda: shmem.zeros(count, np.int64, align=48),
                "domain": lambda: shmem.zeros(count, domain="no-such-domain"),
                "dtype": lambda: shmem.zeros(count, "no-such-dtype"),
                "object": lambda: shmem.zeros(count, object),
                "huge": lambda: shmem.zeros(2**40 + count, np.int64),
                "fill": lambda: shmem.full((count, 2), [1, 2, 3]),
                "double_free": lambda: (shmem.free(fresh), shmem.free(fresh)),
                "free_slice": lambda: shmem.free(fresh[1:]),
                "free_local": lambda: shmem.free(np.zeros(4))}[fault]
        expect_error(call, ALLOC_FAULTS[fault], f"allocation with {fault}")
        if fault in ("free_slice", "free_local"):
            shmem.free(fresh)
    probe = shmem.zeros(3, np.int64)  # the runtime compares this call across PEs
    shmem.free(probe)
    H.verify(f"allocation fault={fault or 'none'}")


test_collective()
H.allow(freed)  # allocations may take its place now
H.snapshot(tail=True)
test_alloc()
shmem.barrier_all()
H.verify("the end", final=True)
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"fuzz_coll ok: {n} PEs, {os.environ.get('FUZZ_EXAMPLES', 'default')} examples")
