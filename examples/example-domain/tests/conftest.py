"""The example domain's tests run the vkshmem memory-domain contract (:mod:`vkshmem.testing`).

Loading the plugin here and defining ``vkshmem_domain`` is all it takes: pytest then collects
the contract suite next to this file (``tests/vkshmem_contract.py::TestDomainContract``): PE
jobs of 1, 2 and 4 PEs under ``vkshmem run``, over the shm path and over the transports
installed. (Without the fixture, ``pytest --vkshmem-domain=file`` would do the same.)
"""

from __future__ import annotations

import pytest

# before the import below: the contract's assertions are then rewritten to explain failures
pytest.register_assert_rewrite("vkshmem.testing")

from vkshmem.testing import DomainUnderTest  # noqa: E402

pytest_plugins = ["vkshmem.testing"]


@pytest.fixture
def vkshmem_domain() -> DomainUnderTest:
    """The installed ``file`` domain (the PEs find it through its entry point)."""
    return DomainUnderTest.from_registry("file")
