"""The ofi transport's dma-buf registration path, run as a script by tests/test_ofi_libfabric2.py
under whichever build of vkshmem_ofi ``PYTHONPATH`` selects (``python tests/ofi_dmabuf.py
PROVIDER``); it prints ``dmabuf ok`` or ``dmabuf refused: <message>``, or fails.

PE 1 registers a segment of kind ``"dmabuf"`` whose dma-buf fd is a memfd (this machine has no
GPU and no /dev/udmabuf; libfabric's util providers — tcp, shm — register a dma-buf by its
``base_addr + offset``, so a memfd mapped there stands in for a GPU heap's exported fd), through
``fi_mr_regattr`` with ``FI_MR_DMABUF``; PE 0 then puts, gets and adds through the key it gave,
and the bytes must land in PE 1's mapping. Only PE 0 initiates (libfabric 2.5's shm provider
crashes when two endpoints of one process address each other both ways; PEs are processes).
"""

from __future__ import annotations

import struct
import sys

from vkshmem_ofi._ofi import lib
from vkshmem_ofi._transport import OfiTransport

from vkshmem.core.errors import TransportError
from vkshmem.core.transports.contract import AmoOp, PeerInfo, SegmentInfo
from vkshmem.testing import Segment
from vkshmem.testing.transport import Job

SEG = 5
SIZE = 1 << 16


class OfiJob(Job[OfiTransport]):
    transport = OfiTransport
    seg_sizes = {0: 1 << 16}


def main(provider: str) -> None:
    assert lib.vko_has_dmabuf() == 1, "this build has no FI_MR_DMABUF path"
    seg = Segment(SEG, SIZE)
    with OfiJob(options={"provider": provider}) as job:
        t0, t1 = job.t[0]
        info = SegmentInfo(SEG, "dmabuf", seg.address, SIZE, seg.fd, seg.view, dmabuf_fd=seg.fd)
        try:
            blob = t1.register(info)
        except TransportError as exc:
            print(f"dmabuf refused: {exc}")
            seg.close()
            return
        t0.connect({1: PeerInfo(1, "node0", True, t1.address(), {SEG: blob})})
        data = bytes(range(256)) * 16
        t0.put(1, SEG, 4096, memoryview(data))
        t0.quiet()
        assert seg.view[4096:4096 + len(data)] == data
        out = bytearray(len(data))
        t0.get(1, SEG, 4096, memoryview(out))
        assert out == data
        t0.amo(1, SEG, 0, AmoOp.ADD, 8, 5, 0, False)
        t0.quiet()
        assert t0.amo(1, SEG, 0, AmoOp.ADD, 8, 2, 0, True) == 5
        assert struct.unpack_from("<Q", seg.view, 0)[0] == 7
    seg.close()
    print("dmabuf ok")


if __name__ == "__main__":
    main(sys.argv[1])
