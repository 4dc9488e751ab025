"""What is the ``file`` domain's own: linked peers (``VKSHMEM_FILE_DOMAIN_LINK``) run the whole
contract again through a :class:`~vkshmem.testing.DomainContract` subclass, and a bad heap size
is a clear error."""

from __future__ import annotations

import pytest

from vkshmem.testing import DomainContract, DomainUnderTest


class TestLinkedPeers(DomainContract):
    """Same-node peers linked, not mapped: puts and gets through a FileLink, AMOs through the
    domain proxy (route ``link+proxy`` between PEs of this node, over the shm path)."""

    @pytest.fixture
    def vkshmem_domain(self) -> DomainUnderTest:
        return DomainUnderTest.from_registry("file", env={"VKSHMEM_FILE_DOMAIN_LINK": "1"})

    def expected_route(self, mode: str, pe: int, peer: int) -> str | None:
        if pe == peer:
            return "direct"
        return "link+proxy" if mode == "shm" else None


def test_a_bad_heap_size_is_a_clear_error() -> None:
    domain = DomainUnderTest.from_registry("file", env={"VKSHMEM_FILE_DOMAIN_SIZE": "12345"})
    r = domain.run(1, {})
    assert r.returncode != 0
    assert "VKSHMEM_FILE_DOMAIN_SIZE" in r.stderr, r.stderr
