"""The domain proxy: reaching a peer's segment of a memory domain that this PE can neither
import nor reach through a transport.

Same-device peers on one node import each other's exported fd and copy directly (see
:mod:`vkshmem.core.domainheap`). Every other peer — another device, another node, or any peer
with ``VKSHMEM_SHM=0`` — is reached through a small request/response protocol over the
ordinary host-heap transports, served on the target by this module's proxy thread, which
applies the request to its own segment with the domain's local operations (for a GPU, AMOs by
a shader, so they stay atomic with shader atomics on the same word).

Mailbox: a symmetric host-heap allocation made when the domain opens, one block of
``B = 128 + 2 * chunk`` bytes per peer (``VKSHMEM_GPU_PROXY_CHUNK``). On PE ``t`` the block of
sender ``s`` holds ``s``'s request; on PE ``s`` the block of ``t`` holds ``t``'s response::

    0   u64 request seq (stored last)      64  u64 response seq (stored last)
    8   u32 op | amo << 8, u32 width       72  u64 fetched value
    16  u64 offset      24 u64 nbytes      80  u64 status (0 ok; else an error text follows)
    32  u64 operand     40 u64 compare
    128 request payload (chunk bytes)      128 + chunk: response payload (chunk bytes)

A sender serialises its requests (one in flight per target; a larger transfer is a sequence
of chunks), so a new sequence number is exactly one new request. A PE never sends
to itself (its own segment is always mapped), so its own block is free: its two payload areas
are the staging buffers of the sending side (:attr:`DomainProxy.stage`, for device
transfers, see ``DomainHeap._pieces``) and of the serving side (what a get reads); both lie
in the host heap, which a GPU domain imports, so the device copies into and out of them are
single DMAs. Data are put before the
header, a fence, then the sequence number; the response comes back the same way. Every wait
has a deadline (``VKSHMEM_GPU_TIMEOUT``) and names the PE it waited for.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .endpoints import Endpoints
from .transport import AmoOp
from .wait import Waiter

if TYPE_CHECKING:
    from .domainheap import DomainHeap

__all__ = ["DomainProxy", "proxy_chunk"]

log = logging.getLogger("vkshmem")

_PUT, _GET, _AMO = 1, 2, 3
_HDR = struct.Struct("<IIQQQQ")  # op, width, offset, nbytes, operand, compare (at +8)
_RESP = struct.Struct("<QQ")  # value, status (at +72)
_U64 = struct.Struct("<Q")
_MAX_SLEEP = 1e-3


def proxy_chunk(configured: int, heap_size: int, n_pes: int) -> int:
    """The proxy's piece size: ``configured`` (VKSHMEM_GPU_PROXY_CHUNK), or for ``auto`` (0)
    4 MiB, less where the mailbox (2 pieces per PE) would take more than an eighth of the host
    heap, never below 256 KiB. Every piece costs a request/response round trip and a device
    submission on each side, so larger pieces move more per round trip."""
    if configured:
        return configured
    fit = heap_size // (8 * 2 * max(n_pes, 1)) // 4096 * 4096
    return max(256 << 10, min(4 << 20, fit))


class DomainProxy:
    """Both sides of the protocol for one PE and domain (collective to create: allocates the
    mailbox)."""

    def __init__(self, heap: DomainHeap) -> None:
        rt = heap.rt
        self.heap = heap
        self.rt = rt
        self.me = rt.my_pe
        self.n = rt.n_pes
        self.chunk = proxy_chunk(rt.config.gpu_proxy_chunk, rt.config.symmetric_size, self.n)
        self.block = 128 + 2 * self.chunk
        self.timeout = rt.config.gpu_timeout
        #: what a failure raises: the domain's own error type (GpuError for the GPU)
        self.error = heap.domain.error_type
        self.failure: BaseException | None = None
        self.base = rt.alloc(self.n * self.block, 64, clear=True)
        self._box = np.frombuffer(rt.host.buffer, np.uint64, self.n * self.block // 8,
                                  self.base)
        stride = self.block // 8
        self._requests = self._box[0::stride]  # request seq of each sender, here
        self._served = np.zeros(self.n, np.uint64)
        self._seq = [0] * self.n
        self._send_lock = threading.Lock()
        self._waiter = Waiter(self.timeout, rt.transports)
        # Own endpoints for the sending side and for the proxy thread, so neither shares a
        # transport's default endpoint with the application's thread.
        self._send = Endpoints(rt)
        self._serve_eps = Endpoints(rt)
        own = memoryview(rt.host.buffer)[self.base + self.me * self.block + 128:
                                          self.base + (self.me + 1) * self.block]
        #: host-heap staging of the sending side (one chunk; take ``stage_lock``)
        self.stage = own[:self.chunk]
        self.stage_lock = threading.Lock()
        self._tmp = own[self.chunk:]  # the serving side's (gets read into it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_loop,
                                        name=f"vkshmem-{heap.name}-proxy", daemon=True)
        self._thread.start()

    # -- sending side ------------------------------------------------------------------------

    def _request(self, pe: int, op: int, offset: int, nbytes: int = 0, payload: Any = None,
                 operand: int = 0, compare: int = 0, width: int = 0,
                 out: memoryview | None = None) -> int:
        if self.failure is not None:
            raise self.error(f"the {self.heap.name} proxy thread of PE {self.me} failed: "
                             f"{self.failure}")
        blk = self.block
        remote = self.base + self.me * blk
        with self._send_lock:
            seq = self._seq[pe] + 1
            self._seq[pe] = seq
            t = self._send[pe]
            if payload is not None and nbytes:
                t.put(pe, 0, remote + 128, payload)
            t.put(pe, 0, remote + 8, memoryview(_HDR.pack(op, width, offset, nbytes, operand,
                                                          compare)))
            t.fence()
            t.put(pe, 0, remote + 0, memoryview(_U64.pack(seq)))
            t.quiet()
            local = self.base + pe * blk
            word = (local + 64) // 8 - self.base // 8
            box = self._box
            try:
                self._waiter.wait(lambda: int(box[word]) == seq,
                                  self.rt.host.address + local + 64, 8,
                                  f"PE {pe}'s {self.heap.name} proxy (VKSHMEM_GPU_TIMEOUT)")
            except Exception as exc:
                raise self.error(f"PE {pe}'s {self.heap.name} proxy did not answer a request "
                                 f"for {nbytes} bytes at offset {offset}: {exc}") from exc
            buf = self.rt.host.buffer
            value, status = _RESP.unpack_from(buf, local + 72)
            if status:
                text = bytes(buf[local + 128 + self.chunk:local + 128 + self.chunk + 512])
                reason = text.split(b"\0", 1)[0].decode(errors="replace")
                raise self.error(f"PE {pe}'s {self.heap.name} proxy failed: {reason}")
            if out is not None:
                start = local + 128 + self.chunk
                out[:nbytes] = buf[start:start + nbytes]
            return int(value)

    def put(self, pe: int, offset: int, src: memoryview) -> None:
        """Write host bytes ``src`` into ``pe``'s segment at ``offset`` (complete on return)."""
        c = self.chunk
        for lo in range(0, src.nbytes, c):
            piece = src[lo:lo + c]
            self._request(pe, _PUT, offset + lo, piece.nbytes, piece)

    def get(self, pe: int, offset: int, dst: memoryview) -> None:
        """Fill host buffer ``dst`` from ``pe``'s segment at ``offset``."""
        c = self.chunk
        for lo in range(0, dst.nbytes, c):
            piece = dst[lo:lo + c]
            self._request(pe, _GET, offset + lo, piece.nbytes, out=piece)

    def amo(self, pe: int, offset: int, op: AmoOp, width: int, operand: int,
            compare: int) -> int:
        """Apply ``op`` on ``pe``'s word (with the domain's atomics there); return the old value."""
        return self._request(pe, _AMO | (int(op) << 8), offset, 0, None, operand, compare,
                             width)

    # -- serving side -------------------------------------------------------------------------

    def _serve_loop(self) -> None:
        sleep = 0.0
        idle_since = time.monotonic()
        while not self._stop.is_set():
            pending = np.flatnonzero(self._requests != self._served)
            if pending.size:
                for s in pending:
                    try:
                        self._serve(int(s))
                    except BaseException as exc:  # the transport to s failed: give up
                        log.error("%s proxy of PE %d: answering PE %d failed: %s",
                                  self.heap.name, self.me, s, exc)
                        self.failure = exc
                        return
                sleep = 0.0
                idle_since = time.monotonic()
                continue
            # Adaptive: poll hot for a millisecond after work, then back off to 1 ms sleeps.
            if time.monotonic() - idle_since < 1e-3:
                time.sleep(0)
            else:
                sleep = min(_MAX_SLEEP, sleep * 2 or 20e-6)
                self._stop.wait(sleep)

    def _serve(self, s: int) -> None:
        buf = self.rt.host.buffer
        blk = self.block
        base = self.base + s * blk
        seq = int(self._requests[s])
        op, width, offset, nbytes, operand, compare = _HDR.unpack_from(buf, base + 8)
        heap = self.heap
        dom, mem = heap.domain, heap.local
        value, status, payload = 0, 0, None
        try:
            if nbytes > self.chunk:
                raise self.error(f"request of {nbytes} bytes exceeds the proxy chunk")
            dom.check_range(offset, max(nbytes, width), f"{heap.name} proxy request")
            kind = op & 0xFF
            if kind == _PUT:
                dom.write(mem, offset, buf[base + 128:base + 128 + nbytes])
            elif kind == _GET:
                view = self._tmp[:nbytes]
                dom.read(mem, offset, view)
                payload = view
            elif kind == _AMO:
                value = dom.amo(mem, offset, AmoOp(op >> 8), width, operand, compare)
            else:
                raise self.error(f"unknown proxy request {op}")
        except Exception as exc:
            status = 1
            payload = memoryview(f"{type(exc).__name__}: {exc}".encode()[:500] + b"\0")
        t = self._serve_eps[s]
        back = self.base + self.me * blk
        if payload is not None and payload.nbytes:
            t.put(s, 0, back + 128 + self.chunk, payload)
        t.put(s, 0, back + 72, memoryview(_RESP.pack(value, status)))
        t.fence()
        t.put(s, 0, back + 64, memoryview(_U64.pack(seq)))
        t.quiet()
        self._served[s] = seq

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> bool:
        """Stop the proxy thread (peers' requests are no longer served); whether it ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Stop the proxy thread and release its endpoints (the mailbox goes with the heap).
        At the end of the job the runtime closes the transports first: closing a context of
        a closed transport releases only what is left."""
        if not self.stop():  # stuck in a transport call: leak rather than close under it
            log.warning("%s proxy of PE %d did not stop; its endpoints stay open",
                        self.heap.name, self.me)
            return
        self._send.close()
        self._serve_eps.close()
        # views over the host heap would keep its mapping from being released
        self._box = self._requests = np.zeros(0, np.uint64)
        self.stage = self._tmp = memoryview(b"")
