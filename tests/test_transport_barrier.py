"""The compiled barrier over transports with a C data path (``Transport.native_ops``): over
hostproxy and UCX (shared memory and tcp), TEAM_WORLD and a split team are NativeTeams whose
barrier adds reach the members through the transport's C functions; real jobs under the
launcher at 1, 2 and 4 PEs with an outer timeout."""

from __future__ import annotations

import pytest
from test_multipe import MODES, check_run, launch

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("npes", [1, 2, 4])
@pytest.mark.parametrize("mode", ["hostproxy", "ucx-sm", "ucx-tcp"])
def test_barrier_over_the_transport(mode: str, npes: int) -> None:
    if mode.startswith("ucx"):
        pytest.importorskip("vkshmem_ucx")
    check_run(launch("transport_barrier", npes, MODES[mode]), "transport_barrier", npes, mode)
