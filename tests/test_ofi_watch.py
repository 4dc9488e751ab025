"""The wake board between the core's long waits and the ofi transport's progress (struct
vk_watch in vkshmem/core/_native.h; vkshmem/core/csrc/fast_watch.c; the plugin's
csrc/vko_native.c: native_watch, csrc/vko.c: poke).

Across processes (tests/pe/ofi_watch.py under the launcher): with ``VKSHMEM_SHM=0`` and the ofi
transport on a provider with manual data progress, a long wait_until sleeps on the board's
futex (about one sleep per millisecond, not one per 50 us) and a peer's AMO ends it through the
target's progress thread (counted as ``woken``); where another path may write the memory (the
shm path) or a transport does not offer the board (hostproxy), waits poll as before. A store by
a thread of the PE itself, which no progress sees, still ends a wait within its slice.

In one process: the ofi table offers ``watch`` (``VK_NATIVE_CAN_WATCH``) only where the
provider's data progress is manual (tcp;ofi_rxm, shm), not where a thread of libfabric applies
peers' writes (sockets)."""

from __future__ import annotations

import pytest
from test_multipe import MODES, launch

pytest.importorskip("vkshmem_ofi")
from test_ofi_native import ops_of
from test_ofi_unit import Job

pytestmark = pytest.mark.timeout(150)

CAN_WATCH = 2  # vkshmem/core/_native.h: VK_NATIVE_CAN_WATCH


@pytest.mark.parametrize("mode,npes", [("ofi-tcp", 1), ("ofi-tcp", 2), ("ofi-tcp", 4),
                                       ("ofi-shm", 2)])
def test_a_long_wait_sleeps_until_the_targets_progress_wakes_it(mode: str, npes: int) -> None:
    r = launch("ofi_watch", npes, {**MODES[mode], "WATCH": "1"})
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("ofi watch ok") == npes, r.stdout


@pytest.mark.parametrize("mode", ["shm", "hostproxy"])
def test_waits_poll_where_a_path_does_not_wake_the_board(mode: str) -> None:
    r = launch("ofi_watch", 2, {**MODES[mode], "WATCH": "0"})
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("ofi watch ok") == 2, r.stdout


@pytest.mark.parametrize("provider,offered", [("tcp;ofi_rxm", True), ("shm", True),
                                              ("sockets", False)])
def test_watch_is_offered_only_with_manual_data_progress(provider: str, offered: bool) -> None:
    with Job(n=1, options={"provider": provider}) as job:
        ops = ops_of(job.t[0][0])
        assert bool(ops.flags & CAN_WATCH) == offered, ops.flags
