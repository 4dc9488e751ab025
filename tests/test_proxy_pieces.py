"""The GPU proxy's bandwidth path (issue 39 item 4): how a transfer is cut into pieces, and,
on lavapipe at 2 and 4 PEs, pieces sent straight from the CPU-mapped segment (and gets
answered from it) arriving complete and before the signal that follows them
(tests/pe/proxy_pieces.py), over hostproxy, UCX's shared memory and the shm path without
domain import."""

from __future__ import annotations

import pytest
from test_multipe import MODES, launch

from vkshmem.core.proxy.mailbox import CPU_PIECE, MIN_PIECE, PIPELINE, pieces

MIB = 1 << 20


@pytest.mark.parametrize("nbytes", [1, 8, 4096, MIN_PIECE, MIB, MIB + 1, 3 * MIB + 77,
                                    16 * MIB, 64 * MIB + 5])
@pytest.mark.parametrize("chunk", [12 << 10, 256 << 10, 4 * MIB])
@pytest.mark.parametrize("cpu", [False, True])
def test_pieces_cover_the_transfer_in_order(nbytes: int, chunk: int, cpu: bool) -> None:
    cut = pieces(nbytes, chunk, cpu)
    assert [lo for lo, _ in cut] == [sum(p for _, p in cut[:i]) for i in range(len(cut))]
    assert sum(p for _, p in cut) == nbytes and all(p > 0 for _, p in cut)
    cap = min(chunk, CPU_PIECE) if cpu else chunk
    assert max(p for _, p in cut) <= cap
    if nbytes >= PIPELINE * MIN_PIECE:  # a pipeline from 1 MiB
        assert len(cut) >= PIPELINE
    if nbytes <= min(cap, MIN_PIECE):  # small transfers stay one request
        assert len(cut) == 1


PIECE_MODES = {"hostproxy": MODES["hostproxy"], "ucx-sm": MODES["ucx-sm"],
               "shm-noimport": {"VKSHMEM_DOMAIN_IMPORT": "0"}}


@pytest.mark.parametrize("mode", list(PIECE_MODES))
@pytest.mark.parametrize("npes", [2, 4])
def test_pieces_arrive_before_the_signal(npes: int, mode: str) -> None:
    env = {"VKSHMEM_GPU_SYMMETRIC_SIZE": "64M", "VKSHMEM_GPU_VALIDATION": "1",
           "VKSHMEM_GPU_PROXY_CHUNK": "256K", **PIECE_MODES[mode]}
    r = launch("proxy_pieces", npes, env, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("proxy_pieces ok") == npes, r.stdout
