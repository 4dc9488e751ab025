"""Property-based fuzzing (hypothesis) of the one-sided API on every PE: put/get (blocking,
nbi, strided), put_signal, signal_add/set and every AMO.

Each example is one call with at most one thing wrong (a PE out of range or of the wrong type,
a target outside the symmetric heap or freed, misaligned, of the wrong dtype, a size too large,
negative or not an integer, a bad stride, signal, operation, operand or context):

- a faulty call must raise a VkshmemError subclass whose message names the problem, and change
  no byte of any PE's heap (this PE compares its whole heap with a snapshot after every
  example, every PE again at the end, and canary words guard every allocation);
- a correct call must succeed, with its effect checked against a model: each PE writes only
  its own slots of the ``scratch`` array (on every PE), so it knows what they hold.

Settings: derandomized, no example database, FUZZ_EXAMPLES examples per property (every PE
draws the same examples), so a run is reproducible and bounded.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from _common import check
from fuzzkit import FAULTS_AMO, FAULTS_RMA, SETTINGS, Heap, expect_error
from hypothesis import given
from hypothesis import strategies as st

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
H = Heap(shmem)
SLOTS = 8  # scratch words each PE owns on every PE
PATTERN = np.arange(64, dtype=np.int64) * 0x0101010101 + 0x1234  # the same on every PE
victim = H.guarded(shmem.array(PATTERN))  # faulty calls aim here: it must never change
victim32 = H.guarded(shmem.array(PATTERN[:16].astype(np.int32)))
scratch = H.guarded(shmem.zeros(SLOTS * n, np.int64), scratch=True)
signal = H.guarded(shmem.new_signal(), scratch=True)
freed = H.guarded(shmem.zeros(16, np.int64))
shmem.free(freed)  # `freed` is now a dangling array
H.snapshot()
model = np.zeros((n, SLOTS), np.int64)  # what this PE's slots hold on every PE
mine = slice(me * SLOTS, (me + 1) * SLOTS)

BAD_PES = [-1, n, n + 7, -(2**63), 2**63, 2**70]
BAD_PE_TYPES = [1.0, "0", None, b"1", [0], np.float64(0)]
BAD_SIZES = [1.5, "3", [1], None]
BAD_CTX = ["ctx", 0, object()]


def heap_views(dtype: Any) -> list[Any]:
    """Symmetric views of the victim of another dtype (for dtype faults)."""
    raw = victim.view(np.uint8)
    return [raw[: 16 * np.dtype(dtype).itemsize].view(dtype)]


@st.composite
def rma_case(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    op = draw(st.sampled_from(["put", "put_nbi", "get", "get_nbi", "iput", "iget",
                               "put_signal", "put_signal_nbi"]))
    fault = draw(st.sampled_from([None, *FAULTS_RMA]))
    pe = draw(st.integers(0, n - 1))
    lo = draw(st.integers(0, SLOTS - 1))
    hi = draw(st.integers(lo, SLOTS))
    data = np.array(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=hi - lo,
                                  max_size=hi - lo)), np.int64)
    args: dict[str, Any] = {"pe": pe, "lo": lo, "hi": hi, "data": data, "size": None}
    if draw(st.booleans()):
        args["size"] = draw(st.integers(0, hi - lo))
    if fault == "pe_range":
        args["pe"] = draw(st.sampled_from(BAD_PES))
    elif fault == "pe_type":
        args["pe"] = draw(st.sampled_from(BAD_PE_TYPES))
    elif fault == "size_range":
        args["size"] = draw(st.sampled_from([hi - lo + 1, 2**40, -1]))
    elif fault == "size_type":
        args["size"] = draw(st.sampled_from(BAD_SIZES[:3]))
    elif fault == "dtype":
        args["dtype"] = draw(st.sampled_from([np.int32, np.uint64, np.float64, np.int8,
                                              np.complex128]))
    elif fault == "stride":
        args["stride"] = draw(st.sampled_from([0, -1, 1.5]))
    elif fault == "signal":
        args["signal"] = draw(st.sampled_from(["local", "int32", "two", "misaligned", "list"]))
    elif fault == "sigop":
        args["sigop"] = draw(st.sampled_from([0, 3, "set", None]))
    elif fault == "ctx":
        args["ctx"] = draw(st.sampled_from(BAD_CTX))
    elif fault == "object":
        args["object"] = True
    return op, fault or "", args


def _bad_signal(kind: str) -> Any:
    return {"local": np.zeros(1, np.uint64), "int32": victim32[:1],
            "two": victim[:2].view(np.uint64), "list": [0],
            "misaligned": victim.view(np.uint8)[4:12].view(np.uint64)}[kind]


# the words naming each fault in the error message (any one of them)
NAMES = {"pe_range": ["does not exist"], "pe_type": ["PE must be an integer"],
         "size_range": ["larger than", ">= 0"], "size_type": ["size must be an integer"],
         "dtype": ["dtype mismatch"], "local": ["not in the symmetric heap"],
         "freed": ["freed", "no live symmetric allocation"], "noncontig": ["not contiguous"],
         "readonly": ["read-only"],
         "not_array": ["numpy array", "expected numpy arrays", "uint64 array"],
         "stride": ["stride", "integer"], "signal": ["signal"],
         "sigop": ["signal operation"], "ctx": ["context", "Ctx"],
         "object": ["Python objects", "dtype mismatch"]}


@given(rma_case())
@SETTINGS
def test_rma(case: tuple[str, str, dict[str, Any]]) -> None:
    op, fault, a = case
    pe, lo, hi, size = a["pe"], a["lo"], a["hi"], a["size"]
    writes = op in ("put", "put_nbi", "iput", "put_signal", "put_signal_nbi")
    sym = scratch[mine][lo:hi]  # the symmetric side, in this PE's slots
    local = a["data"].copy() if writes else np.zeros(hi - lo, np.int64)
    if fault == "dtype":
        local = local.astype(a["dtype"])
    if fault == "object":
        local = local.astype(object)
    if fault in ("local", "freed", "noncontig", "not_array"):
        sym = {"local": np.zeros(hi - lo, np.int64), "freed": freed[lo:hi],
               "noncontig": victim[lo:lo + 2 * max(hi - lo, 2):2],
               "not_array": [0] * (hi - lo)}[fault]
        if fault == "noncontig" and op in ("iput", "iget"):
            fault = ""  # strided access is what iput/iget are for: not a fault
            sym = scratch[mine][lo:hi]
    count = (hi - lo) if size is None else size
    if fault == "freed" and count == 0:
        fault = ""  # nothing to access: an empty transfer is a no-op wherever it points
    if fault == "readonly":
        if writes:
            fault = ""
        else:
            local.flags.writeable = False
    if fault in ("stride", "signal", "sigop") and not (
            (fault == "stride" and op in ("iput", "iget"))
            or (fault != "stride" and op.startswith("put_signal"))):
        fault = ""  # the argument does not exist for this call
    kw: dict[str, Any] = {"ctx": a.get("ctx")} if fault == "ctx" else {}
    target, source = (sym, local) if writes else (local, sym)
    fn = getattr(shmem, op)
    if op in ("iput", "iget"):
        args: tuple[Any, ...] = (target, source, pe, a.get("stride", 1), 1, size)
    elif op.startswith("put_signal"):
        sig = _bad_signal(a["signal"]) if fault == "signal" else signal
        sigop = a.get("sigop", shmem.SIGNAL_ADD) if fault == "sigop" else shmem.SIGNAL_ADD
        args = (target, source, pe, sig, 1, sigop, size)
    else:
        args = (target, source, pe, size)

    def call() -> None:
        fn(*args, **kw)

    if fault:
        expect_error(call, NAMES[fault], f"{op} with {fault}")
    else:
        call()
        shmem.quiet()
        if writes:
            model[pe, lo:lo + count] = a["data"][:count]
        else:
            check((local[:count] == model[pe, lo:lo + count]).all(),
                  f"{op} from PE {pe} read {local[:count]}, the model has "
                  f"{model[pe, lo:lo + count]}")
    H.verify(f"{op} fault={fault or 'none'}")


AMOS = ["atomic_fetch", "atomic_set", "atomic_swap", "atomic_compare_swap", "atomic_inc",
        "atomic_fetch_inc", "atomic_add", "atomic_fetch_add", "atomic_and",
        "atomic_fetch_and", "atomic_or", "atomic_fetch_or", "atomic_xor", "atomic_fetch_xor",
        "atomic_op", "atomic_fetch_op", "signal_add", "signal_set"]
INT_ONLY = {"atomic_compare_swap", "atomic_inc", "atomic_fetch_inc", "atomic_add",
            "atomic_fetch_add", "atomic_and", "atomic_fetch_and", "atomic_or",
            "atomic_fetch_or", "atomic_xor", "atomic_fetch_xor"}
NO_VALUE = {"atomic_fetch", "atomic_inc", "atomic_fetch_inc"}
AMO_NAMES = {**NAMES, "width": ["32/64-bit", "needs an integer", "64-bit integer word"],
             "count": ["one element", "is one element"], "misaligned": ["aligned"],
             "operand": ["not an integer", "must be an integer", "not a real number"],
             "amo_op": ["unknown AMO"]}
M64 = (1 << 64) - 1


def _apply(name: str, old: int, value: int, cond: int, amo_op: str) -> int:
    """The new word after AMO ``name`` (two's complement 64-bit, as a signed int)."""
    if name in ("atomic_op", "atomic_fetch_op"):
        name = {"set": "atomic_set", "inc": "atomic_inc", "add": "atomic_add",
                "and": "atomic_and", "or": "atomic_or", "xor": "atomic_xor"}[amo_op]
    u, v = old & M64, value & M64
    new = {"atomic_set": v, "atomic_swap": v, "signal_set": v,
           "atomic_compare_swap": v if u == cond & M64 else u,
           "atomic_inc": u + 1, "atomic_fetch_inc": u + 1, "atomic_add": u + v,
           "atomic_fetch_add": u + v, "signal_add": u + v, "atomic_and": u & v,
           "atomic_fetch_and": u & v, "atomic_or": u | v, "atomic_fetch_or": u | v,
           "atomic_xor": u ^ v, "atomic_fetch_xor": u ^ v}.get(name, u) & M64
    return new - (1 << 64) if new >> 63 else new


@st.composite
def amo_case(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    name = draw(st.sampled_from(AMOS))
    fault = draw(st.sampled_from([None, *FAULTS_AMO]))
    a: dict[str, Any] = {"pe": draw(st.integers(0, n - 1)), "slot": draw(st.integers(0, 7)),
                         "value": draw(st.integers(-(2**63), 2**64 - 1)),
                         "cond": draw(st.integers(-(2**63), 2**63 - 1)),
                         "amo_op": draw(st.sampled_from(["set", "inc", "add", "and", "or",
                                                         "xor"]))}
    if fault == "pe_range":
        a["pe"] = draw(st.sampled_from(BAD_PES))
    elif fault == "pe_type":
        a["pe"] = draw(st.sampled_from(BAD_PE_TYPES))
    elif fault == "width":
        a["dtype"] = draw(st.sampled_from([np.int8, np.int16, np.uint8, np.float16,
                                           np.complex64, np.bool_, np.float64]))
    elif fault == "count":
        a["count"] = draw(st.sampled_from([0, 2, 5]))
    elif fault == "operand":
        a["value"] = draw(st.sampled_from([1.5, "1", None, np.float64(2.0), b"x"]))
    elif fault == "amo_op":
        a["amo_op"] = draw(st.sampled_from(["mul", 7, None, "SET ", "fetch"]))
    elif fault == "ctx":
        a["ctx"] = draw(st.sampled_from(BAD_CTX))
    return name, fault or "", a


@given(amo_case())
@SETTINGS
def test_amo(case: tuple[str, str, dict[str, Any]]) -> None:
    name, fault, a = case
    pe, slot = a["pe"], a["slot"]
    word = scratch[mine][slot:slot + 1]
    fn = getattr(shmem, name)
    signal_op = name.startswith("signal_")
    if fault == "width":
        if a["dtype"] == np.float64 and (name not in INT_ONLY and not signal_op):
            name, fn = "atomic_add", shmem.atomic_add  # fetch/set/swap work on float64
        word = victim.view(a["dtype"])[:1]
    elif fault == "count":
        word = victim[: a["count"]]
    elif fault in ("misaligned", "local", "freed"):
        word = {"misaligned": victim.view(np.uint8)[4:12].view(np.int64),
                "local": np.zeros(1, np.int64), "freed": freed[slot:slot + 1]}[fault]
    elif fault == "not_array":
        word = [0]
    if signal_op:
        word = word.view(np.uint64) if isinstance(word, np.ndarray) and \
            word.dtype == np.int64 else word
    if fault == "operand" and name in NO_VALUE:
        fault, a["value"] = "", 0  # these take no operand
    if fault == "operand" and not signal_op and name not in INT_ONLY and \
            name not in ("atomic_op", "atomic_fetch_op"):
        # fetch/set/swap take floats too: only a non-number is wrong, on a float word too
        a["value"] = "1"
        if name != "atomic_fetch":
            word = victim.view(np.float64)[:1]
    if fault == "amo_op" and name not in ("atomic_op", "atomic_fetch_op"):
        fault = ""
    value = a["value"]
    if name in ("atomic_op", "atomic_fetch_op") and a["amo_op"] == "set" and \
            fault == "operand":
        value = "1"
    kw = {"ctx": a["ctx"]} if fault == "ctx" else {}
    if name == "atomic_compare_swap":
        args: tuple[Any, ...] = (word, a["cond"], value, pe)
    elif name in NO_VALUE:
        args = (word, pe)
    elif name in ("atomic_op", "atomic_fetch_op"):
        args = (word, value, a["amo_op"], pe)
    else:
        args = (word, value, pe)
    if fault:
        expect_error(lambda: fn(*args, **kw), AMO_NAMES[fault], f"{name} with {fault}")
    else:
        old = int(model[pe, slot])
        got = fn(*args, **kw)
        new = _apply(name, old, value, a["cond"], a["amo_op"])
        model[pe, slot] = new
        if name.startswith("atomic_fetch") or name in ("atomic_swap",
                                                       "atomic_compare_swap"):
            want = old if not signal_op else old & M64
            check(got == want, f"{name} on PE {pe} returned {got}, the model has {old}")
        back = shmem.atomic_fetch(word if not signal_op else word.view(np.int64), pe)
        check(back == new, f"{name} on PE {pe} left {back}, the model says {new}")
    H.verify(f"{name} fault={fault or 'none'}")


test_rma()
test_amo()
shmem.barrier_all()  # every PE's faulty calls are done: no heap may have changed
H.verify("the end", final=True)
got = np.empty(SLOTS, np.int64)
for p in range(n):
    shmem.get(got, scratch[mine], p)
    check((got == model[p]).all(), f"my slots on PE {p}: {got} != model {model[p]}")
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"fuzz_rma ok: {n} PEs, {os.environ.get('FUZZ_EXAMPLES', 'default')} examples")
