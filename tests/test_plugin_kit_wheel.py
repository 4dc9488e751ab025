"""The plugin kit as a third party gets it: vkshmem built into a wheel and installed into a
fresh virtual environment; each example (transport, memory domain) copied out of the tree,
installed there against that vkshmem, and its own tests run there with ``pytest``: the
contract of :mod:`vkshmem.testing`, collected by its conftest.py, passes (in one process and
as PE jobs under ``vkshmem run``).

Offline: the wheel is built without build isolation, and the new environment reaches
vkshmem's dependencies and pytest through links to this environment's installed copies (a
``.pth`` file naming a folder of links to only those distributions, so that nothing else of
this environment, and not the source tree, is visible there).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from wheelenv import link_distributions as _link_distributions
from wheelenv import run as _run

ROOT = Path(__file__).resolve().parent.parent
#: what the new environment takes from this one: vkshmem's dependencies, pytest, setuptools
DEPENDENCIES = ["numpy", "pluggy", "cffi", "tqdm", "pytest", "setuptools"]
#: the transport contract's tests that must pass there (of the 46 collected; none is skipped)
MIN_CONTRACT_PASSED = 40

pytestmark = pytest.mark.timeout(1500)


def _source_copy(dest: Path) -> Path:
    """The files a wheel of vkshmem is built from, copied (the build writes next to them)."""
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "*.pyc")
    shutil.copytree(ROOT / "vkshmem", dest / "vkshmem", ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


@dataclass(frozen=True)
class Kit:
    """A fresh environment with vkshmem installed from a wheel."""

    python: Path
    site: Path
    env: dict[str, str]
    pip: list[str]

    def run_example(self, name: str, dest: Path) -> str:
        """Copy ``examples/<name>`` to ``dest``, install it, run ``pytest -v`` there (which
        must pass); its output."""
        shutil.copytree(ROOT / "examples" / name, dest,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        _run([*self.pip, "--no-build-isolation", str(dest)], dest, 300, self.env)
        r = subprocess.run([str(self.python), "-m", "pytest", "-v", "-p", "no:cacheprovider"],
                           cwd=dest, capture_output=True, text=True, timeout=900, env=self.env)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        summary = re.search(r"=+ (\d+) passed\b[^=]* in [\d.]+s", out)
        assert summary is not None, out
        assert not re.search(r"\d+ (failed|error)", summary.group(0)), out
        assert "PytestAssertRewriteWarning" not in out, out
        return out


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    """vkshmem as a wheel, built from a copy of the tree, installed into a fresh environment
    that reaches its dependencies (and pytest) through links to those installed here."""
    tmp = tmp_path_factory.mktemp("kit")
    wheels = tmp / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(wheels), str(_source_copy(tmp / "src"))], tmp, 600)
    (wheel,) = wheels.glob("vkshmem-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, 120)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     tmp, 60).stdout.strip())
    _link_distributions(DEPENDENCIES, tmp / "deps")
    (site / "vkshmem-test-deps.pth").write_text(f"{tmp / 'deps'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
           "--no-deps"]
    _run([*pip, str(wheel)], tmp, 300, env)
    where = _run([str(python), "-c", "import vkshmem, vkshmem.testing; print(vkshmem.__file__)"],
                 tmp, 60, env).stdout.strip()
    assert Path(where).is_relative_to(site), where  # the wheel's, not the source tree's
    return Kit(python, site, env, pip)


def test_example_transport_passes_the_contract_against_a_vkshmem_wheel(kit: Kit, tmp_path: Path,
                                                                       ) -> None:
    out = kit.run_example("example-transport", tmp_path / "example-transport")
    passed = re.findall(r"tests/vkshmem_contract\.py::TestTransportContract::(\S+) PASSED", out)
    assert len(passed) >= MIN_CONTRACT_PASSED, out
    assert {"test_carries_a_job[1]", "test_carries_a_job[4]"} <= set(passed), out  # PE jobs
    assert "test_stats_file_counts_operations PASSED" in out, out  # the example's own tests


def test_example_domain_passes_the_contract_against_a_vkshmem_wheel(kit: Kit, tmp_path: Path,
                                                                     ) -> None:
    """Over the shm path (no transport plugin is installed there: those runs are skipped),
    mapped and linked peers."""
    out = kit.run_example("example-domain", tmp_path / "example-domain")
    for suite in ("TestDomainContract", "TestLinkedPeers"):
        passed = re.findall(rf"::{suite}::(\S+) PASSED", out)
        assert {"test_spec_is_well_formed", "test_carries_a_job[1-shm]",
                "test_carries_a_job[4-shm]", "test_denied_domain_is_a_clear_error",
                "test_info_lists_the_domain_and_its_variables"} <= set(passed), out
    assert "test_a_bad_heap_size_is_a_clear_error PASSED" in out, out


def _pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--collect-only", "-q", *args], cwd=folder, capture_output=True,
                          text=True, timeout=120)


def test_the_pytest_plugin_collects_the_suites_a_conftest_asks_for(tmp_path: Path) -> None:
    """In this environment (no wheel): a conftest.py loading the plugin gets the suites named
    by the options next to it, none without, and a usage error for an unknown name."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["vkshmem.testing"]\n')
    r = _pytest_in(tmp_path, "--vkshmem-transport=hostproxy", "--vkshmem-domain=vulkan")
    assert r.returncode == 0, r.stdout + r.stderr
    ids = r.stdout.split()
    assert "vkshmem_contract.py::TestTransportContract::test_carries_a_job[4]" in ids, r.stdout
    assert "vkshmem_contract.py::TestDomainContract::test_carries_a_job[4-shm]" in ids, r.stdout
    assert sum(i.startswith("vkshmem_contract.py::TestTransportContract::") for i in ids) >= 40
    r = _pytest_in(tmp_path)
    assert "vkshmem_contract" not in r.stdout, r.stdout  # nothing named: nothing collected
    r = _pytest_in(tmp_path, "--vkshmem-transport=nosuchnic")
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, r.stdout + r.stderr
    assert "no transport 'nosuchnic' is registered" in r.stderr, r.stderr
