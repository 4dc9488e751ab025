"""The ucx transport allocating the core's host heap in place (rail option ``heap=``): over
UCX's shared memory the segments are UCX's (its posix transport stores and applies CPU
atomics into them), with ``heap=core`` or over tcp they stay the core's memfd; either way
RMA and contended AMOs are exact and the heap survives finalize. Real UCX between processes
under the project's launcher, at 1, 2 and 4 PEs with an outer timeout."""

from __future__ import annotations

import pytest
from test_multipe import MODES, check_run, launch

pytest.importorskip("vkshmem_ucx")

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
