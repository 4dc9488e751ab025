"""The set-wide tests and waits (``test_any/_some/_all`` and ``wait_until_any/_some/_all``,
with their ``_vector`` forms) on the compiled path (fast_wait.c's fast_wait_set), in this
process as a job of one PE: each gives what its Python function gives, for every integer
type, comparison, status form and value form, shares ``*_any``'s rotation with the Python
path, takes the Python path for what it does not handle, and raises as the Python path does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from vkshmem.core import _fast
from vkshmem.core.errors import VkshmemError

pytestmark = pytest.mark.timeout(120)

TESTS = ["test_all", "test_any", "test_some"]
WAITS = ["wait_until_all", "wait_until_any", "wait_until_some"]
CMPS = ["eq", "ne", "gt", "le", "lt", "ge"]


@pytest.fixture(scope="module")
def sync() -> Iterator[Any]:
    from vkshmem._api import alloc, lifecycle, sync

    lifecycle.init()
    sync.alloc = alloc  # type: ignore[attr-defined]
    try:
        yield sync
    finally:
        lifecycle.finalize()


def both(sync: Any, name: str, *args: Any) -> tuple[Any, Any]:
    """The entry's answer and its Python function's, from the same rotation state."""
    saved = sync._rotation.copy()
    fast = getattr(sync, name)(*args)
    after = sync._rotation.copy()
    sync._rotation[:] = saved
    py = getattr(sync, name).__wrapped__(*args)
    assert (sync._rotation == after).all(), name
    return fast, py


def test_entries_are_compiled(sync: Any) -> None:
    for name in TESTS + WAITS:
        for fn in (getattr(sync, name), getattr(sync, name + "_vector")):
            assert isinstance(fn, _fast.FastCall), fn
            assert fn.__name__ == fn.__wrapped__.__name__


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                   np.uint32, np.int64, np.uint64])
def test_same_answers_as_python(sync: Any, dtype: Any) -> None:
    rng = np.random.default_rng(int(np.dtype(dtype).num))
    arr = sync.alloc.zeros(12, dtype)
    info = np.iinfo(dtype)
    edge = [int(info.min), int(info.max), 0, 1]
    for trial in range(60):
        pool = [*edge, 2, 3]
        arr[:] = np.array([pool[i] for i in rng.integers(0, 6, 12)], dtype)
        value = pool[int(rng.integers(0, 5))]
        statuses: list[Any] = [None, [0] * 12, rng.integers(0, 2, 14).tolist(),
                               rng.integers(0, 2, 12).astype(np.int32), np.ones(12, bool),
                               tuple([1] * 11 + [0])]
        vals = [pool[i] for i in rng.integers(0, 5, 12)]
        values: list[Any] = [vals, np.array(vals, dtype), (*vals, 0)]
        cmp = CMPS[trial % 6]
        for status, v in itertools.product(statuses, values):
            for name in TESTS:
                f, p = both(sync, name, arr, cmp, value, status)
                assert f == p, (name, arr, cmp, value, status)
                f, p = both(sync, name + "_vector", arr, cmp, v, status)
                assert f == p, (name, arr, cmp, v, status)
            for name in WAITS:  # only on sets that hold (else they would wait)
                holds = sync.test_any(arr, cmp, value, status) is not None
                if sync.test_all(arr, cmp, value, status) or (name != "wait_until_all" and holds):
                    f, p = both(sync, name, arr, cmp, value, status)
                    assert f == p, (name, arr, cmp, value, status)
    sync.alloc.free(arr)


def test_rotation_is_shared_with_the_python_path(sync: Any) -> None:
    arr = sync.alloc.ones(7, np.int64)
    arr[[2, 5]] = 0
    seen = []
    for k in range(10):  # alternate the compiled and the Python path
        fn = sync.test_any if k % 2 else sync.test_any.__wrapped__
        seen.append(fn(arr, "eq", 1))
    assert seen == [0, 1, 3, 4, 6, 0, 1, 3, 4, 6]
    seen = [sync.wait_until_any_vector(arr, "eq", [1] * 7) for _ in range(5)]
    assert seen == [0, 1, 3, 4, 6]
    sync.alloc.free(arr)


def test_large_sets_and_empty_sets(sync: Any) -> None:
    arr = sync.alloc.zeros(1000, np.int32)
    arr[[3, 999]] = 5
    assert sync.test_some(arr, "eq", 5) == [3, 999]
    assert sync.test_all(arr, "ge", 0, [0] * 1000)
    assert sync.wait_until_some(arr, "gt", 0) == [3, 999]
    arr[3] = 0
    assert sync.test_any(arr, "eq", 5) == 999
    assert sync.test_any(arr, "eq", 5) == 999
    none = np.ones(1000, np.int8)
    assert sync.test_any(arr, "eq", 5, none) is None
    assert sync.test_some(arr, "eq", 5, none) == []
    assert sync.test_all(arr, "eq", 5, none) is True
    assert sync.wait_until_any(arr, "eq", 77, none) is None
    assert sync.wait_until_some(arr, "eq", 77, none) == []
    assert sync.wait_until_all(arr, "eq", 77, none) is None
    empty = arr[:0]
    assert sync.test_any(empty, "eq", 5) is None and sync.test_all(empty, "eq", 5) is True
    sync.alloc.free(arr)


def test_errors_as_the_python_path(sync: Any) -> None:
    arr = sync.alloc.zeros(4, np.int64)
    for args in ((arr, "eq", 0, [0, 0]), (arr, "bogus", 0), (np.zeros(4, np.int64), "eq", 0)):
        for name in ("test_any", "test_all", "wait_until_some"):
            fn = getattr(sync, name)
            with pytest.raises(VkshmemError) as fast_exc:
                fn(*args)
            with pytest.raises(VkshmemError) as py_exc:
                fn.__wrapped__(*args)
            assert type(fast_exc.value) is type(py_exc.value)
            assert str(fast_exc.value) == str(py_exc.value)
    with pytest.raises(VkshmemError):
        sync.test_any_vector(arr, "eq", [0, 0, 0])
    sync.alloc.free(arr)
    for name in ("test_any", "test_some", "wait_until_all"):  # freed
        with pytest.raises(VkshmemError):
            getattr(sync, name)(arr, "eq", 0)


def test_timeout(sync: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from vkshmem._api import state

    arr = sync.alloc.zeros(3, np.int64)
    monkeypatch.setattr(state.rt.waiter, "timeout", 0.05)
    for name, args in (("wait_until_any", (arr, "eq", 1)),
                       ("wait_until_all_vector", (arr, "eq", [0, 1, 0])),
                       ("wait_until_some", (arr, "gt", 0, [0, 1, 0]))):
        with pytest.raises(VkshmemError, match=name):
            getattr(sync, name)(*args)
    sync.alloc.free(arr)


def test_the_common_cases_stay_in_c(sync: Any) -> None:
    """A spied Python function: the compiled path calls it only for what it does not take."""
    from vkshmem._api.enums import cmp_codes
    from vkshmem.core import fast

    calls: list[Any] = []

    def spy(ivars: Any, cmp: Any, value: Any, status: Any = None) -> str:
        calls.append((cmp, value, status))
        return "python"

    def spy_vector(ivars: Any, cmp: Any, values: Any, status: Any = None) -> str:
        calls.append((cmp, values, status))
        return "python"

    arr = sync.alloc.ones(5, np.int32)
    for op, fn in ((0, spy), (2, spy), (8, spy), (10, spy), (4, spy_vector), (14, spy_vector)):
        e = fast.entry("wait_set", fn, op=op, opmap=cmp_codes())
        for status in (None, [0, 1, 0, 0, 0], np.zeros(5, np.int64), (1, 0, 0, 0, 0, 9)):
            for value in ([1] * 5, np.ones(5, np.int32)) if op & 4 else (1,):
                assert e(arr, "eq", value, status) != "python"
                kw = {"values" if op & 4 else "value": value}
                assert e(status=status, cmp="eq", ivars=arr, **kw) != "python"
        assert calls == []
        # what it leaves to Python: another dtype, a float value, strided, non-symmetric
        for args in ((arr.astype(np.float32), "eq", 1.0), (arr, "eq", 1.5),
                     (arr[::2], "eq", 1), (np.ones(5, np.int32), "eq", 1)):
            if op & 4:
                args = (args[0], args[1], [args[2]] * 5)
            assert e(*args) == "python"
        assert len(calls) == 4
        calls.clear()
    sync.alloc.free(arr)
