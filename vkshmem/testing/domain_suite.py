"""The memory-domain contract, collected: :class:`DomainContract`, run against one domain.

A memory domain (:class:`~vkshmem.core.domains.contract.MemoryDomain`) gives every PE a second
symmetric
heap; the contract is that the whole API works on its arrays. The tests run PE jobs of 1, 2
and 4 PEs under the launcher (``vkshmem run``), over the shm path and with it off (each of the
transports ``hostproxy`` and ``ucx`` carrying everything, where installed), with the script
``vkshmem/testing/pe/domain_job.py``: puts, gets, strided puts, AMOs, signals, waits and a
reduction on the domain's arrays of every peer. Also: the spec is well formed, a denied
distribution is a clear error, ``vkshmem info`` lists the domain and its variables.

The tests take the fixture ``vkshmem_domain``, a :class:`DomainUnderTest`. The pytest plugin
(``pytest_plugins = ["vkshmem.testing"]``) provides it from ``--vkshmem-domain=NAME`` and
collects the class on its own; a subclass named ``Test...`` may provide it in its body instead.
The PEs find the domain through its entry point: it must be installed.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from vkshmem.core.config import Config
from vkshmem.core.domains.contract import DomainSpec
from vkshmem.core.plugins.apiversion import check_api_version
from vkshmem.core.plugins.loader import load_plugins

from .launch import check_pes, pe_script, run_pes

__all__ = ["DOMAIN_MODES", "DomainContract", "DomainUnderTest"]

#: How the PE jobs reach each other: the shm path, or one transport carrying everything.
DOMAIN_MODES: dict[str, dict[str, str]] = {
    "shm": {"VKSHMEM_SHM": "1"},
    "hostproxy": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "hostproxy"},
    "ucx-sm": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": "posix,cma,self"},
}


@dataclass(frozen=True)
class DomainUnderTest:
    """The memory domain a :class:`DomainContract` checks: its spec, the distribution that
    registers it, and ``env``: more variables for its PE jobs (its own, e.g. a directory)."""

    spec: DomainSpec
    distribution: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: int = 120

    @classmethod
    def from_registry(cls, name: str, **kwargs: Any) -> DomainUnderTest:
        """The domain ``name`` as vkshmem finds it: registered through an entry point of an
        installed distribution (``kwargs``: the other fields)."""
        reg = load_plugins(Config({}))
        if name not in reg.domains:
            raise LookupError(f"no memory domain {name!r} is registered (registered: "
                              f"{', '.join(sorted(reg.domains)) or 'none'}): is the plugin "
                              "installed in this environment?")
        return cls(reg.domains[name], reg.origin.get(name), **kwargs)

    @property
    def name(self) -> str:
        """The domain's name."""
        return self.spec.name

    def installed(self) -> None:
        """Skip the calling test unless the domain comes from an installed distribution."""
        if self.distribution is None:
            pytest.skip(f"domain {self.name} is not installed: the PEs find domains through "
                        "entry points")

    def run(self, npes: int, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        """The contract's PE job on ``npes`` PEs, with ``env`` on top of :attr:`env`."""
        return run_pes(pe_script("domain_job"), npes, {**self.env, **env},
                       timeout=self.timeout, args=[self.name])


def routes_printed(stdout: str, name: str, npes: int) -> list[list[str]]:
    """Each PE's routes to the domain's heaps of every PE, as ``domain_job`` printed them."""
    found: dict[int, list[str]] = {}
    for m in re.finditer(rf"PE (\d+) {re.escape(name)} domain: (\[.*?\])", stdout):
        found[int(m.group(1))] = ast.literal_eval(m.group(2))
    assert sorted(found) == list(range(npes)), stdout
    return [found[pe] for pe in range(npes)]


class DomainContract:
    """The memory-domain contract as tests (see the module docstring); subclass it as
    ``Test...`` with a ``vkshmem_domain`` fixture, or let the pytest plugin collect it.
    :meth:`expected_route` may state the routes exactly."""

    def expected_route(self, mode: str, pe: int, peer: int) -> str | None:
        """The route PE ``pe`` must take to ``peer``'s heap in ``mode`` (None: any)."""
        return "direct" if pe == peer else None

    def test_spec_is_well_formed(self, vkshmem_domain: DomainUnderTest) -> None:
        spec = vkshmem_domain.spec
        assert isinstance(spec, DomainSpec)
        assert spec.name and spec.name.isidentifier() and spec.name not in ("host", "auto")
        assert callable(spec.factory) and spec.family in ("host", "gpu"), spec.family
        assert check_api_version(spec.api_version) is None
        assert spec.memory_kinds <= {"host", "opaque_fd", "cuda_va", "dmabuf"}
        for name, default, meaning in spec.variables:
            assert name.startswith("VKSHMEM_") and isinstance(default, str) and meaning
        if spec.size_variable:
            assert spec.size_variable in {v[0] for v in spec.variables}

    @pytest.mark.parametrize("mode", list(DOMAIN_MODES))
    @pytest.mark.parametrize("npes", [1, 2, 4])
    def test_carries_a_job(self, vkshmem_domain: DomainUnderTest, npes: int, mode: str,
                           ) -> None:
        """Every API call on the domain's arrays reaches every peer (``domain_job``)."""
        vkshmem_domain.installed()
        env = DOMAIN_MODES[mode]
        transport = env.get("VKSHMEM_TRANSPORTS")
        if transport and transport not in load_plugins(Config({})).transports:
            pytest.skip(f"transport {transport} is not installed")
        r = vkshmem_domain.run(npes, env)
        check_pes(r, "domain_job", npes)
        for pe, routes in enumerate(routes_printed(r.stdout, vkshmem_domain.name, npes)):
            assert len(routes) == npes, routes
            for peer, route in enumerate(routes):
                want = self.expected_route(mode, pe, peer)
                assert want is None or route == want, (pe, routes)
                if transport and peer != pe:
                    assert transport in route or "proxy" in route, (pe, routes)

    def test_denied_domain_is_a_clear_error(self, vkshmem_domain: DomainUnderTest) -> None:
        vkshmem_domain.installed()
        r = vkshmem_domain.run(1, {"VKSHMEM_PLUGINS_DENY": str(vkshmem_domain.distribution)})
        assert r.returncode != 0
        assert f"unknown memory domain '{vkshmem_domain.name}'" in r.stderr, r.stderr

    def test_info_lists_the_domain_and_its_variables(self, vkshmem_domain: DomainUnderTest,
                                                     ) -> None:
        vkshmem_domain.installed()
        r = subprocess.run([sys.executable, "-m", "vkshmem", "info", "-n", "2"],
                           capture_output=True, text=True, timeout=vkshmem_domain.timeout,
                           env={**os.environ, **vkshmem_domain.env})
        assert r.returncode == 0, r.stderr
        assert str(vkshmem_domain.distribution) in r.stdout, r.stdout
        assert f"family {vkshmem_domain.spec.family}" in r.stdout, r.stdout
        for name, _, _ in vkshmem_domain.spec.variables:
            assert name in r.stdout, r.stdout
