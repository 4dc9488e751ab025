"""DLPack both ways (vkshmem/core/dlpack.py) and ``shmem.from_dlpack``, in CI without a GPU:
capsules exported as CPU tensors are consumed by numpy and released; ``from_dlpack`` finds a
tensor's memory in the host heap (numpy and a CPU DLPack producer) and refuses memory outside
every symmetric heap. CUDA tensors (torch, CuPy) are checked on a GPU by tests/pe/cuda_domain.py."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from vkshmem.core.dlpack import KDL_CPU, describe, dlpack_capsule, dtype_code, live_tensors
from vkshmem.core.errors import InvalidArgumentError, InvalidTypeError


class _HostExport:
    """A numpy buffer exported through vkshmem's DLPack code as a CPU tensor."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        return dlpack_capsule(self.data.ctypes.data, self.data.shape, self.data.dtype, 0,
                              self.data, dl_device, copy, device_type=KDL_CPU)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CPU, 0)


def test_capsules_are_consumed_and_released() -> None:
    before = live_tensors()
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = np.from_dlpack(_HostExport(src))
    assert view.shape == (3, 4) and view.dtype == np.float32
    src[1, 2] = 99.0  # the same memory, no copy
    assert view[1, 2] == 99.0
    assert live_tensors() == before + 1
    del view
    gc.collect()
    assert live_tensors() == before  # numpy called the deleter
    _HostExport(src).__dlpack__()  # a capsule nobody consumes is released when dropped
    gc.collect()
    assert live_tensors() == before
    with pytest.raises(BufferError, match="without a copy"):
        _HostExport(src).__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not"):
        _HostExport(src).__dlpack__(dl_device=(2, 0))
    assert dtype_code(np.dtype(np.complex64)) == (5, 64)
    with pytest.raises(ValueError, match="no type"):
        dtype_code(np.dtype(">i4"))


def test_describe_reads_a_tensor_without_consuming_it() -> None:
    a = np.arange(24, dtype=np.int16).reshape(4, 6)
    d = describe(a[1:3])  # numpy's own producer
    assert (d.device_type, d.address, d.shape, d.dtype) == (KDL_CPU, a[1:3].ctypes.data,
                                                            (2, 6), np.dtype(np.int16))
    assert d.strides in (None, (12, 2))
    t = describe(a[:, ::2])
    assert t.strides == (12, 4)
    before = live_tensors()
    assert describe(_HostExport(a)).shape == (4, 6)
    gc.collect()
    assert live_tensors() == before  # describe dropped the capsule: the producer got it back
    with pytest.raises(TypeError):
        describe(object())


@pytest.fixture(scope="module")
def shmem() -> Iterator[Any]:
    """The API with a one-PE runtime in this process, finalized afterwards (through the
    _api modules: importing vkshmem.shmem would initialise a runtime that outlives the test)."""
    from vkshmem._api import alloc, interop, lifecycle, rma, sync

    lifecycle.init()
    api = type("Api", (), {})()
    for mod in (alloc, interop, rma, sync):
        for name in mod.__all__:
            setattr(api, name, getattr(mod, name))
    try:
        yield api
    finally:
        lifecycle.finalize()


def test_from_dlpack_finds_the_host_heap(shmem: Any) -> None:
    a = shmem.zeros(16, np.int64)
    back = shmem.from_dlpack(_HostExport(a[4:12]))
    assert back.shape == (8,) and back.ctypes.data == a[4:12].ctypes.data
    shmem.put(back[:2], np.array([7, 8], np.int64), 0)  # a symmetric put target
    shmem.quiet()
    assert a[4:6].tolist() == [7, 8]
    assert shmem.from_dlpack(a.reshape(4, 4)[1:3]).shape == (2, 4)  # numpy's __dlpack__
    with pytest.raises(InvalidArgumentError, match="in no symmetric heap"):
        shmem.from_dlpack(np.zeros(4))
    with pytest.raises(InvalidArgumentError, match="not C-contiguous"):
        shmem.from_dlpack(a[::2])
    with pytest.raises(InvalidTypeError, match="__dlpack__"):
        shmem.from_dlpack([1, 2, 3])

    class _Cai:  # CUDA memory known only by address (Numba-style): in no heap of this job
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (1 << 40, False),
                                    "version": 3, "strides": None}

    with pytest.raises(InvalidArgumentError, match=r"device type 2.*in no symmetric heap"):
        shmem.from_dlpack(_Cai())
    shmem.free(a)
