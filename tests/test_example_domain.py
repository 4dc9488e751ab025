"""The memory-domain plugin contract through a real out-of-tree domain: the ``file`` domain of
examples/example-domain, pip-installed from its folder as a user would, runs the contract of
:mod:`vkshmem.testing` (:class:`~vkshmem.testing.DomainContract`: puts, gets, AMOs, signals and
collectives at 1, 2 and 4 PEs over the shm path, where peers map each other's file, and with it
off, where hostproxy or UCX carry it), with its routes stated exactly; then what is its own:
linked peers, a transport carrying only RMA, its variables in ``vkshmem info``."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_multipe import MODES, check_run, launch

from vkshmem.core.config import load
from vkshmem.core.plugins import loader as plugins
from vkshmem.testing import DOMAIN_MODES, DomainContract, DomainUnderTest

EXAMPLE = Path(__file__).parent.parent / "examples" / "example-domain"


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, timeout=300,
                   capture_output=True)


@pytest.fixture(scope="module")
def domain_installed() -> Iterator[None]:
    """Install the example domain (not editable: as a user would); remove it afterwards."""
    _pip("install", "--no-deps", "--no-build-isolation", str(EXAMPLE))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        _pip("uninstall", "-y", "vkshmem-example-domain")


def test_discovered_through_its_entry_point(domain_installed: None) -> None:
    reg = plugins.load_plugins(load({}))
    assert reg.origin["file"] == "vkshmem-example-domain"
    assert reg.domains["file"].family == "host"
    assert sorted(reg.domains) == ["file", "vulkan"]  # the Vulkan domain registers the same way


class TestFileDomainContract(DomainContract):
    """The memory-domain contract on the installed ``file`` domain."""

    @pytest.fixture
    def vkshmem_domain(self, domain_installed: None) -> DomainUnderTest:
        return DomainUnderTest.from_registry("file")

    def expected_route(self, mode: str, pe: int, peer: int) -> str | None:
        """Peers map each other's file (shm), or the one transport carries it."""
        return "direct" if mode == "shm" or pe == peer else DOMAIN_MODES[mode][
            "VKSHMEM_TRANSPORTS"]


@pytest.mark.parametrize("link", ["1", "amo"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_linked_peers_take_the_domain_link(domain_installed: None, npes: int,
                                           link: str) -> None:
    """Linked same-node peers: puts and gets through the links, AMOs through the proxy
    (``link+proxy``) or, where the links carry them (``amo``), through the links too."""
    env = {**MODES["shm"], "VKSHMEM_FILE_DOMAIN_LINK": link}
    r = launch("domain_link", npes, env)
    check_run(r, "domain_link", npes, "shm")
    for pe in range(npes):
        routes = ["direct" if q == pe else ("link" if link == "amo" else "link+proxy")
                  for q in range(npes)]
        assert f"PE {pe} file domain: {routes}" in r.stdout, r.stdout


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_transport_carrying_rma_only_sends_amos_through_the_proxy(domain_installed: None,
                                                                  npes: int) -> None:
    """UCX told to carry no AMOs on domain memory (as on CUDA memory): the routes are
    ``ucx+proxy``, puts and gets take UCX, AMOs the owner's domain proxy."""
    env = {**MODES["ucx-sm"], "VKSHMEM_TRANSPORTS": "", "VKSHMEM_RAIL0": "ucx:domain_amo=proxy"}
    r = launch("domain_split", npes, env)
    check_run(r, "domain_split", npes, "ucx-sm")
    for pe in range(npes):
        routes = ["direct" if q == pe else "ucx+proxy" for q in range(npes)]
        assert f"PE {pe} file domain: {routes}" in r.stdout, r.stdout


def test_info_shows_the_domain_and_its_routes(domain_installed: None) -> None:
    r = subprocess.run([sys.executable, "-m", "vkshmem", "info", "-n", "2"], capture_output=True,
                       text=True, timeout=200,
                       env={**os.environ, "VKSHMEM_FILE_DOMAIN_DIR": tempfile.gettempdir()})
    assert r.returncode == 0, r.stderr
    assert "vkshmem-example-domain" in r.stdout and "family host" in r.stdout
    # the plugin's own variables (DomainSpec.variables), with their values
    assert re.search(rf"\* VKSHMEM_FILE_DOMAIN_DIR += {re.escape(tempfile.gettempdir())} +"
                     r"\[default /dev/shm\]", r.stdout), r.stdout
    assert re.search(r" VKSHMEM_FILE_DOMAIN_LINK += \(unset\) +\[default 0\]", r.stdout)
    assert "PE 0 -> PE 1: file direct" in r.stdout, r.stdout
    assert "PE 1 -> PE 0: vulkan direct" in r.stdout, r.stdout
    text = " ".join(r.stdout.split())  # the carriage statements are wrapped
    # per domain, what each transport does with its memory
    assert "hostproxy registers it (host)" in text, r.stdout  # the file domain: host memory
    assert "hostproxy through the domain proxy" in text, r.stdout  # Vulkan memory
