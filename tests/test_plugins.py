"""The plugin system: a real out-of-tree transport installed with pip from its folder is
discovered, selectable and carries traffic; the load policy (allow/deny, broken plugins,
strict mode, API versions) is checked with entry points made up in the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from vkshmem.core.config import load
from vkshmem.core.errors import PluginError
from vkshmem.core.plugins import loader as plugins

ROOT = Path(__file__).parent.parent
PE_DIR = Path(__file__).parent / "pe"
EXAMPLE = ROOT / "examples" / "example-transport"


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, timeout=300,
                   capture_output=True)


@pytest.fixture(scope="module")
def example_installed() -> Iterator[None]:
    """Install the example plugin (not editable: as a user would) and remove it afterwards."""
    _pip("install", "--no-deps", "--no-build-isolation", str(EXAMPLE))
    try:
        yield
    finally:
        _pip("uninstall", "-y", "vkshmem-example-transport")


def _run(args: list[str], env: dict[str, str], timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vkshmem", *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "VKSHMEM_SYMMETRIC_SIZE": "64M", **env})


def test_discovered_through_its_entry_point(example_installed: None) -> None:
    import importlib

    from vkshmem.core.transports.contract import AmoOp

    importlib.invalidate_caches()
    reg = plugins.load_plugins(load({}))
    spec = reg.transports["example"]
    assert reg.origin["example"] == "vkshmem-example-transport"
    assert spec.factory.__name__ == "ExampleTransport"
    assert spec.reach == {"intra"} and spec.amo_ops == set(AmoOp)


def test_info_lists_the_installed_plugin(example_installed: None) -> None:
    r = _run(["info", "-n", "2"], {})
    assert r.returncode == 0, r.stderr
    assert "vkshmem-example-transport" in r.stdout
    assert "-> example" in r.stdout and "-> hostproxy" in r.stdout
    assert "PE 0 -> PE 1: shm" in r.stdout and "VKSHMEM_SYMMETRIC_SIZE" in r.stdout


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_example_plugin_carries_traffic(example_installed: None, tmp_path: Path,
                                        npes: int) -> None:
    stats = tmp_path / "stats"
    env = {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "example",
           "VKSHMEM_RAIL0": f"example:stats={stats}"}
    r = _run(["run", "-n", str(npes), "--timeout", "100", str(PE_DIR / "amo.py")], env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("routes: ['example']") == npes, r.stdout
    for pe in range(npes):
        counts = json.loads(Path(f"{stats}.{pe}").read_text())
        assert counts["amos"] > 1000, counts
        assert counts["gets"] > 0 or npes == 1, counts  # allocation checks read a neighbour


def test_denied_plugin_cannot_be_named(example_installed: None) -> None:
    env = {"VKSHMEM_TRANSPORTS": "example", "VKSHMEM_PLUGINS_DENY": "vkshmem-example-transport"}
    r = _run(["run", "-n", "1", "--timeout", "60", str(PE_DIR / "amo.py")], env)
    assert r.returncode != 0
    assert "VKSHMEM_TRANSPORTS" in r.stderr and "example" in r.stderr


def test_unknown_transport_is_an_error_not_a_fallback() -> None:
    r = _run(["run", "-n", "2", "--timeout", "60", str(PE_DIR / "amo.py")],
             {"VKSHMEM_TRANSPORTS": "nosuchnic"})
    assert r.returncode != 0
    assert "nosuchnic" in r.stderr and "VKSHMEM_TRANSPORTS" in r.stderr
    r = _run(["run", "-n", "2", "--timeout", "60", str(PE_DIR / "amo.py")],
             {"VKSHMEM_RAIL0": "nosuchnic:dev=mlx5_0"})
    assert r.returncode != 0 and "VKSHMEM_RAIL0" in r.stderr


# -- load policy, with made-up entry points ------------------------------------------------

GOOD = "vkshmem_hostproxy"


def _fake(monkeypatch: pytest.MonkeyPatch, eps: list[metadata.EntryPoint]) -> None:
    def entry_points(group: str) -> list[metadata.EntryPoint]:
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr(plugins.metadata, "entry_points", entry_points)


def _ep(name: str, value: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name, value, "vkshmem.transports")


def test_broken_plugin_is_skipped_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, [_ep("broken", "no_such_module_xyz"), _ep("hostproxy", GOOD)])
    with pytest.warns(RuntimeWarning, match="broken.*failed to load"):
        reg = plugins.load_plugins(load({}))
    assert "hostproxy" in reg.transports
    assert [p.status[:6] for p in reg.plugins] == ["failed", "loaded"]


def test_strict_mode_makes_a_broken_plugin_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, [_ep("broken", "no_such_module_xyz")])
    with pytest.raises(PluginError, match="VKSHMEM_PLUGINS_STRICT"):
        plugins.load_plugins(load({"VKSHMEM_PLUGINS_STRICT": "1"}))


def test_allow_and_deny(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, [_ep("hostproxy", GOOD)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not plugins.load_plugins(load({"VKSHMEM_PLUGINS_DENY": "hostproxy"})).transports
        assert not plugins.load_plugins(load({"VKSHMEM_PLUGINS_ALLOW": "other"})).transports
        assert plugins.load_plugins(load({"VKSHMEM_PLUGINS_ALLOW": "hostproxy"})).transports


def test_wrong_api_version_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mod = tmp_path / "future_nic.py"
    mod.write_text(
        "from vkshmem.core.plugins.hookspecs import hookimpl\n"
        "from vkshmem.core.transports.contract import TransportSpec\n"
        "@hookimpl\n"
        "def register_transports(register):\n"
        "    register(TransportSpec(name='future', factory=None, api_version=99))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _fake(monkeypatch, [_ep("future", "future_nic")])
    with pytest.warns(RuntimeWarning, match=r"built for plugin API 99\.0, this vkshmem implements "
                      r"1\.\d+ \(another major"):
        reg = plugins.load_plugins(load({}))
    assert "future" not in reg.transports


@pytest.mark.parametrize(("declared", "refused"), [
    ("1.0", None), (1, None), ("1.99", "newer than the"), ("2.0", "another major version"),
    ("x", "not a plugin API version"),
])
def test_plugin_api_version_is_semantic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        declared: object, refused: str | None) -> None:
    name = f"versioned_nic_{abs(hash(repr(declared)))}"  # a module of its own for each case
    (tmp_path / f"{name}.py").write_text(
        "from vkshmem.plugin import TransportSpec, hookimpl\n"
        "@hookimpl\n"
        "def register_transports(register):\n"
        f"    register(TransportSpec(name='versioned', factory=None, api_version={declared!r}))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _fake(monkeypatch, [_ep("versioned", name)])
    if refused is None:
        assert "versioned" in plugins.load_plugins(load({})).transports
        return
    with pytest.warns(RuntimeWarning, match=refused):
        reg = plugins.load_plugins(load({}))
    assert "versioned" not in reg.transports
