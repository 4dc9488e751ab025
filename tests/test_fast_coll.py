"""The compiled alltoall(s), collect, scans, large all-reduces, iput/iget and locks
(vkshmem.core._fast): in this process as a job of one PE, each entry does the work in C for
plain numpy arrays and hands everything else, untouched, to its Python function (same errors,
pair by pair); and under the launcher at 1, 2 and 4 PEs (and 3 with a small team scratch)
tests/pe/fast_mixed.py finds the C and Python results identical, with the PEs mixing the two
in one collective."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_fast import same_error, shmem  # noqa: F401 (shmem: the fixture)
from test_multipe import MODES, check_run, launch

from vkshmem._api import lock
from vkshmem.core import fast

pytestmark = pytest.mark.timeout(300)


def test_new_paths_do_the_work_without_python(shmem: Any) -> None:  # noqa: F811
    """Spied Python functions: the fast paths call them only for what they do not take."""
    calls: list[str] = []

    def alltoall(target: Any, source: Any, size: Any = None, team: Any = None) -> None:
        calls.append("alltoall")

    def collect(target: Any, source: Any, size: Any = None, team: Any = None) -> None:
        calls.append("collect")

    def sum_exscan(target: Any, source: Any, size: Any = None, team: Any = None) -> None:
        calls.append("scan")

    def iget(target: Any, source: Any, pe: Any, tst: Any = 1, sst: Any = 1, size: Any = None,
             ctx: Any = None) -> None:
        calls.append("iget")

    def set_lock(lock: Any) -> None:
        calls.append("set_lock")

    fa, fc = fast.entry("alltoall", alltoall), fast.entry("collect", collect)
    fs, fi = fast.entry("scan", sum_exscan, op=0), fast.entry("iget", iget)
    fl = fast.entry("set_lock", set_lock, opmap=lock._LOCK_STATE)
    t = shmem.zeros(8, np.int64)
    fa(t[:4], np.arange(4, dtype=np.int64))
    fc(t[4:], np.array([9, 8], np.int64))
    assert calls == [] and t.tolist() == [0, 1, 2, 3, 9, 8, 0, 0]
    fs(t[:2], np.ones(2, np.int64))
    out = np.zeros(3, np.int64)
    fi(out, t, 0, 1, 3)
    assert calls == [] and t[:2].tolist() == [0, 0] and out.tolist() == [0, 3, 0]
    word = shmem.zeros(1, np.int64)
    fl(word)
    assert calls == [] and lock.test_lock(word) is True
    lock.clear_lock(word)
    assert lock.test_lock(word) is False and word[0] == 2 << 32 | 1 and not calls
    lock.clear_lock(word)
    fa(t[:4], t[4:])  # non-overlapping halves of one array: fine
    fa(t, t)  # overlap
    fc(t, np.ones(9, np.int64))  # does not fit
    fs(t[:2], np.ones(2, np.float16))  # a type C does not add
    fs(t[:2], np.ones(2, np.int64), team=shmem.TEAM_WORLD)  # a team
    fi(out, t, 0, 0)  # a stride below 1
    fi(out, np.zeros(8, np.int64), 0)  # not symmetric
    fl(word.view(np.int32)[:1])  # not a 64-bit word
    assert calls == ["alltoall", "collect", "scan", "scan", "iget", "iget", "set_lock"]


def test_new_paths_compute(shmem: Any) -> None:  # noqa: F811
    t = shmem.zeros(40_000, np.float64)
    src = np.arange(40_000, dtype=np.float64)
    shmem.sum_reduce(t, src)  # beyond one butterfly phase: the ring's size
    assert np.array_equal(t, src)
    shmem.sum_reduce(t[:39_999], t[1:])  # overlapping: as if the source were copied first
    assert np.array_equal(t[:39_999], src[1:])
    shmem.sum_inscan(t[:5], np.arange(5.0))
    shmem.sum_exscan(t[5:10], np.arange(5.0))
    assert t[:10].tolist() == [0, 1, 2, 3, 4, 0, 0, 0, 0, 0]
    i = shmem.zeros(8, np.int32)
    shmem.alltoalls(i, np.arange(16, dtype=np.int32), 1, 2, 8)
    assert i.tolist() == list(range(0, 16, 2))
    shmem.collect(i, i[:3])  # in place: the own block
    shmem.iput(i, np.arange(4, dtype=np.int32), 0, 2, 1, 4)
    assert i.tolist() == [0, 2, 1, 6, 2, 10, 3, 14]
    with _held_lock() as w:
        assert lock.test_lock(w) is True


class _held_lock:
    """A lock of the heap held (with the compiled set_lock) for the block."""

    def __init__(self) -> None:
        self.word = lock.new_lock()

    def __enter__(self) -> np.ndarray:
        lock.set_lock(self.word)
        return self.word

    def __exit__(self, *exc: object) -> None:
        lock.clear_lock(self.word)
        lock.del_lock(self.word)


def test_new_paths_errors_are_the_python_functions(shmem: Any) -> None:  # noqa: F811
    t = shmem.zeros(8, np.int64)
    src = np.ones(8, np.int64)
    same_error(shmem.alltoall, t, src, 9)  # does not fit
    same_error(shmem.alltoall, t, t)  # overlap
    same_error(shmem.alltoall, np.zeros(8, np.int64), src)  # not symmetric
    same_error(shmem.alltoall, t, src.astype(np.int32))
    same_error(shmem.alltoall, t, src, team="world")
    same_error(shmem.alltoalls, t, src, 1, 0)  # a stride below 1
    same_error(shmem.alltoalls, t, src, 0, 1)
    same_error(shmem.collect, t, src, 9)  # more than the source
    same_error(shmem.collect, t[:4], src)  # does not fit
    exc = same_error(shmem.collect, t, t[2:4])  # overlaps the target elsewhere (raised in C)
    assert "source overlaps target" in str(exc)
    same_error(shmem.collect, t, src, -1)
    for scan in (shmem.sum_inscan, shmem.sum_exscan):
        same_error(scan, t.view(np.bool_), src.view(np.bool_))
        same_error(scan, t, src, 9)
        same_error(scan, np.zeros(8, np.int64), src)
    big = shmem.zeros(1 << 14, np.float64)
    same_error(shmem.and_reduce, big, np.ones(1 << 14))  # not defined for floats
    same_error(shmem.sum_reduce, big, np.ones(1 << 14, np.float32))
    ro = shmem.zeros(1 << 14, np.float64)
    ro.flags.writeable = False
    same_error(shmem.sum_reduce, ro, np.ones(1 << 14))
    for fn in (shmem.iput, shmem.iget):
        same_error(fn, t, src, 1)  # no such PE
        same_error(fn, t, src, 0, 0)  # a stride below 1
        same_error(fn, t, src, 0, 1, 1, 9)  # too many elements
        same_error(fn, t, src.astype(np.float64), 0)
    same_error(shmem.iput, np.zeros(8, np.int64), src, 0)  # target not symmetric
    same_error(shmem.iget, src, np.zeros(8, np.int64), 0)  # source not symmetric
    ro8 = np.zeros(8, np.int64)
    ro8.flags.writeable = False
    same_error(shmem.iget, ro8, t, 0)
    word = lock.new_lock()
    same_error(lock.clear_lock, word)  # not held
    lock.set_lock(word)
    assert "already holds" in str(same_error(lock.set_lock, word))
    lock.clear_lock(word)
    for bad in (t.view(np.int32)[:1], t[:2], np.zeros(1, np.int64), t.view(np.float64)[:1],
                t.view(np.uint8)[4:12].view(np.int64), [0]):
        for fn in (lock.set_lock, lock.test_lock, lock.clear_lock):
            same_error(fn, bad)
    lock.del_lock(word)


def test_queued_set_lock_times_out_and_withdraws(shmem: Any,  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A ticket taken in C waits in Python: the timeout's message and the withdrawal are the
    Python path's."""
    from vkshmem._api import state

    word = lock.new_lock()
    word[0] = 1 << 32  # ticket 0 handed out, not served: held by somebody else
    monkeypatch.setattr(state.rt.waiter, "timeout", 0.05)
    with pytest.raises(Exception, match="VKSHMEM_WAIT_TIMEOUT") as exc:
        lock.set_lock(word)
    assert "ticket 1" in str(exc.value) and word[0] == 1 << 32  # withdrawn
    word[0] = 0
    lock.del_lock(word)


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_compiled_and_python_agree_across_pes(npes: int) -> None:
    check_run(launch("fast_mixed", npes, MODES["shm"], timeout=150), "fast_mixed", npes,
              "shm")


def test_compiled_and_python_agree_in_chunks() -> None:
    """64K of team scratch: every scan and reduction runs in several phases."""
    check_run(launch("fast_mixed", 3, {**MODES["shm"], "VKSHMEM_TEAM_SCRATCH": "64K"},
                     timeout=150), "fast_mixed", 3, "shm")
