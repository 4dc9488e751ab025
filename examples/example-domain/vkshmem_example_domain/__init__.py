"""vkshmem-example-domain: a small, complete, out-of-tree vkshmem memory domain.

The ``file`` domain gives every PE a second symmetric heap backed by a file in a directory of
the user's choice (``VKSHMEM_FILE_DOMAIN_DIR``, default ``/dev/shm``; a directory on a DAX or
hugetlbfs mount works the same way), of ``VKSHMEM_FILE_DOMAIN_SIZE`` bytes (default 64 MiB).
The file is unlinked as soon as it is mapped, so nothing is left behind if a PE dies.

Its memory is CPU-addressable (``SegmentInfo.kind == "host"``), so its arrays are plain numpy
arrays: the core registers the segment in its address table, same-node peers map each other's
file through the fd the core passes over Unix sockets (the shm path), and transports that
register host memory (hostproxy, ucx) carry it to the others. Allocate with
``shmem.zeros(n, dtype, domain="file")``. Pure Python, no compiler; it imports
:mod:`vkshmem.plugin` only, and its tests (``tests/``) run :mod:`vkshmem.testing`.

With ``VKSHMEM_FILE_DOMAIN_LINK=1`` it shows the other same-node route of the contract: each
PE exports its own ``group`` and a common ``link_group``, so the core hands same-node peers'
fds to :meth:`FileDomain.link_peer` and their puts and gets go through a :class:`FileLink`
(route ``link+proxy``; AMOs through the domain proxy). With ``VKSHMEM_FILE_DOMAIN_LINK=amo``
the links carry AMOs too (``DomainLink.amos``; route ``link``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from vkshmem.plugin import (
    AmoOp,
    ConfigError,
    DomainContext,
    DomainExport,
    DomainLink,
    DomainSpec,
    InvalidArgumentError,
    MemoryDomain,
    SegmentInfo,
    hookimpl,
)

__all__ = ["SPEC", "FileDomain", "FileLink", "register_domains"]

NAME = "file"
ENV_DIR = "VKSHMEM_FILE_DOMAIN_DIR"
ENV_SIZE = "VKSHMEM_FILE_DOMAIN_SIZE"
ENV_LINK = "VKSHMEM_FILE_DOMAIN_LINK"
DEFAULT_SIZE = 64 << 20

_META = struct.Struct("<Q")  # segment size
#: ``uint64_t vk_amo(uintptr_t addr, int op, int width, uint64_t operand, uint64_t compare)``
AmoFunction = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_uint64, ctypes.c_uint64)


def _address(buf: Any) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _size() -> int:
    text = os.environ.get(ENV_SIZE, "")
    try:
        size = int(text) if text else DEFAULT_SIZE
    except ValueError:
        raise ConfigError(ENV_SIZE, f"{text!r} is not a number of bytes") from None
    if size <= 0 or size % mmap.PAGESIZE:
        raise ConfigError(ENV_SIZE, f"{size} must be a positive multiple of {mmap.PAGESIZE}")
    return size


class FileDomain(MemoryDomain):
    """One PE's file-backed segment; memory handles are ``mmap`` objects."""

    def __init__(self, ctx: DomainContext) -> None:
        self.spec = SPEC
        self.seg_id = ctx.seg_id
        self.size = _size()
        directory = os.environ.get(ENV_DIR, "/dev/shm")
        try:
            fd, path = tempfile.mkstemp(prefix=f"vkshmem-file-pe{ctx.my_pe}-", dir=directory)
        except OSError as exc:
            raise ConfigError(ENV_DIR, f"cannot create a file in {directory!r}: {exc}") from None
        try:
            os.unlink(path)  # nothing to clean up later, whatever happens to this PE
            os.ftruncate(fd, self.size)
            self.local = mmap.mmap(fd, self.size, mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.address = _address(self.local)
        self._amo = AmoFunction(ctx.amo_function)
        self._view = memoryview(self.local)

    # -- the segment ---------------------------------------------------------------------------

    def export(self) -> DomainExport:
        if _linked():  # every PE its own group: same-node peers get a FileLink instead
            return DomainExport([self.fd], _META.pack(self.size), group=f"file-{os.getpid()}",
                                link_group="file")
        # peers of this node map the same file: the group is any constant
        return DomainExport([self.fd], _META.pack(self.size), group="file")

    def link_peer(self, pe: int, fds: list[int], meta: bytes,
                  group: str | None) -> FileLink:
        return FileLink(self, self.import_peer(pe, fds, meta),
                        os.environ.get(ENV_LINK, "") == "amo")

    def import_peer(self, pe: int, fds: list[int], meta: bytes) -> mmap.mmap:
        (size,) = _META.unpack(meta)
        try:
            return mmap.mmap(fds[0], size, mmap.MAP_SHARED)
        finally:
            os.close(fds[0])

    def release_peer(self, handle: Any) -> None:
        handle.close()

    def host_view(self, mem: Any) -> memoryview | None:
        return memoryview(mem)

    def describe(self) -> SegmentInfo:
        return SegmentInfo(self.seg_id, "host", self.address, self.size, self.fd, self._view)

    # -- local operations ----------------------------------------------------------------------

    def check_range(self, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise InvalidArgumentError(f"{what}: {nbytes} bytes at offset {offset} are outside "
                                       f"the {self.size}-byte file segment")

    def write(self, mem: Any, offset: int, src: memoryview) -> None:
        self.check_range(offset, src.nbytes, "file write")
        mem[offset:offset + src.nbytes] = src

    def read(self, mem: Any, offset: int, dst: memoryview) -> None:
        self.check_range(offset, dst.nbytes, "file read")
        dst[:] = mem[offset:offset + dst.nbytes]

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        self.check_range(dst_offset, nbytes, "file copy")
        self.check_range(src_offset, nbytes, "file copy")
        dst[dst_offset:dst_offset + nbytes] = src[src_offset:src_offset + nbytes]

    def amo(self, mem: Any, offset: int, op: AmoOp, width: int, operand: int,
            compare: int) -> int:
        return int(self._amo(_address(mem) + offset, int(op), width, operand, compare))

    def watch_address(self, offset: int) -> int:
        return self.address + offset

    # -- arrays and teardown -------------------------------------------------------------------

    def make_array(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self.local, dtype, count, offset).reshape(shape)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._view.release()
        try:
            self.local.close()
        except BufferError:
            pass  # user arrays still view it: the mapping goes with them
        os.close(self.fd)


class FileLink(DomainLink):
    """A link to a peer's file (``VKSHMEM_FILE_DOMAIN_LINK=1``, or ``amo``: AMOs too): the
    same bytes as an import, moved by the link's calls, which it counts (:attr:`calls`, for
    tests)."""

    def __init__(self, domain: FileDomain, peer: mmap.mmap, amos: bool) -> None:
        self.domain, self.peer = domain, peer
        self.calls = 0
        self.amos = amos

    def amo(self, offset: int, op: AmoOp, width: int, operand: int, compare: int) -> int:
        self.calls += 1
        return self.domain.amo(self.peer, offset, op, width, operand, compare)

    def put(self, offset: int, src: memoryview) -> None:
        self.calls += 1
        self.domain.write(self.peer, offset, src)

    def get(self, offset: int, dst: memoryview) -> None:
        self.calls += 1
        self.domain.read(self.peer, offset, dst)

    def put_device(self, offset: int, src_off: int, nbytes: int) -> None:
        self.calls += 1
        self.domain.copy(self.peer, offset, self.domain.local, src_off, nbytes)

    def get_device(self, offset: int, dst_off: int, nbytes: int) -> None:
        self.calls += 1
        self.domain.copy(self.domain.local, dst_off, self.peer, offset, nbytes)

    def close(self) -> None:
        self.peer.close()


def _linked() -> bool:
    return os.environ.get(ENV_LINK, "") in ("1", "amo")


SPEC = DomainSpec(name=NAME, factory=FileDomain, family="host", priority=0,
                  description="a symmetric heap in a file (VKSHMEM_FILE_DOMAIN_DIR)",
                  size_variable=ENV_SIZE,
                  memory_kinds=frozenset({"host"}),  # what describe() reports
                  variables=(  # vkshmem info lists them with their values
                      (ENV_DIR, "/dev/shm", "Directory of each PE's heap file (unlinked once "
                       "mapped); a DAX or hugetlbfs mount works the same way."),
                      (ENV_SIZE, str(DEFAULT_SIZE), "Bytes of each PE's file heap (a multiple "
                       "of the page size)."),
                      (ENV_LINK, "0", "1: same-node peers are linked (puts and gets through "
                       "a FileLink, AMOs through the domain proxy); amo: AMOs too.")))


@hookimpl
def register_domains(register: Callable[[Any], None]) -> None:
    """The ``file`` domain."""
    register(SPEC)
