"""The AMO checks of the transport contract (re-exported by :mod:`vkshmem.testing.transport`).

Each drives a :class:`~vkshmem.testing.job.Job` of at least two PEs and compares every word
an AMO leaves behind with :func:`~vkshmem.testing.job.amo_model`.
"""

from __future__ import annotations

import random
import threading

from vkshmem.core._native import lib as native
from vkshmem.core.transports.contract import AmoOp

from .job import Job, amo_model, run_threads, set_word, word

__all__ = [
    "amo_fetching",
    "amo_non_fetching",
    "amo_operands_are_masked_to_the_width",
    "amos_are_atomic_across_two_rails",
    "compare_swap_success_and_failure",
    "concurrent_fetch_add_from_threads",
]


def amo_fetching(job: Job, op: AmoOp, width: int, rounds: int, set_fetches: bool = True,
                 ) -> None:
    """Fetching AMOs at random words of PE 1, from PE 0 and from PE 1 itself; a fetching SET
    returns the old word only where ``set_fetches``."""
    rng = random.Random(op * 10 + width)
    mask = (1 << (8 * width)) - 1
    mem = job.mem(1)
    for pe_from in (0, 1):  # remote, and to itself
        tr = job.t[0][pe_from]
        for _ in range(rounds):
            offset = width * rng.randrange(0, 1000)
            old = rng.getrandbits(8 * width)
            operand = rng.getrandbits(8 * width)
            compare = rng.choice([old, rng.getrandbits(8 * width)])
            set_word(mem, offset, width, old)
            got = tr.amo(1, 0, offset, op, width, operand, compare, True)
            if set_fetches or op is not AmoOp.SET:
                assert got == old
            assert word(mem, offset, width) == amo_model(op, width, old, operand, compare) & mask


def amo_non_fetching(job: Job, op: AmoOp, width: int, cases: int,
                     from_pes: tuple[int, ...], returns_zero: bool = True) -> None:
    """``cases`` non-fetching AMOs to consecutive words of PE 1 from each of ``from_pes``:
    each returns 0 (where ``returns_zero``: the contract allows anything) and all are applied
    after a quiet."""
    rng = random.Random(op * 100 + width)
    mem = job.mem(1)
    for pe_from in from_pes:
        tr = job.t[0][pe_from]
        done = []
        for i in range(cases):
            old, operand = rng.getrandbits(8 * width), rng.getrandbits(8 * width)
            set_word(mem, width * i, width, old)
            done.append((old, operand))
        for i, (_, operand) in enumerate(done):
            got = tr.amo(1, 0, width * i, op, width, operand, 0, False)
            assert got == 0 or not returns_zero
        tr.quiet()
        for i, (old, operand) in enumerate(done):
            assert word(mem, width * i, width) == amo_model(op, width, old, operand, 0)


def compare_swap_success_and_failure(job: Job, width: int) -> None:
    tr, mem = job.t[0][0], job.mem(1)
    set_word(mem, 256, width, 41)
    assert tr.amo(1, 0, 256, AmoOp.CSWAP, width, 99, 40, True) == 41  # fails
    assert word(mem, 256, width) == 41
    assert tr.amo(1, 0, 256, AmoOp.CSWAP, width, 99, 41, True) == 41  # succeeds
    assert word(mem, 256, width) == 99


def amo_operands_are_masked_to_the_width(job: Job) -> None:
    tr, mem = job.t[0][0], job.mem(1)
    set_word(mem, 0, 8, 0)
    tr.amo(1, 0, 0, AmoOp.ADD, 4, (1 << 40) + 5, 0, True)
    assert word(mem, 0, 8) == 5  # the upper word is untouched


def concurrent_fetch_add_from_threads(job: Job, threads: int, per_thread: int) -> None:
    """``threads`` threads of PE 0 race to reach PE 1 first, then fetch-add the same word: each
    value is fetched exactly once."""
    tr, mem = job.t[0][0], job.mem(1)
    set_word(mem, 512, 8, 0)
    barrier = threading.Barrier(threads)
    seen: list[int] = []

    def work() -> None:
        barrier.wait()  # all race to open the first endpoint (connection) to PE 1
        seen.extend(tr.amo(1, 0, 512, AmoOp.ADD, 8, 1, 0, True) for _ in range(per_thread))

    run_threads([threading.Thread(target=work) for _ in range(threads)])
    total = threads * per_thread
    assert word(mem, 512, 8) == total
    assert sorted(seen) == list(range(total))


def amos_are_atomic_across_two_rails(j: Job, per_thread: int, cpu_adds: int = 0) -> None:
    """Both PEs add to one word of PE 1 through both rails of a two-rail job at once (rail 1
    fetching, rail 0 not), while the core's own CPU atomics add ``cpu_adds`` more."""
    mem = j.mem(1)
    set_word(mem, 64, 8, 0)
    addr = j.segs[1][0].address + 64

    def work(rail: int, pe: int) -> None:
        for _ in range(per_thread):
            j.t[rail][pe].amo(1, 0, 64, AmoOp.ADD, 8, 1, 0, bool(rail))
        j.t[rail][pe].quiet()

    threads = [threading.Thread(target=work, args=(r, p)) for r in (0, 1) for p in (0, 1)]
    for th in threads:
        th.start()
    for _ in range(cpu_adds):  # the core's own CPU atomics on the same word, meanwhile
        native.vk_amo(addr, AmoOp.ADD, 8, 1, 0)
    for th in threads:
        th.join()
    assert word(mem, 64, 8) == 4 * per_thread + cpu_adds


