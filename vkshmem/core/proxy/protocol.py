"""The domain proxy: reaching a peer's segment of a memory domain that this PE can neither
import nor reach through a transport.

Same-device peers on one node import each other's exported fd and copy directly (see
:mod:`vkshmem.core.domains.heap`). Every other peer — another device, another node, or any peer
with ``VKSHMEM_SHM=0`` — is reached through a small request/response protocol over the
ordinary host-heap transports, served on the target by its proxy thread
(:mod:`vkshmem.core.proxy.serve`), which applies each request to its own segment with the
domain's local operations (for a GPU, AMOs by a shader, so they stay atomic with shader
atomics on the same word).

**Pipelining.** Each (sender, target) pair has ``D = 3`` request slots (``DEPTH``), so three
requests are in flight. A transfer is a stream of pieces (:func:`~.mailbox.pieces`: at most
``VKSHMEM_GPU_PROXY_CHUNK``, 1 MiB where CPUs copy them, and at least two from 1 MiB): for a
device-to-device put, the sender's device copy of piece k+1 into host staging runs
(``read_nbi`` + the domain's ``flush``) while the transport carries piece k and the target's
device copies piece k-1 out of its mailbox; where the CPU reads the segment through its
mapping at memory speed (the domain's ``native_ops`` say so: a CPU driver, cached memory)
the transport sends each piece straight from the mapping, with no staging copy, and the
target answers a get through a transport likewise, from its mapping; a get keeps the next
pieces requested while the device copies an answer in (``write_nbi``, straight from the
mailbox). Their ``nbi`` forms (``put_nbi``/``get_nbi`` between GPU arrays) return once every
piece is sent, so the requests of successive calls stay in flight; :meth:`DomainProxy.quiet`
(called by the heap's ``quiet`` and ``fence``) consumes their answers and raises the first
failure. The target
serves every pending request of every sender per wake-up: it starts their device copies
together, answers the previous round's requests meanwhile, then waits (``quiet``) once.

**Peers on this node** (the shm path maps their host heaps here, e.g. PEs on two GPUs of
one machine): each PE registers, in every such peer's mailbox, the block that holds its own
requests to that peer and its answers to it with the domain (``register_host``: imported into
Vulkan and registered with CUDA), so a device piece is copied by DMA straight into the peer's
request area (puts) or answer area (the server's gets), and only headers go through the
transport: two DMAs per piece and no CPU copy, where other routes stage every piece through
host memory and a transport's copy.

**Mailbox**: a symmetric host-heap allocation made when the domain opens (collective), laid
out on every PE as (``area = 64 + chunk`` bytes, ``n`` PEs)::

    bells    n*D u64: bell[s*D + j] = last request seq sender s rang in slot j, here
    answers  n*D u64: answer[t*D + j] = last seq target t answered in my slot j
    blocks   per peer p, per slot j: request area, then response area (``area`` bytes each):
             request  = p's request to me in slot j   (64-byte header, then payload)
             response = p's answer to my slot j       (64-byte header, then payload)

    request header: u32 op | amo << 8, u32 width, u64 offset, nbytes, operand, compare, seq
    response header: u64 value, u64 status (0 ok; else an error text is the payload), nbytes

Request ``seq`` (counted per pair from 1) goes in slot ``(seq - 1) % D``; a sender reuses a
slot only after its answer came back. A sender writes the header and payload with one put
(small payloads and staged device data lie right after a header; a larger host source is put
before its header), a fence, then its bell; the target answers the same way: the response
header and payload in one put (the payload of a get lands in the request's own payload area,
which the device fills), a fence, then the answer word. A small request thus costs one round
trip of two puts each way. The bells and answers are contiguous, so the serving thread
watches all of them with one native spin (GIL released) for a short window after activity,
then sleeps with a growing pause (up to 1 ms). A PE never sends to itself, so its own block is
free: its areas are the sending side's host staging (pieces of device transfers, in the host
heap, which a GPU domain imports: the device copies in and out are single DMAs). Every wait
has a deadline (``VKSHMEM_GPU_TIMEOUT``) and names the PE it waited for; a pair whose target
timed out is refused from then on (its slots' state is unknown).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native import lib
from ..errors import PeerFailedError, WaitTimeoutError
from ..hostalloc import HOST_SEG
from ..transports.contract import AmoOp
from ..transports.endpoints import Endpoints
from ..wait import Waiter
from .device import Done, ProxyDeviceTransfers
from .mailbox import AMO, DEPTH, GET, HDR, HEAD, INLINE, PUT, RESP, U64, Layout, pieces, proxy_chunk
from .native import DomainOps
from .serve import ProxyServer

if TYPE_CHECKING:
    from ..domains.heap import DomainHeap

__all__ = ["DomainProxy", "proxy_chunk"]

log = logging.getLogger("vkshmem")

_PAGE = 4096


class DomainProxy(ProxyDeviceTransfers):
    """Both sides of the protocol for one PE and domain (collective to create: allocates the
    mailbox and starts the serving thread); transfers from and to this PE's own segment come
    from :class:`~vkshmem.core.proxy.device.ProxyDeviceTransfers` (a mixin)."""

    def __init__(self, heap: DomainHeap) -> None:
        rt = heap.rt
        self.heap = heap
        self.rt = rt
        self.me = rt.my_pe
        self.n = rt.n_pes
        self.depth = DEPTH
        self.chunk = proxy_chunk(rt.config.gpu_proxy_chunk, rt.config.symmetric_size, self.n)
        lay = self.layout = Layout(self.n, self.depth, self.chunk)
        self.timeout = rt.config.gpu_timeout
        #: what a failure raises: the domain's own error type (GpuError for the GPU)
        self.error = heap.domain.error_type
        #: set by the serving thread when it gave up (an error outside any one request)
        self.failure: BaseException | None = None
        self.base = rt.host.alloc(lay.size, 64, clear=True)
        #: the mailbox's host address (its bells come first)
        self.address = rt.host.segment.address + self.base
        self.mem = memoryview(rt.host.segment.buffer)[self.base:self.base + lay.size]
        self.words = np.frombuffer(rt.host.segment.buffer, np.uint64, lay.blocks // 8, self.base)
        self._answers = self.words[lay.answers // 8:]
        self._issued = [0] * self.n
        self._done = [0] * self.n
        #: per target, the requests awaiting their answer: (seq, on answer, non-blocking)
        self._pending: list[collections.deque[tuple[int, Done | None, bool]]] = [
            collections.deque() for _ in range(self.n)]
        #: (target, slot) whose answer area a device copy may still read
        self._landing: set[tuple[int, int]] = set()
        #: targets with non-blocking transfers not yet completed by :meth:`quiet`
        self._nbi_pes: set[int] = set()
        #: the first failure of a non-blocking transfer, raised by :meth:`quiet`
        self._nbi_error: BaseException | None = None
        self._broken: list[str | None] = [None] * self.n
        self._error: BaseException | None = None
        self._send_lock = threading.Lock()
        # bounded by VKSHMEM_GPU_TIMEOUT; drives transports that need it; ends at once when
        # the PE waited for is known to have failed
        self._waiter = Waiter(self.timeout, rt.routing.transports, rt.liveness)
        #: counters: requests sent, most in flight to one PE, serving rounds, most per round,
        #: pieces moved by DMA straight to or from a peer's mailbox (sent and served) and
        #: pieces a transport sent straight from the segment's CPU mapping (sent and served)
        #: and pieces copied into a peer's mapped mailbox with streaming stores (sent)
        self.stats = {"requests": 0, "max_in_flight": 0, "rounds": 0, "max_round": 0,
                      "direct": 0, "mapped": 0, "streamed": 0}
        # Own endpoints for the sending side (the serving thread makes its own), so neither
        # shares a transport's default endpoint with the application's thread.
        self._send = Endpoints(rt)
        own = [lay.request(self.me, 0) + i * lay.area for i in range(2 * self.depth)]
        #: host staging of the sending side: 0, 1 device pieces, 2 small host payloads
        self._stages = [self.mem[a:a + lay.area] for a in own]
        #: one piece of host-heap staging for other routes' device transfers (take
        #: ``stage_lock``; see ``DeviceTransfers._pieces``)
        self.stage = self._stages[3][HEAD:]
        self.stage_lock = threading.Lock()
        #: per peer, where it is mapped here (shm path) and the domain could register it: the
        #: peer's mailbox block for this PE (``DEPTH`` request areas, each followed by a
        #: response area), so device pieces to it go by DMA with no CPU copy (None: staged)
        self.direct: list[memoryview | None] = [self._map_block(pe) for pe in range(self.n)]
        #: the domain's operations in C (the native rounds') and its CPU mapping, if any
        self.dops = DomainOps(self)
        self.server = ProxyServer(self)

    def _map_block(self, pe: int) -> memoryview | None:
        """``pe``'s mailbox block for this PE, registered with the domain (see ``direct``)."""
        buf = None if pe == self.me else self.rt.peer_buffer(pe, HOST_SEG)
        if buf is None:
            return None
        view = memoryview(buf).cast("B")
        lay = self.layout
        lo = self.base + lay.request(self.me, 0)
        hi = lo + self.depth * 2 * lay.area
        heap = int(lib.vk_peer_base(HOST_SEG, pe))
        start = (heap + lo) & ~(_PAGE - 1)  # whole pages of the peer's (page-aligned) heap
        end = min(heap + view.nbytes, -(-(heap + hi) // _PAGE) * _PAGE)
        if not heap or not self.heap.domain.register_host(start, end - start):
            return None
        return view[lo:hi]

    def _area(self, pe: int, j: int, response: bool, n: int) -> memoryview | None:
        """The payload of slot ``j``'s request (or response) area in ``pe``'s mailbox block
        for this PE, mapped here (None: not mapped)."""
        block = self.direct[pe]
        if block is None:
            return None
        at = (2 * j + response) * self.layout.area + HEAD
        return block[at:at + n]

    # -- sending side ------------------------------------------------------------------------

    def _begin(self, pe: int) -> None:
        """Checks before an operation on ``pe`` (under the send lock)."""
        if self.failure is not None:
            raise self.error(f"the {self.heap.name} proxy thread of PE {self.me} failed: "
                             f"{self.failure}")
        if self._broken[pe] is not None:
            raise self.error(f"PE {pe}'s {self.heap.name} proxy is unusable: "
                             f"{self._broken[pe]}")
        self._error = None

    def _break(self, pe: int, why: str) -> None:
        self._broken[pe] = why
        self._pending[pe].clear()

    def _issue(self, pe: int, op: int, offset: int, nbytes: int = 0, *,
               body: memoryview | None = None, payload: memoryview | None = None,
               operand: int = 0, compare: int = 0, width: int = 0,
               done: Done | None = None, nbi: bool = False) -> None:
        """Send one request to ``pe`` (waiting first for the answer that frees its slot).
        ``body``: a staging area holding the payload after its header area; ``payload``:
        host bytes to send; ``done(payload, value)`` runs on the answer; ``nbi``: its errors
        are raised by :meth:`quiet`."""
        seq = self._issued[pe] + 1
        while seq - self._done[pe] > self.depth:
            self._complete(pe)
        lay = self.layout
        j = (seq - 1) % self.depth
        if (pe, j) in self._landing:  # the device may still copy out of the area to reuse
            self._settle()
        hdr = HDR.pack(op, width, offset, nbytes, operand, compare, seq)
        t = self._send[pe]
        at = self.base + lay.request(self.me, j)
        try:
            if body is None and payload is not None and nbytes <= INLINE:
                body = self._stages[2]
                body[HEAD:HEAD + nbytes] = payload
            if body is not None:
                body[:HDR.size] = hdr
                t.put(pe, 0, at, body[:HEAD + nbytes])
            else:
                if payload is not None and nbytes and not self._fill(pe, j, payload):
                    t.put(pe, 0, at + HEAD, payload)
                t.put(pe, 0, at, memoryview(hdr))
            t.fence()
            t.put(pe, 0, self.base + lay.bell(self.me, j), memoryview(U64.pack(seq)))
        except BaseException as exc:
            self._break(pe, f"sending a request failed: {exc}")
            raise
        self._issued[pe] = seq
        self._pending[pe].append((seq, done, nbi))
        if nbi:
            self._nbi_pes.add(pe)
        stats = self.stats
        stats["requests"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], seq - self._done[pe])

    def _complete(self, pe: int) -> Any:
        """Wait for the oldest answer from ``pe`` and consume it: ``done``'s result, or the
        fetched value. An error status is kept for :meth:`_finish` (later answers still
        arrive and are consumed)."""
        seq, done, nbi = self._pending[pe][0]  # left queued if the wait is interrupted
        lay = self.layout
        j = (seq - 1) % self.depth
        idx = pe * self.depth + j
        answers = self._answers
        if int(answers[idx]) != seq:
            name = self.heap.name
            try:
                self._waiter.wait(lambda: int(answers[idx]) == seq,
                                  self.address + lay.answer(pe, j), 8,
                                  f"PE {pe}'s {name} proxy (VKSHMEM_GPU_TIMEOUT)")
            except WaitTimeoutError as exc:
                self._break(pe, f"it did not answer within VKSHMEM_GPU_TIMEOUT: {exc}")
                raise self.error(f"PE {pe}'s {name} proxy did not answer request {seq}: "
                                 f"{exc}") from exc
            except PeerFailedError as exc:
                self._break(pe, str(exc))
                raise
        self._pending[pe].popleft()
        self._done[pe] = seq
        at = lay.response(pe, j)
        value, status, n = RESP.unpack_from(self.mem, at)
        view = self.mem[at + HEAD:at + HEAD + min(n, self.chunk)]
        if status:
            reason = bytes(view[:512]).split(b"\0", 1)[0].decode(errors="replace")
            error = self.error(f"PE {pe}'s {self.heap.name} proxy failed: {reason}")
            if nbi:
                self._nbi_error = self._nbi_error or error
            else:
                self._error = self._error or error
            return 0
        return value if done is None else done(view, value)

    def _settle(self) -> None:
        """Complete the device's copies out of answer areas (and whatever else it batched)."""
        self.heap.domain.quiet()
        self._landing.clear()

    def _finish(self, pe: int) -> Any:
        """Consume every outstanding answer from ``pe``; raise the first error it reported,
        else return the last answer's result."""
        result = None
        while self._pending[pe]:
            result = self._complete(pe)
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return result

    def _abandon(self, pe: int) -> None:
        """After a failure mid-operation: consume what is still in flight (best effort)."""
        try:
            while self._pending[pe]:
                self._complete(pe)
        except Exception as exc:  # the first failure is the one to report
            log.debug("PE %d: draining the %s proxy to PE %d: %s", self.me, self.heap.name,
                      pe, exc)
        self._error = None

    def _pieces(self, nbytes: int) -> list[tuple[int, int]]:
        """The pieces of a transfer (:func:`~vkshmem.core.proxy.mailbox.pieces`: CPU-sized
        where the CPU maps the segment at memory speed)."""
        return pieces(nbytes, self.chunk, self.dops.view is not None)

    def put(self, pe: int, offset: int, src: memoryview) -> None:
        """Write host bytes ``src`` into ``pe``'s segment at ``offset`` (complete on return)."""
        with self._send_lock:
            self._begin(pe)
            try:
                for lo, n in self._pieces(src.nbytes):
                    self._issue(pe, PUT, offset + lo, n, payload=src[lo:lo + n])
            except BaseException:
                self._abandon(pe)
                raise
            self._finish(pe)

    def get(self, pe: int, offset: int, dst: memoryview) -> None:
        """Fill host buffer ``dst`` from ``pe``'s segment at ``offset``."""
        def copy_out(lo: int) -> Done:
            def run(view: memoryview, value: int) -> None:
                dst[lo:lo + view.nbytes] = view
            return run

        with self._send_lock:
            self._begin(pe)
            try:
                for lo, n in self._pieces(dst.nbytes):
                    self._issue(pe, GET, offset + lo, n, done=copy_out(lo))
            except BaseException:
                self._abandon(pe)
                raise
            self._finish(pe)

    def amo(self, pe: int, offset: int, op: AmoOp, width: int, operand: int,
            compare: int) -> int:
        """Apply ``op`` on ``pe``'s word (with the domain's atomics there); return the old value."""
        with self._send_lock:
            self._begin(pe)
            self._issue(pe, AMO | (int(op) << 8), offset, 0, operand=operand, compare=compare,
                        width=width)
            return int(self._finish(pe))

    def quiet(self) -> None:
        """Complete the non-blocking transfers (``nbi``) to every PE: consume their answers
        and the device copies they started; raise the first failure among them."""
        if not (self._nbi_pes or self._landing or self._nbi_error):
            return  # (the runtime's every quiet and barrier asks)
        with self._send_lock:
            for pe in sorted(self._nbi_pes):
                if self._pending[pe] and self._broken[pe] is None:
                    self._error = None
                    try:
                        self._finish(pe)
                    except Exception as exc:
                        self._nbi_error = self._nbi_error or exc
            self._nbi_pes.clear()
            if self._landing:
                self._settle()
            error, self._nbi_error = self._nbi_error, None
        if error is not None:
            raise error

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> bool:
        """Stop the proxy thread (peers' requests are no longer served); whether it ended."""
        return self.server.stop()

    def close(self) -> None:
        """Stop the proxy thread and release its endpoints (the mailbox goes with the heap).
        At the end of the job the runtime closes the transports first: closing a context of
        a closed transport releases only what is left."""
        if not self.server.close():  # stuck in a transport call: leak rather than close
            log.warning("%s proxy of PE %d did not stop; its endpoints stay open",
                        self.heap.name, self.me)
            return
        self._send.close()
        # views over the host heap would keep its mapping from being released
        self.words = self._answers = np.zeros(0, np.uint64)
        self.mem = self.stage = memoryview(b"")
        self._stages = []
        self.dops.view = None
