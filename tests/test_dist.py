"""The release artifacts as a user gets them (issue 41): ``scripts/dist.sh`` builds a wheel and
an sdist of vkshmem and of every plugin; ``vkshmem[ucx,ofi]`` and ``vkshmem-hostproxy`` are
installed from that directory alone (``--no-index --find-links``) into a fresh virtual
environment whose ``PATH`` has no compiler, and, from a folder outside the source tree, a 2-PE
job (put, get, AMOs, barrier) runs over the shm path, hostproxy, UCX and libfabric, and
``vkshmem doctor`` passes.

Offline: the third-party distributions vkshmem and the plugins require (numpy, cffi, pluggy,
tqdm, libucx-cu12) are this environment's installed copies, linked into the new environment's
site-packages (tests/wheelenv.py), where pip finds them installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from wheelenv import clean_env, link_distributions, make_venv, pip_install, run

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[1]
PLUGINS = ("hostproxy", "ucx", "ofi", "verbs", "cuda")
#: what the new environment takes from this one (pip finds them installed there)
DEPENDENCIES = ["numpy", "pluggy", "cffi", "tqdm", "libucx-cu12"]
#: the tools the job's PATH offers besides the environment's bin (no compiler among them)
TOOLS = ("env", "sh")
COMPILERS = ("gcc", "cc", "c99", "clang", "tcc", "x86_64-linux-gnu-gcc", "ld")

# what setup.sh builds here: without one of them (its system library), dist.sh cannot build all
for _module in ("vkshmem_hostproxy", "vkshmem_ucx", "vkshmem_ofi", "vkshmem_verbs"):
    pytest.importorskip(_module)

MODES = {
    "shm": {},
    "hostproxy": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "hostproxy"},
    "ucx": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": "tcp,self",
            "VKSHMEM_UCX_TRUSTED_NETWORK": "1"},
    "ofi": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ofi", "VKSHMEM_OFI_PROVIDER": "tcp;ofi_rxm"},
}

JOB = """
import json
import numpy as np
import vkshmem
from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right = (me + 1) % n
src = np.arange(1000, dtype=np.int64) + 1000 * me
dst = shmem.zeros(1000, np.int64)
ctr = shmem.zeros(1, np.int64)
shmem.barrier_all()
shmem.put(dst, src, right)                      # to the right neighbour
shmem.barrier_all()
assert (dst == np.arange(1000) + 1000 * ((me - 1) % n)).all(), dst[:4]
got = np.empty(1000, np.int64)
shmem.get(got, dst, right)                      # what the right neighbour received: mine
assert (got == src).all(), got[:4]
seen = [shmem.atomic_fetch_add(ctr, 1, 0) for _ in range(50)]
shmem.atomic_add(ctr, 10, 0)
assert len(set(seen)) == 50, seen
shmem.barrier_all()
if me == 0:
    assert int(ctr[0]) == 60 * n, ctr
shmem.barrier_all()
assert shmem.atomic_compare_swap(ctr, 60 * n, -1, 0) in (60 * n, -1)
shmem.barrier_all()
assert shmem.atomic_fetch(ctr, 0) == -1
routes = sorted({r.name for r in shmem._state.rt.routing.routes})
extra = ""
if "ucx" in routes:
    from vkshmem_ucx._library import build_info
    extra = build_info()
print("RESULT", json.dumps({"pe": me, "version": vkshmem.__version__, "file": vkshmem.__file__,
                        "routes": routes, "ucx": extra}))
shmem.barrier_all()
"""


@dataclass(frozen=True)
class Release:
    """The built artifacts and the environment they were installed into."""

    dist: Path
    python: Path
    bin: Path
    site: Path
    env: dict[str, str]
    cwd: Path


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    tmp = tmp_path_factory.mktemp("dist")
    dist = tmp / "wheels"
    out = run(["bash", ROOT / "scripts" / "dist.sh", dist], ROOT, 600,
              {**os.environ, "PYTHON": sys.executable}).stdout
    assert f"dist: {2 * (1 + len(PLUGINS))} artifacts in {dist}" in out, out
    venv = tmp / "venv"
    python, site = make_venv(venv)
    # in site-packages itself: vkshmem-ucx finds UCX beside it ($ORIGIN/../libucx/lib)
    link_distributions(DEPENDENCIES, site)
    tools = tmp / "tools"
    tools.mkdir()
    for tool in TOOLS:
        where = shutil.which(tool)
        assert where is not None, tool
        (tools / tool).symlink_to(where)
    env = clean_env(os.pathsep.join([str(venv / "bin"), str(tools)]))
    cwd = tmp / "job"  # outside the source tree, which is then nowhere on sys.path
    cwd.mkdir()
    run([*pip_install(python), "--find-links", dist, "vkshmem[ucx,ofi]", "vkshmem-hostproxy"],
        cwd, 300, env)
    return Release(dist, python, venv / "bin", site, env, cwd)


def test_dist_builds_a_wheel_and_an_sdist_of_each_distribution(release: Release) -> None:
    names = sorted(p.name for p in release.dist.iterdir())
    for dist in ["vkshmem", *(f"vkshmem_{p}" for p in PLUGINS)]:
        assert f"{dist}-{VERSION}.tar.gz" in names, names
        assert any(n.startswith(f"{dist}-{VERSION}-") and n.endswith(".whl") for n in names), names
    # the wheels carry their compiled modules, the sdists their C sources
    (ucx,) = release.dist.glob(f"vkshmem_ucx-{VERSION}-*.whl")
    assert any(n.endswith(".so") for n in zipfile.ZipFile(ucx).namelist())
    with tarfile.open(release.dist / f"vkshmem_ucx-{VERSION}.tar.gz") as sdist:
        assert f"vkshmem_ucx-{VERSION}/vkshmem_ucx/csrc/vku.c" in sdist.getnames()
    with zipfile.ZipFile(next(release.dist.glob(f"vkshmem-{VERSION}-*.whl"))) as whl:
        meta = whl.read(f"vkshmem-{VERSION}.dist-info/METADATA").decode()
    for plugin in PLUGINS:  # the extras name the plugin distributions of this release
        assert f"Requires-Dist: vkshmem-{plugin}=={VERSION}; extra == \"{plugin}\"" in meta, meta


def test_the_environment_has_no_compiler_and_the_installed_vkshmem(release: Release) -> None:
    for tool in COMPILERS:
        assert shutil.which(tool, path=release.env["PATH"]) is None, tool
    out = run([release.python, "-c", "import vkshmem, vkshmem_ucx, vkshmem_ofi, "
               "vkshmem_hostproxy; from importlib.metadata import version; "
               "print(vkshmem.__version__, version('vkshmem'), vkshmem.__file__, "
               "vkshmem_ucx.__file__, vkshmem_ofi.__file__, vkshmem_hostproxy.__file__)"],
              release.cwd, 60, release.env).stdout.split()
    assert out[:2] == [VERSION, VERSION], out
    for path in out[2:]:
        assert Path(path).is_relative_to(release.site), out  # the wheels', not the tree's
        assert not Path(path).resolve().is_relative_to(ROOT), out


@pytest.mark.parametrize("mode", list(MODES))
def test_a_two_pe_job_runs_from_the_wheels(release: Release, mode: str) -> None:
    (release.cwd / "job.py").write_text(JOB)
    env = {**release.env, "VKSHMEM_SYMMETRIC_SIZE": "16M", "VKSHMEM_WAIT_TIMEOUT": "30",
           **MODES[mode]}
    r = subprocess.run([release.bin / "vkshmem", "run", "-n", "2", "--timeout", "90", "job.py"],
                       cwd=release.cwd, env=env, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    results = [json.loads(x.split("RESULT ", 1)[1]) for x in r.stdout.splitlines()
               if "RESULT " in x]
    assert sorted(x["pe"] for x in results) == [0, 1], r.stdout + r.stderr
    for x in results:
        assert x["version"] == VERSION and Path(x["file"]).is_relative_to(release.site), x
        assert x["routes"] == ["shm" if mode == "shm" else mode], x
        if mode == "ucx":  # UCX from the libucx-cu12 beside vkshmem-ucx ($ORIGIN/../libucx)
            loaded = os.path.normpath(x["ucx"].rsplit("loaded ", 1)[1])
            assert loaded == str(release.site / "libucx" / "lib" / "libucp.so.0"), x


def test_doctor_passes(release: Release) -> None:
    env = {**release.env, "UCX_TLS": "tcp,self", "VKSHMEM_UCX_TRUSTED_NETWORK": "1"}
    r = subprocess.run([release.bin / "vkshmem", "doctor", "--json", "-q", "--timeout", "60"],
                       cwd=release.cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    status = {c["name"]: c["status"] for c in json.loads(r.stdout)["results"]}
    for name in ("shm", "hostproxy", "ucx", "ofi", "env"):
        assert status.get(name) == "ok", status


def test_the_other_extras_pull_their_plugins_from_the_wheel_directory(release: Release,
                                                                      tmp_path: Path) -> None:
    """``vkshmem[verbs,cuda]``: pip resolves both plugin distributions from the directory (a
    dry run; cuda-bindings, which vkshmem-cuda requires, is linked in for the resolver where
    this environment has it)."""
    extras = {"verbs"}
    env = dict(release.env)
    try:
        link_distributions(["cuda-bindings"], tmp_path / "cuda")
        env["PYTHONPATH"] = str(tmp_path / "cuda")
        extras.add("cuda")
    except metadata.PackageNotFoundError:
        pass
    report = tmp_path / "report.json"
    run([*pip_install(release.python), "--find-links", release.dist, "--dry-run", "--report",
         report, f"vkshmem[{','.join(sorted(extras))}]"], release.cwd, 300, env)
    chosen = {i["metadata"]["name"]: i["metadata"]["version"]
              for i in json.loads(report.read_text())["install"]}
    assert chosen == {f"vkshmem-{x}": VERSION for x in extras}, chosen
