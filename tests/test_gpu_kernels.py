"""Shaders on lavapipe with the validation layer on: AMOs (amo.comp) against a numpy model,
concurrent shader atomics, reductions (reduce.comp) for every op and dtype against numpy
(8/16-bit integers, float16 and complex included), the feature checks of the small types,
shader copies (copy.comp), and the pipeline API."""

from __future__ import annotations

import dataclasses
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gpu.helpers import device_fixture

from vkshmem.core.errors import FeatureNotAvailableError, InvalidArgumentError
from vkshmem.core.transports.contract import AmoOp
from vkshmem.gpu import (
    REDUCE_DTYPES,
    REDUCE_FEATURES,
    REDUCE_OPS,
    ComputePipeline,
    GpuMemory,
    VulkanDevice,
    load_spirv,
    reduce_unsupported,
    shipped_shaders,
)
from vkshmem.gpu.vk import kernels as kernels_mod

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def dev() -> Iterator[VulkanDevice]:
    yield from device_fixture(staging_size=1 << 20)


@pytest.fixture(autouse=True)
def no_new_errors(dev: VulkanDevice) -> Iterator[None]:
    before = len(dev.validation_errors)
    yield
    assert dev.validation_errors[before:] == []


@pytest.fixture
def mem(dev: VulkanDevice) -> Iterator[GpuMemory]:
    m = dev.alloc_exportable(1 << 16)
    yield m
    m.free()


def _model(op: AmoOp, old: int, operand: int, compare: int, mask: int) -> int:
    return {
        AmoOp.FETCH: old,
        AmoOp.SET: operand,
        AmoOp.SWAP: operand,
        AmoOp.CSWAP: operand if old == compare else old,
        AmoOp.ADD: (old + operand) & mask,
        AmoOp.AND: old & operand,
        AmoOp.OR: old | operand,
        AmoOp.XOR: old ^ operand,
    }[op]


def _word(dev: VulkanDevice, mem: GpuMemory, off: int, width: int) -> int:
    buf = bytearray(width)
    dev.read(mem, off, buf)
    return int.from_bytes(buf, "little")


@pytest.mark.parametrize("width", [4, 8])
@pytest.mark.parametrize("op", list(AmoOp))
def test_amo_every_op_and_width(dev: VulkanDevice, mem: GpuMemory, op: AmoOp,
                                width: int) -> None:
    rng = np.random.default_rng(int(op) * 10 + width)
    mask = (1 << (8 * width)) - 1
    off = 8 * 37 + (4 if width == 4 else 0)  # an odd 4-byte slot for the 32-bit case
    for trial in range(6):
        start = int(rng.integers(0, mask, dtype=np.uint64, endpoint=True))
        operand = int(rng.integers(0, mask, dtype=np.uint64, endpoint=True))
        compare = start if trial % 2 == 0 else (start ^ 1)  # CSWAP hits, then misses
        if trial == 5:
            start, operand = mask, 1  # wrap-around of ADD
        dev.write(mem, off, start.to_bytes(width, "little"))
        old = dev.amo(mem, off, op, width, operand, compare)
        assert old == start
        assert _word(dev, mem, off, width) == _model(op, start, operand, compare, mask)
    # Neighbouring words are untouched.
    assert _word(dev, mem, off + width, width) == 0


def test_amo_operands_are_bit_patterns(dev: VulkanDevice, mem: GpuMemory) -> None:
    bits = struct.unpack("<Q", struct.pack("<d", -2.5))[0]
    dev.amo(mem, 0, AmoOp.SET, 8, bits)
    assert struct.unpack("<d", struct.pack("<Q", dev.amo(mem, 0, AmoOp.FETCH, 8)))[0] == -2.5
    assert dev.amo(mem, 8, AmoOp.ADD, 4, -1) == 0  # negative operand = its two's complement
    assert _word(dev, mem, 8, 4) == 0xFFFFFFFF


def test_amo_argument_errors(dev: VulkanDevice, mem: GpuMemory) -> None:
    with pytest.raises(InvalidArgumentError, match="aligned"):
        dev.amo(mem, 4, AmoOp.ADD, 8, 1)
    with pytest.raises(InvalidArgumentError, match="width"):
        dev.amo(mem, 0, AmoOp.ADD, 2, 1)
    with pytest.raises(InvalidArgumentError, match="op"):
        dev.amo(mem, 0, 42, 8, 1)
    with pytest.raises(InvalidArgumentError, match="outside"):
        dev.amo(mem, mem.size, AmoOp.ADD, 8, 1)


@pytest.mark.parametrize("width", [4, 8])
def test_concurrent_shader_atomics(dev: VulkanDevice, mem: GpuMemory, width: int) -> None:
    k = dev.kernels
    dt = np.uint32 if width == 4 else np.uint64
    n = 5000  # more than one batch dispatch
    dev.write(mem, 0, bytes(256))
    olds = k.amo_batch(mem, [0] * n, AmoOp.ADD, width, 1)
    assert sorted(olds.tolist()) == list(range(n))  # every invocation saw a distinct value
    assert _word(dev, mem, 0, width) == n
    # Many words at once, against a numpy model.
    rng = np.random.default_rng(width)
    offs = rng.integers(1, 16, n) * width
    vals = rng.integers(1, 1000, n)
    k.amo_batch(mem, offs, AmoOp.ADD, width, vals)
    got = np.empty(16, dt)
    dev.read(mem, 0, got)
    model = np.bincount(offs // width, weights=vals, minlength=16).astype(dt)
    model[0] = n
    assert np.array_equal(got, model)
    # Exactly one compare-and-swap wins.
    dev.write(mem, 0, bytes(width))
    olds = k.amo_batch(mem, [0] * 300, AmoOp.CSWAP, width, np.arange(1, 301), 0)
    final = _word(dev, mem, 0, width)
    assert (olds == 0).sum() == 1 and set(olds.tolist()) <= {0, final} and final in range(1, 301)
    # OR of every bit, XOR that cancels, AND that clears.
    dev.write(mem, 0, bytes(width))
    k.amo_batch(mem, [0] * (8 * width), AmoOp.OR, width, [1 << i for i in range(8 * width)])
    assert _word(dev, mem, 0, width) == (1 << (8 * width)) - 1
    k.amo_batch(mem, [0] * 64, AmoOp.XOR, width, 0x5A)
    assert _word(dev, mem, 0, width) == (1 << (8 * width)) - 1
    k.amo_batch(mem, [0] * 8, AmoOp.AND, width, [~(1 << i) for i in range(8)])
    assert _word(dev, mem, 0, width) == ((1 << (8 * width)) - 1) & ~0xFF


def _operands(dt: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    if dt.kind == "f":
        return (rng.random(n) * 20 - 10).astype(dt)
    if dt.kind == "c":
        return (rng.random(n) * 20 - 10 + 1j * (rng.random(n) * 20 - 10)).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


def _cmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i rounded after every operation, as
    reduce_c64/c128 compute it. numpy's own complex multiply may fuse into FMAs (its SIMD
    loops do on x86-64 with FMA3), so it can differ from this in the last bit."""
    a, b, c, d = x.real, x.imag, y.real, y.imag
    out = np.empty_like(x)
    out.real = a * c - b * d
    out.imag = a * d + b * c
    return out


_NP = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
       "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


#: the ops reduce.comp defines per dtype kind (complex min/max are not defined)
_KIND_OPS = {"i": list(REDUCE_OPS), "u": list(REDUCE_OPS), "f": ["sum", "prod", "min", "max"],
             "c": ["sum", "prod"]}


@pytest.mark.parametrize("dtype", [str(d) for d in REDUCE_DTYPES])
def test_reduce_every_op_and_dtype(dev: VulkanDevice, dtype: str) -> None:
    dt = np.dtype(dtype)
    assert reduce_unsupported(dev.info, dt, "sum") is None  # lavapipe has every feature
    rng = np.random.default_rng(len(dtype))
    n = 1000 + 13
    a = dev.alloc_exportable((n + 8) * dt.itemsize)
    b = dev.alloc_exportable((n + 8) * dt.itemsize)
    try:
        for op in REDUCE_OPS:
            if op not in _KIND_OPS[dt.kind]:
                assert reduce_unsupported(dev.info, dt, op) is not None
                with pytest.raises(InvalidArgumentError,
                                   match="integers" if dt.kind == "f" else "not defined"):
                    dev.reduce(a, 0, b, 0, n, op, dt)
                continue
            x = _operands(dt, n, rng)
            y = _operands(dt, n, rng)
            if dt.kind in "iu" and dt.itemsize <= 2:
                x[:4] = np.iinfo(dt).max  # wrap-around of sums and products
                y[:4] = np.iinfo(dt).max
            off = 3 * dt.itemsize
            dev.write(a, off, x)
            dev.write(b, off + dt.itemsize, y)
            dev.reduce(a, off, b, off + dt.itemsize, n, op, dt)
            got = np.empty_like(x)
            dev.read(a, off, got)
            with np.errstate(over="ignore"):
                want = _NP[op](x, y)
            if dt.kind == "c" and op == "prod":
                assert np.allclose(got, want, rtol=4 * np.finfo(dt).eps, atol=0)
                want = _cmul(x, y)
            assert np.array_equal(got, want), (dtype, op)
            # Neighbours on both sides are untouched (the small types write single bytes).
            edge = np.empty(2, dt)
            dev.read(a, off - dt.itemsize, edge[:1])
            dev.read(a, off + n * dt.itemsize, edge[1:])
            assert not edge.any(), (dtype, op)
    finally:
        a.free()
        b.free()


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_reduce_complex_unaligned_and_chunked(dev: VulkanDevice, dtype: str) -> None:
    """Complex elements only need their scalars' alignment; sums run as 2 * count scalars,
    products one complex per invocation, both split across dispatches."""
    dt = np.dtype(dtype)
    half = dt.itemsize // 2
    real = dev.info
    dev.info = dataclasses.replace(real, max_workgroup_count=(2, 2, 2))  # 512 invocations
    rng = np.random.default_rng(dt.itemsize)
    n = 1500
    a = dev.alloc_exportable((2 * n + 2) * dt.itemsize)
    try:
        for op in ("sum", "prod"):
            x = _operands(dt, n, rng)
            y = _operands(dt, n, rng)
            dev.write(a, half, x)  # only half-aligned
            dev.write(a, half + n * dt.itemsize, y)
            dev.reduce(a, half, a, half + n * dt.itemsize, n, op, dt)
            got = np.empty_like(x)
            dev.read(a, half, got)
            assert np.array_equal(got, x + y if op == "sum" else _cmul(x, y)), op
        with pytest.raises(InvalidArgumentError, match=f"aligned to {half}"):
            dev.reduce(a, half // 2, a, half + n * dt.itemsize, 1, "prod", dt)
    finally:
        dev.info = real
        a.free()


@pytest.mark.parametrize("dtype", [str(d) for d in REDUCE_FEATURES])
def test_reduce_missing_feature(dev: VulkanDevice, mem: GpuMemory, dtype: str) -> None:
    """A device without a dtype's features refuses it by name (the collectives then reduce
    that dtype on the host)."""
    dt = np.dtype(dtype)
    real = dev.info
    for feature in REDUCE_FEATURES[dt]:
        dev.info = dataclasses.replace(real, shader_features=real.shader_features - {feature})
        try:
            why = reduce_unsupported(dev.info, dt, "sum")
            assert why is not None and feature in why
            with pytest.raises(FeatureNotAvailableError, match=feature):
                dev.reduce(mem, 0, mem, 64, 4, "sum", dt)
            assert reduce_unsupported(dev.info, np.int32, "sum") is None
        finally:
            dev.info = real


def test_reduce_chunks_dispatches(dev: VulkanDevice) -> None:
    """Work beyond one dispatch's workgroup limit is split on the host (lavapipe: 65,535)."""
    real = dev.info
    dev.info = dataclasses.replace(real, max_workgroup_count=(3, 3, 3))  # 768 elements max
    try:
        n = 5000
        a = dev.alloc_exportable(8 * n)
        b = dev.alloc_exportable(8 * n)
        x = np.arange(n, dtype=np.int64)
        dev.write(a, 0, x)
        dev.write(b, 0, 2 * x)
        dev.reduce(a, 0, b, 0, n, "sum", np.int64)
        got = np.empty_like(x)
        dev.read(a, 0, got)
        assert np.array_equal(got, 3 * x)
        dev.kernels.shader_copy(b, 0, a, 0, 8 * n)
        dev.read(b, 0, got)
        assert np.array_equal(got, 3 * x)
        a.free()
        b.free()
    finally:
        dev.info = real


def test_reduce_argument_errors(dev: VulkanDevice, mem: GpuMemory) -> None:
    ld = re.escape(str(np.dtype(np.longdouble)))
    with pytest.raises(InvalidArgumentError, match=rf"int8.*complex128.*got {ld}"):
        dev.reduce(mem, 0, mem, 0, 4, "sum", np.longdouble)  # no 80-bit float on GPUs
    with pytest.raises(InvalidArgumentError, match="got bool"):
        dev.reduce(mem, 0, mem, 0, 4, "and", np.bool_)
    with pytest.raises(InvalidArgumentError, match="byte order"):
        dev.reduce(mem, 0, mem, 0, 4, "sum", np.dtype(">i4"))
    with pytest.raises(InvalidArgumentError, match="not defined for complex64"):
        dev.reduce(mem, 0, mem, 0, 4, "max", np.complex64)
    with pytest.raises(InvalidArgumentError, match="unknown reduction"):
        dev.reduce(mem, 0, mem, 0, 4, "mean", np.int32)
    with pytest.raises(InvalidArgumentError, match="aligned"):
        dev.reduce(mem, 2, mem, 8, 4, "sum", np.int32)
    with pytest.raises(InvalidArgumentError, match="overlaps"):
        dev.reduce(mem, 0, mem, 8, 4, "sum", np.int32)
    with pytest.raises(InvalidArgumentError, match="outside"):
        dev.reduce(mem, 0, mem, 8, 1 << 20, "sum", np.int32)
    dev.reduce(mem, 0, mem, 0, 0, "sum", np.int32)  # nothing to do


def test_shader_copy_bytes_and_words(dev: VulkanDevice, mem: GpuMemory) -> None:
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 9999, dtype=np.uint8)
    dev.write(mem, 1, data)
    k = dev.kernels
    k.shader_copy(mem, 20001, mem, 1, 9999)  # bytes (copy_u8)
    k.shader_copy(mem, 40000, mem, 20004, 9996 - 3 - 1)  # 4-aligned words (copy_u32)
    got = np.empty(9999, np.uint8)
    dev.read(mem, 20001, got)
    assert np.array_equal(got, data)
    got2 = np.empty(9992, np.uint8)
    dev.read(mem, 40000, got2)
    assert np.array_equal(got2, data[3:3 + 9992])
    with pytest.raises(InvalidArgumentError, match="disjoint"):
        k.shader_copy(mem, 10, mem, 12, 100)


@pytest.mark.parametrize("groups", [1, 4096])
def test_shader_copy_vectors_and_stride_loop(dev: VulkanDevice, mem: GpuMemory,
                                            monkeypatch: pytest.MonkeyPatch,
                                            groups: int) -> None:
    """16-aligned copies take copy_u128; with one workgroup every invocation walks the
    unrolled stride loop (four vectors at a time) and then the tail."""
    monkeypatch.setattr(kernels_mod, "_COPY_GROUPS", groups)
    n = 16 * (256 * 4 * 5 + 256 + 3)  # 5 unrolled rounds, one plain round, 3 stragglers
    data = np.random.default_rng(6).integers(0, 256, n, dtype=np.uint8)
    big = dev.alloc_exportable(2 * n)
    try:
        dev.write(big, 0, data)
        dev.kernels.shader_copy(big, n, big, 0, n)
        got = np.empty(n, np.uint8)
        dev.read(big, n, got)
        assert np.array_equal(got, data)
    finally:
        big.free()


def test_pipeline_api(dev: VulkanDevice, mem: GpuMemory) -> None:
    names = shipped_shaders()
    assert {"amo_u32", "amo_u64", "copy_u8", "copy_u32", "ring_selftest"} <= set(names)
    assert {f"reduce_{t}" for t in ("i8", "u8", "i16", "u16", "i32", "i64", "u32", "u64",
                                    "f16", "f32", "f64", "c64", "c128")} <= set(names)
    assert set(REDUCE_DTYPES.values()) <= set(names)
    spv = load_spirv("copy_u32")
    assert load_spirv(spv) == spv
    with pytest.raises(InvalidArgumentError, match="SPIR-V"):
        load_spirv(b"\x00" * 20)
    with pytest.raises(InvalidArgumentError, match="no shipped shader"):
        load_spirv("nope")
    pipe = ComputePipeline(dev, spv, name="my copy")
    try:
        dev.write(mem, 0, np.arange(300, dtype=np.uint32))
        push = struct.pack("<QQI4x", mem.device_address + 4096, mem.device_address, 300)
        pipe.dispatch(2, push)
        got = np.empty(300, np.uint32)
        dev.read(mem, 4096, got)
        assert np.array_equal(got, np.arange(300, dtype=np.uint32))
        with pytest.raises(InvalidArgumentError, match="workgroups"):
            pipe.dispatch(dev.info.max_workgroup_count[0] + 1, push)
        with pytest.raises(InvalidArgumentError, match="push constants"):
            pipe.dispatch(1, bytes(132))
    finally:
        pipe.close()
