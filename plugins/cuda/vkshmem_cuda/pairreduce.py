"""The all-reduce of two PEs on two GPUs (NVLink or PCIe peers): push, then reduce locally.

Each PE owns half of the elements (its *share*). Instead of a kernel that reads the peer's
source over the link (SM loads across NVLink keep the link less busy than the copy engine),
each PE's copy engine first pushes its source's part of the *peer's* share into the peer's
target, then writes a flag word in the peer's heap (``cuStreamWriteValue32``, ordered after
the copy); each PE's stream waits for its own flag (``cuStreamWaitValue32``: no host round
trip between the phases), then one kernel reduces its share from local memory (its source
and the pushed part in its target) into its target and the peer's. Every byte still crosses
the link once each way. Measured on 2 x H100 NVLink (tests/gpu/allreduce_probe.py, the GPUs'
time for 256 MiB of float32): 0.93 of one 256 MiB peer copy, against 0.87 for the share
kernel; splitting the phases into pipelined chunks only lost (the link is the bottleneck of
both phases).

The flag word lives in the heap's control granule (beyond the usable segment, see
:class:`~.domain.CudaDomain`); both PEs take this path for the same calls (the decision
depends only on the members), so one counter per domain numbers the rounds alike on both.
Waits are bounded by ``VKSHMEM_GPU_TIMEOUT``: a peer that never pushes (it failed) releases
this PE's stream by writing its own flag, and the call raises.
"""

from __future__ import annotations

import time

import numpy as np

from vkshmem.core.errors import WaitTimeoutError

from .driver import Device, Mapping, check

__all__ = ["PairReduce"]

_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*flag - value) >= 0, wrap-around safe


class PairReduce:
    """The two-GPU all-reduce of one domain (see the module docstring). ``flag`` is the
    device address of this PE's flag word; ``timeout`` seconds bound each wait."""

    def __init__(self, device: Device, flag: int, timeout: float) -> None:
        self.device = device
        self.flag = flag
        self.timeout = timeout
        self.rounds = 0
        cu = device.cu
        device.current()
        #: its own stream: a wait on the peer's flag holds no other operation of the domain
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                            "cuStreamCreate")

    def run(self, me: int, dst: tuple[int, int], src: tuple[int, int], peer_flag: int,
            count: int, share: int, op: str, dtype: np.dtype) -> None:
        """Collective over the pair: ``dst``/``src`` are (this PE's, the peer's) device
        addresses of the target and the source, ``me`` this PE's index (0 or 1) in the
        members' order, ``share`` the elements each index owns (the last one the rest)."""
        isz = np.dtype(dtype).itemsize
        lo, hi = me * share, min(count, (me + 1) * share)
        plo, phi = (1 - me) * share, min(count, (2 - me) * share)
        self.rounds += 1
        seq = self.rounds & 0xFFFFFFFF or 1
        cu, dev = self.device.cu, self.device
        stream = int(self.stream)
        dev.current()
        if phi > plo:  # my source's part of the peer's share, into the peer's target
            dev.copy_on(stream, dst[1] + plo * isz, src[0] + plo * isz, (phi - plo) * isz)
        check(cu.cuStreamWriteValue32(stream, peer_flag, seq, 0), "cuStreamWriteValue32")
        check(cu.cuStreamWaitValue32(stream, self.flag, seq, _GEQ), "cuStreamWaitValue32")
        if hi > lo:  # the peer's part is in my target now: fold it with mine, members' order
            mine, pushed = src[0] + lo * isz, dst[0] + lo * isz
            dev.reduce([dst[0] + lo * isz, dst[1] + lo * isz],
                       [mine, pushed] if me == 0 else [pushed, mine], hi - lo, op, dtype,
                       stream=stream)
        self._wait(stream, seq)

    def _wait(self, stream: int, seq: int) -> None:
        """Poll the stream until done: spin for 2 ms, then nap a fiftieth of the time waited
        so far (at most 200 us: a late return costs about 2 %), until the timeout."""
        cu = self.device.cu
        start = time.monotonic()
        deadline = start + self.timeout
        while True:
            res = cu.cuStreamQuery(stream)[0]
            if res == cu.CUresult.CUDA_SUCCESS:
                return
            if res != cu.CUresult.CUDA_ERROR_NOT_READY:
                check((res,), "the pair all-reduce")
            now = time.monotonic()
            if now >= deadline:
                break
            if now - start > 0.002:
                time.sleep(min(2e-4, (now - start) / 50))
        # the peer never pushed: release the stream by writing the flag here, let it drain
        # (its kernel folds whatever this PE's target holds: the target is undefined after
        # this error), and say so
        check(cu.cuMemsetD32(self.flag, seq, 1), "cuMemsetD32 (releasing the stream)")
        cu.cuStreamSynchronize(stream)
        raise WaitTimeoutError(
            f"the two-GPU all-reduce waited {self.timeout:g} s for the peer's push (it failed "
            "or took another path); VKSHMEM_GPU_TIMEOUT sets the limit")

    def close(self) -> None:
        """Destroy the stream (the domain's close, before the heap goes)."""
        if self.stream is not None:
            self.device.current()
            self.device.cu.cuStreamDestroy(self.stream)
            self.stream = None


def pair_members(sources: list[tuple[Mapping, int]], local: Mapping) -> int:
    """This PE's index when ``sources`` are two members, this PE and a peer on another GPU
    (imported with ``remote_gpu``), else -1."""
    if len(sources) != 2:
        return -1
    (first, _), (second, _) = sources
    if first is local and second.remote_gpu:
        return 0
    if second is local and first.remote_gpu:
        return 1
    return -1
