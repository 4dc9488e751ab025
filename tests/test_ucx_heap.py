"""The ucx transport allocating the core's host heap in place (rail option ``heap=``): over
UCX's shared memory the segments are UCX's (its posix transport stores and applies CPU
atomics into them), with ``heap=core`` or over tcp they stay the core's memfd; either way
RMA and contended AMOs are exact and the heap survives finalize. Real UCX between processes
under the project's launcher, at 1, 2 and 4 PEs with an outer timeout, and in one process
(the memfd given back at close; a second transport finds the range taken)."""

from __future__ import annotations

import os

import pytest
from test_multipe import MODES, check_run, launch

pytest.importorskip("vkshmem_ucx")
from test_ucx_unit import SEG_SIZES, TLS, Job, context
from vkshmem_ucx._transport import UcxTransport

pytestmark = pytest.mark.timeout(300)

CASES = {  # name: (mode, rail, segments UCX allocates)
    "sm-auto": ("ucx-sm", "ucx", "0,1"),
    "sm-core": ("ucx-sm", "ucx:heap=core", ""),
    "sm-indirect": ("ucx-sm", "ucx:direct=off", "0,1"),  # UCX's own posix ops, not ours
    "tcp-auto": ("ucx-tcp", "ucx", ""),  # no posix memory domain: registered in place
}


@pytest.mark.parametrize("npes", [1, 2, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_heap_allocated_by_ucx(case: str, npes: int) -> None:
    mode, rail, want = CASES[case]
    env = {**MODES[mode], "VKSHMEM_RAIL0": rail, "UCX_HEAP_WANT": want}
    del env["VKSHMEM_TRANSPORTS"]
    check_run(launch("ucx_heap", npes, env), "ucx_heap", npes, mode)


def test_the_memfd_is_given_back_with_the_bytes_written_meanwhile() -> None:
    with Job(options={"tls": TLS["sm"], "heap": "ucx"}) as job:
        tr0, tr1 = job.t[0]
        assert tr1.stats()["ucx_allocated_segments"] == sorted(SEG_SIZES)
        seg = job.segs[1][0]
        tr0.put(1, 0, 64, memoryview(b"direct!!"))
        assert bytes(job.mem(1)[64:72]) == b"direct!!"  # at the core's address: UCX's memory
        assert os.pread(seg.fd, 8, 64) == bytes(8)  # not the memfd's while UCX holds it
        other = UcxTransport(context(1, 2, options={"tls": TLS["sm"], "heap": "ucx"}))
        try:  # another transport of the process must not allocate over it
            other.register(seg.info())
            assert other.stats()["ucx_allocated_segments"] == []
        finally:
            other.close()
        tr0.close()
        tr1.close()
        assert os.pread(seg.fd, 8, 64) == b"direct!!"  # the memfd has the bytes
        job.mem(1)[72:80] = b"memfd..."  # and is mapped at the same address again
        assert os.pread(seg.fd, 8, 72) == b"memfd..."
