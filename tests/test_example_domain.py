"""The memory-domain plugin contract through a real out-of-tree domain: the ``file`` domain of
examples/example-domain, pip-installed from its folder as a user would, is discovered, gets a
segment, and carries puts, gets, AMOs, signals and collectives at 1, 2 and 4 PEs — over the
shm path (peers map each other's file) and with it off (transports that register host memory
carry it: hostproxy, UCX)."""

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

from vkshmem.core import plugins
from vkshmem.core.config import load

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


@pytest.mark.parametrize("mode", ["shm", "hostproxy", "ucx-sm"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_file_domain_carries_traffic(domain_installed: None, npes: int, mode: str) -> None:
    r = launch("domain_file", npes, MODES[mode])
    check_run(r, "domain_file", npes, mode)
    want = "direct" if mode == "shm" else MODES[mode]["VKSHMEM_TRANSPORTS"]
    for pe in range(npes):
        routes = ["direct" if q == pe else want for q in range(npes)]
        assert f"PE {pe} file domain: {routes}" in r.stdout, r.stdout


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


def test_denied_domain_is_a_clear_error(domain_installed: None) -> None:
    r = launch("domain_file", 1, {"VKSHMEM_PLUGINS_DENY": "vkshmem-example-domain"})
    assert r.returncode != 0
    assert "unknown memory domain 'file'" in r.stderr, r.stderr


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
