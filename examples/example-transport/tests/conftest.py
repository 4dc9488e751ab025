"""The example transport's tests run the vkshmem transport contract (:mod:`vkshmem.testing`).

Loading the plugin here and defining ``vkshmem_transport`` is all it takes: pytest then
collects the contract suite next to this file (``tests/vkshmem_contract.py::...``), in one
process and as PE jobs of 1, 2 and 4 PEs under ``vkshmem run``. The fixture states where this
transport legitimately differs: it runs no progress thread. (Without the fixture,
``pytest --vkshmem-transport=example`` would do the same with the defaults.)
"""

from __future__ import annotations

import pytest

# before the import below: the contract's assertions are then rewritten to explain failures
pytest.register_assert_rewrite("vkshmem.testing")

from vkshmem.testing import TransportUnderTest  # noqa: E402

pytest_plugins = ["vkshmem.testing"]


@pytest.fixture
def vkshmem_transport() -> TransportUnderTest:
    """The installed ``example`` transport (the PE jobs find it through its entry point)."""
    return TransportUnderTest.from_registry("example", progress_threads=0)
