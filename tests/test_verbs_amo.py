"""The verbs transport's AMO scheme, without a device: the plan of every (op, width, offset),
the 8-byte arithmetic of the compare-and-swap emulation, and the emulation loop itself
(``vkv_amo_run``, the function the device path runs) driven under contention by threads
against a CPU model of the NIC's two atomics (``vkv_cpu_nic``: fetch-and-add and
compare-and-swap with CPU atomics on one 8-byte word)."""

from __future__ import annotations

import random
import struct
import threading

import pytest

from vkshmem.core.transports.contract import AmoOp

pytest.importorskip("vkshmem_verbs")
from vkshmem_verbs._transport import amo_table
from vkshmem_verbs._verbs import ffi, lib

from vkshmem.testing import transport as contract

pytestmark = pytest.mark.timeout(120)
NIC = ffi.cast("vkv_nic_fn", lib.vkv_cpu_nic_address())
M32 = 0xFFFFFFFF


def run(word, op: AmoOp, width: int, offset: int, operand: int, compare: int = 0) -> int:  # type: ignore[no-untyped-def]
    out = ffi.new("uint64_t *")
    rc = lib.vkv_amo_run(NIC, word, int(op), width, offset * 8, operand, compare, out)
    assert rc == 0
    return int(out[0])


def test_the_capability_table() -> None:
    table = amo_table()
    assert len(table) == 8 * 3
    native = {k: v for k, v in table.items() if v != "compare-swap loop"}
    assert native == {
        ("fetch", 8, 0): "nic fetch-add", ("fetch", 4, 0): "nic fetch-add",
        ("fetch", 4, 4): "nic fetch-add", ("add", 8, 0): "nic fetch-add",
        ("add", 4, 4): "nic fetch-add",  # the upper half: its carry leaves the 8 bytes
        ("cswap", 8, 0): "nic compare-swap",
    }
    ca, sw = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    assert lib.vkv_amo_plan(int(AmoOp.ADD), 4, 32, 5, 0, ca, sw) == lib.VKV_PLAN_FAA
    assert ca[0] == 5 << 32
    assert lib.vkv_amo_plan(int(AmoOp.CSWAP), 8, 0, 9, 4, ca, sw) == lib.VKV_PLAN_CAS
    assert (ca[0], sw[0]) == (4, 9)
    for bad in ((8, 8, 0), (4, 16, 0), (2, 0, 0), (8, 0, 8)):  # op, width, shift
        assert lib.vkv_amo_plan(*bad, 0, 0, ca, sw) == lib.VK_ST_AMO


@pytest.mark.parametrize("op", list(AmoOp))
def test_the_8_byte_arithmetic_matches_the_model(op: AmoOp) -> None:
    rng = random.Random(int(op))
    old = ffi.new("uint64_t *")
    for width, shift in ((8, 0), (4, 0), (4, 32)):
        mask = (1 << 8 * width) - 1
        for _ in range(200):
            word, operand = rng.getrandbits(64), rng.getrandbits(64)
            cur = (word >> shift) & mask
            compare = cur if rng.random() < 0.5 else rng.getrandbits(64)
            new = lib.vkv_amo_apply(int(op), width, shift, word, operand, compare, old)
            assert old[0] == cur
            want = contract.amo_model(op, width, cur, operand, compare)
            assert (new >> shift) & mask == want
            assert new & ~(mask << shift) == word & ~(mask << shift)  # the other half untouched


@pytest.mark.parametrize("op", list(AmoOp))
@pytest.mark.parametrize("width, offset", [(8, 0), (4, 0), (4, 4)])
def test_every_op_through_the_emulation_loop(op: AmoOp, width: int, offset: int) -> None:
    word = ffi.new("uint64_t *", 0x1122334455667788)
    before = int(word[0])
    mask = (1 << 8 * width) - 1
    cur = (before >> offset * 8) & mask
    for compare in (cur, cur ^ 1):
        word[0] = before
        got = run(word, op, width, offset, 0xA5A5A5A5F0F0F0F0 & mask, compare)
        assert got == cur
        after = int(word[0])
        assert (after >> offset * 8) & mask == contract.amo_model(
            op, width, cur, 0xA5A5A5A5F0F0F0F0, compare)
        assert after & ~(mask << offset * 8) == before & ~(mask << offset * 8)


def test_the_loop_is_atomic_under_contention() -> None:
    """Four threads hit one 8-byte word: 32-bit adds on its lower half (loop) and upper half
    (native fetch-add), XORs of bit patterns, and 64-bit compare-swaps that count; no update is
    lost and each half only ever sees its own updates."""
    word = ffi.new("uint64_t *", 0)
    per = 3000
    cswaps = [0]
    lock = threading.Lock()

    def low() -> None:
        for _ in range(per):
            run(word, AmoOp.ADD, 4, 0, 1)
            run(word, AmoOp.XOR, 4, 0, 0x10000)  # bit 16: toggled an even number of times

    def high() -> None:
        for _ in range(per):
            run(word, AmoOp.ADD, 4, 4, 3)

    def swapper() -> None:
        n = 0
        for _ in range(per):
            old = run(word, AmoOp.FETCH, 8, 0, 0)
            if run(word, AmoOp.CSWAP, 8, 0, old + (1 << 20), old) == old:
                n += 1  # 1 << 20 into the lower half (never carries out of it here)
        with lock:
            cswaps[0] += n

    threads = [threading.Thread(target=f) for f in (low, low, high, swapper)]
    contract.run_threads(threads)
    lo, hi = struct.unpack("<II", struct.pack("<Q", int(word[0])))
    assert hi == 3 * per
    assert lo == 2 * per + (cswaps[0] << 20)
    assert cswaps[0] > 0
