"""The domain proxy's mailbox: its layout (:class:`Layout`), the request and response headers
and the piece size (:func:`proxy_chunk`), shared by the sending side
(:mod:`vkshmem.core.proxy.protocol`, whose docstring describes the protocol) and the serving side
(:mod:`vkshmem.core.proxy.serve`)."""

from __future__ import annotations

import struct

from .._native import ffi, lib

__all__ = ["AMO", "CPU_PIECE", "DEPTH", "GET", "HDR", "HEAD", "INLINE", "MIN_PIECE", "PIPELINE",
           "PUT", "RESP", "STREAM_MIN", "U64", "Layout", "fill", "pieces", "proxy_chunk"]

#: requests in flight per (sender, target) pair
DEPTH = 3
PUT, GET, AMO = 1, 2, 3
HEAD = 64  # bytes of a request or response header area
HDR = struct.Struct("<IIQQQQQ")  # op, width, offset, nbytes, operand, compare, seq
RESP = struct.Struct("<QQQ")  # value, status, nbytes
U64 = struct.Struct("<Q")
#: host payloads up to this size are copied next to their header and sent with it in one put
INLINE = 8 << 10
#: host payloads from this size up, to a peer whose mailbox is mapped here, are copied into it
#: with streaming stores (csrc/copy_stream.h), and the serving side answers gets that large
#: into a sender's mapped answer area the same way (proxy_round.c's VKP_STREAM_MIN)
STREAM_MIN = 128 << 10
#: a transfer of a few chunks is cut into at least this many pieces (each no smaller than
#: MIN_PIECE), so that it is a pipeline too: the transport carries piece k while the devices
#: (or CPUs) copy pieces k - 1 and k + 1 (measured on a 2-core VM over hostproxy, UCX and the
#: shm path: 1 MiB as 2 pieces of 512 KiB did as well as one piece or better, as 4 of 256 KiB
#: worse: each piece costs a request and its answer)
PIPELINE = 2
MIN_PIECE = 512 << 10
#: the largest piece where CPUs copy the pieces (a segment the CPU maps at memory speed): a
#: piece still in the cache when the target copies it out of its mailbox
CPU_PIECE = 1 << 20


def fill(area: memoryview, src: memoryview) -> bool:
    """Copy ``src`` into ``area`` of a peer's mapped mailbox: with streaming stores from
    STREAM_MIN up (the peer's proxy reads those lines next, and read them last time: each
    ordinary store would fetch its line back from the peer's core first). Whether it
    streamed."""
    if src.nbytes >= STREAM_MIN:
        lib.vk_copy_stream(ffi.from_buffer(area), ffi.from_buffer(src), src.nbytes)
        return True
    area[:] = src
    return False


def pieces(nbytes: int, chunk: int, cpu: bool = False) -> list[tuple[int, int]]:
    """``(offset, size)`` of the pieces of a transfer of ``nbytes``: at most ``chunk`` (and
    CPU_PIECE where ``cpu``), at least PIPELINE of them while they are MIN_PIECE or more."""
    size = min(chunk, CPU_PIECE) if cpu else chunk
    if nbytes < PIPELINE * size:
        per = -(-nbytes // PIPELINE)
        size = min(size, max(MIN_PIECE, -(-per // 4096) * 4096))
    return [(lo, min(size, nbytes - lo)) for lo in range(0, nbytes, size)]


def proxy_chunk(configured: int, heap_size: int, n_pes: int) -> int:
    """The proxy's piece size: ``configured`` (VKSHMEM_GPU_PROXY_CHUNK), or for ``auto`` (0)
    4 MiB, less where the mailbox (2 x DEPTH pieces per PE) would take more than an eighth of
    the host heap, never below 256 KiB unless that would take more than a quarter of it (then
    what fits the eighth, at least 16 KiB). Every piece costs a request and a device copy on
    each side; DEPTH are in flight per pair, so larger pieces move more per round trip."""
    if configured:
        return configured
    per_piece = 2 * DEPTH * max(n_pes, 1)
    fit = heap_size // (8 * per_piece) // 4096 * 4096
    if per_piece * (256 << 10) > heap_size // 4:
        return max(16 << 10, fit)
    return max(256 << 10, min(4 << 20, fit))


class Layout:
    """Byte offsets within a PE's mailbox (see :mod:`vkshmem.core.proxy.protocol`)."""

    def __init__(self, n: int, depth: int, chunk: int) -> None:
        self.n, self.depth, self.chunk = n, depth, chunk
        self.area = HEAD + chunk
        words = -(-n * depth * 8 // 64) * 64
        self.answers = words
        self.blocks = 2 * words
        self.size = self.blocks + n * depth * 2 * self.area

    def bell(self, s: int, j: int) -> int:
        return (s * self.depth + j) * 8

    def answer(self, t: int, j: int) -> int:
        return self.answers + (t * self.depth + j) * 8

    def request(self, s: int, j: int) -> int:
        return self.blocks + (s * self.depth + j) * 2 * self.area

    def response(self, t: int, j: int) -> int:
        return self.request(t, j) + self.area
