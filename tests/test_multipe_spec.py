"""Multi-PE tests of the OpenSHMEM 1.5/1.6 surface: signals, locks, non-blocking AMOs and the
1.6 RMA additions, and the shmem4py/1.6 conformance edge cases of docs/conformance.md
(conform_mem, conform_handles), and re-initialisation after the last finalize (reinit). Each
script under tests/pe runs under ``vkshmem run`` at 1, 2, 3 and 4 PEs, over the shm path and,
with it off, over hostproxy, UCX and libfabric (the modes of test_multipe)."""

from __future__ import annotations

import pytest
from test_multipe import MODE_PARAMS, MODES, check_run, launch

SCRIPTS = ["signals", "lock", "amo_nbi", "conform_mem", "conform_handles", "reinit"]


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("npes", [1, 2, 3, 4])
@pytest.mark.parametrize("script", SCRIPTS)
def test_spec_script(script: str, npes: int, mode: str) -> None:
    check_run(launch(script, npes, MODES[mode]), script, npes, mode)
