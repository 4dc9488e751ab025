"""``VKSHMEM_OFI_PREFIX``: the OFI plugin's binding built against a libfabric in another prefix
(here a site-style prefix whose include/ and lib/ lead to Debian's libfabric-dev files), so the
build finds the headers and library there, records an rpath to it and says what it was built
with; a prefix without libfabric fails with an error naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parent.parent / "plugins" / "ofi" / "vkshmem_ofi" / "_ofi_build.py"
SYSTEM = Path("/usr/include/rdma/fabric.h")
MULTIARCH = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
LIB = Path("/usr/lib") / MULTIARCH / "libfabric.so"

pytestmark = pytest.mark.skipif(not SYSTEM.exists() or not LIB.exists(),
                                reason="Debian's libfabric-dev is not installed")

_COMPILE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("b", sys.argv[1])
b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
print(b.ffibuilder.compile(tmpdir=sys.argv[2]))
"""


def _build(prefix: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VKSHMEM_OFI_PREFIX": str(prefix)}
    return subprocess.run([sys.executable, "-c", _COMPILE, str(BUILD), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_site_prefix_is_built_against_with_an_rpath(tmp_path: Path) -> None:
    prefix = tmp_path / "site-libfabric"
    (prefix / "include").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "include" / "rdma").symlink_to(SYSTEM.parent)
    (prefix / "lib" / "libfabric.so").symlink_to(LIB.resolve())
    (prefix / "lib" / LIB.resolve().name).symlink_to(LIB.resolve())
    r = _build(prefix, tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    module = Path(r.stdout.strip().splitlines()[-1])
    assert module.exists()
    dyn = subprocess.run(["readelf", "-d", str(module)], capture_output=True, text=True,
                         check=True).stdout
    rpath = [line for line in dyn.splitlines() if "(RPATH)" in line]  # --disable-new-dtags
    assert rpath and str(prefix / "lib") in rpath[0], dyn
    # the module is named vkshmem_ofi._ofi: load it under that name from the build folder
    pkg = tmp_path / "load" / "vkshmem_ofi"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / module.name).symlink_to(module)
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); from vkshmem_ofi._ofi import ffi, "
             "lib; print(ffi.string(lib.vko_built_with()).decode())")
    got = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "load")],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == f"the libfabric in {prefix}"


def test_a_prefix_without_libfabric_names_the_variable(tmp_path: Path) -> None:
    r = _build(tmp_path / "nothing-here", tmp_path / "out")
    assert r.returncode != 0
    assert "VKSHMEM_OFI_PREFIX" in r.stderr and "libfabric-dev" in r.stderr
