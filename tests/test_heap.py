"""Unit tests of the deterministic allocator and the memfd host segment."""

from __future__ import annotations

import itertools
import os
import random

import pytest

from vkshmem.core.errors import HeapExhaustedError, InvalidArgumentError
from vkshmem.core.heap import MIN_ALIGN, Allocator, HostSegment


def _alloc(size: int = 1 << 20) -> Allocator:
    return Allocator(size, "host", "VKSHMEM_SYMMETRIC_SIZE")


def test_offsets_are_aligned_and_disjoint() -> None:
    a = _alloc()
    blocks = []
    for n in (1, 7, 64, 65, 1000, 0):
        off = a.alloc(n)
        assert off % MIN_ALIGN == 0
        blocks.append((off, a.block_size(off)))
    blocks.sort()
    for (o1, s1), (o2, _) in itertools.pairwise(blocks):
        assert o1 + s1 <= o2


@pytest.mark.parametrize("align", [128, 4096, 65536])
def test_requested_alignment(align: int) -> None:
    a = _alloc()
    a.alloc(100)
    assert a.alloc(10, align) % align == 0


def test_same_sequence_same_offsets() -> None:
    rng = random.Random(7)
    ops = []
    for _ in range(500):
        ops.append(("a", rng.randrange(1, 5000), rng.choice([64, 256, 4096])))
        if rng.random() < 0.4:
            ops.append(("f", rng.random(), 0))

    def run() -> list[int]:
        a, live, out = _alloc(1 << 24), [], []
        for kind, x, y in ops:
            if kind == "a":
                off = a.alloc(int(x), int(y))
                live.append(off)
                out.append(off)
            elif live:
                a.free(live.pop(int(x * len(live))))
        return out

    assert run() == run()


def test_free_coalesces_back_to_one_block() -> None:
    a = _alloc(1 << 16)
    offs = [a.alloc(1000) for _ in range(20)]
    random.Random(1).shuffle(offs)
    for off in offs:
        a.free(off)
    assert a.largest_free() == 1 << 16
    assert a.alloc((1 << 16) - 64) == 0


def test_exhaustion_names_sizes_and_variable() -> None:
    a = _alloc(4096)
    a.alloc(1024)
    with pytest.raises(HeapExhaustedError) as info:
        a.alloc(8192)
    msg = str(info.value)
    assert "8192" in msg and "3072" in msg and "VKSHMEM_SYMMETRIC_SIZE" in msg
    assert info.value.requested == 8192 and info.value.available == 3072


def test_bad_free_and_alignment() -> None:
    a = _alloc()
    off = a.alloc(10)
    a.free(off)
    with pytest.raises(InvalidArgumentError, match="double free"):
        a.free(off)
    with pytest.raises(InvalidArgumentError, match="power of two"):
        a.alloc(8, 100)


def test_resize_in_place_and_shrink() -> None:
    a = _alloc(1 << 16)
    off = a.alloc(100)
    assert a.can_grow(off, 1000)
    a.resize(off, 1000)
    assert a.block_size(off) == 1024
    a.resize(off, 64)
    assert a.block_size(off) == 64
    assert a.alloc(100) == 64  # the tail went back to the free list


def test_host_segment_is_shared_memfd() -> None:
    seg = HostSegment(0, 1 << 20, "test-heap")
    try:
        seg.buffer[100:104] = b"abcd"
        with open(f"/proc/self/fd/{seg.fd}", "rb") as f:
            f.seek(100)
            assert f.read(4) == b"abcd"
        assert seg.address % 4096 == 0
    finally:
        fd = seg.fd
        seg.close()
    with pytest.raises(OSError):
        os.fstat(fd)
