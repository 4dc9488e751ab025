"""The native side of the plugin kit (vkshmem.plugin): the shipped header
``vkshmem/include/vkshmem/plugin.h`` (one ABI, one status vocabulary), the build helpers
(header -> cffi cdef, locating a library under a prefix) and the base class of native
transports (held buffers, finalizers, status -> exception)."""

from __future__ import annotations

import ast
import gc
import importlib.util
import re
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from cffi import FFI

from vkshmem.plugin import (
    STATUS,
    AmoOp,
    InvalidArgumentError,
    NativeTransport,
    TransportError,
    get_include,
    header_cdef,
    locate_library,
    plugin_cdef,
    status_message,
)

ROOT = Path(__file__).resolve().parent.parent
HEADER = Path(get_include()) / "vkshmem" / "plugin.h"
NATIVE_PLUGINS = ("hostproxy", "ucx", "ofi", "verbs")
#: every in-tree plugin (cuda: the cuda domain and the Vulkan domain's NVIDIA accelerator)
IN_TREE_PLUGINS = (*NATIVE_PLUGINS, "cuda")


# -- the header ------------------------------------------------------------------------------


def test_the_header_ships_where_get_include_says() -> None:
    assert HEADER == ROOT / "vkshmem" / "include" / "vkshmem" / "plugin.h"
    block = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]")[1]
    patterns = re.findall(r'"([^"]+)"', block.split("\n[")[0])
    assert any(HEADER.relative_to(ROOT / "vkshmem").match(p) for p in patterns), patterns


def test_status_codes_are_one_vocabulary() -> None:
    codes = {k: v for k, v in STATUS.items() if k not in ("OK", "FIRST", "LAST")}
    assert STATUS["OK"] == 0 and len(set(codes.values())) == len(codes)
    assert all(STATUS["LAST"] <= v <= STATUS["FIRST"] for v in codes.values())
    for name in ("PEER", "SEG", "BOUNDS", "ALIGN", "AMO", "CLOSED", "TIMEDOUT", "FAILED"):
        assert status_message(STATUS[name]), name
    assert status_message(-5) is None and status_message(0) is None


def test_amo_op_codes_match_amoop() -> None:
    enum = re.search(r"enum \{ (VK_FETCH = 0[^}]*)\}", HEADER.read_text())
    assert enum is not None
    names = [n.strip().split(" ")[0].removeprefix("VK_") for n in enum[1].split(",")]
    assert names == [op.name for op in sorted(AmoOp, key=int)]


def test_one_definition_of_the_abi() -> None:
    """The core's _native.h includes the shipped header, and no native plugin restates the
    ops table or keeps an error-code range of its own."""
    core = (ROOT / "vkshmem" / "core" / "_native.h").read_text()
    assert '#include "../include/vkshmem/plugin.h"' in core
    assert "struct vk_native_ops {" not in core and "struct vk_watch {" not in core
    for name in NATIVE_PLUGINS:
        for src in (ROOT / "plugins" / name).rglob("csrc/*.[ch]"):
            text = src.read_text()
            assert "struct vk_native_ops {" not in text, src
            assert not re.search(r"#define \w+ \(-[12]\d{3}\)", text), src


def test_plugin_cdef_parses_and_plugins_see_the_codes() -> None:
    ffi = FFI()
    ffi.cdef(plugin_cdef())
    assert ffi.sizeof("struct vk_native_ops") > ffi.sizeof("struct vk_watch")
    checked = 0
    for module in ("vkshmem_hostproxy._server", "vkshmem_ucx._ucx", "vkshmem_ofi._ofi",
                   "vkshmem_verbs._verbs"):
        try:
            lib = importlib.import_module(module).lib
        except ImportError:
            continue
        for name, value in STATUS.items():
            assert getattr(lib, f"VK_ST_{name}") == value, (module, name)
        checked += 1
    assert checked, "no native plugin is built"


# -- imports ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", IN_TREE_PLUGINS)
def test_plugins_import_only_the_kit(name: str) -> None:
    for path in (ROOT / "plugins" / name).rglob("*.py"):
        if "egg-info" in str(path) or "build" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                mods = [f"{node.module}.{a.name}" if node.module == "vkshmem" else node.module
                        for a in node.names]  # from vkshmem import shmem
            else:
                continue
            for mod in mods:
                if mod == "vkshmem" or mod.startswith("vkshmem."):
                    assert mod in ("vkshmem.plugin", "vkshmem.testing", "vkshmem.shmem"), \
                        f"{path.relative_to(ROOT)} imports {mod}"


# -- build helpers ---------------------------------------------------------------------------


def test_header_cdef(tmp_path: Path) -> None:
    h = tmp_path / "mine.h"
    h.write_text("""/* a comment
 * over lines */
#ifndef MINE_H
#define MINE_H
#include <stdint.h>
#include <vkshmem/plugin.h>
#define MINE_LEN 256 /* bytes */
#define MINE_E VK_ST_FAILED
#define OTHER_X 3
#define MINE_MAX(a, b) ((a) > (b) ? (a) : (b))
typedef struct mine mine;
struct opaque;
int mine_call(mine *m, struct opaque *o); // trailing
#endif
""")
    out = header_cdef(h, constants=("MINE_",))
    assert "#define MINE_LEN ..." in out and "#define MINE_E ..." in out
    assert "OTHER_X" not in out and "MINE_MAX" not in out and "MINE_H" not in out
    assert "#include" not in out and "comment" not in out and "trailing" not in out
    assert "struct opaque { ...; };" in out
    assert "#define OTHER_X ..." in header_cdef(h)
    FFI().cdef(out)  # cffi takes it


def _fake_prefix(root: Path, lib_dir: str = "lib") -> Path:
    (root / "include" / "foo").mkdir(parents=True)
    (root / "include" / "foo" / "foo.h").write_text("")
    (root / lib_dir).mkdir(parents=True)
    (root / lib_dir / "libfoo.so").write_text("")
    return root


def test_locate_library_under_a_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = _fake_prefix(tmp_path / "site")
    monkeypatch.setenv("FOO_PREFIX", str(prefix))
    found = locate_library("vkshmem-foo", "foo", "foo/foo.h", prefix_var="FOO_PREFIX")
    assert found.include == prefix / "include" and found.lib == prefix / "lib"
    assert found.rpaths == [str(prefix / "lib")]
    assert found.link_args(["$ORIGIN/x"]) == ["-Wl,--disable-new-dtags", "-Wl,-rpath,$ORIGIN/x",
                                              f"-Wl,-rpath,{prefix / 'lib'}"]
    lib64 = _fake_prefix(tmp_path / "other", "lib64")
    assert locate_library("x", "foo", "foo/foo.h", prefix=lib64).lib == lib64 / "lib64"


def test_locate_library_names_what_is_missing(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOO_PREFIX", str(tmp_path / "nothing"))
    with pytest.raises(RuntimeError, match=r"FOO_PREFIX.*libfoo.*apt-get install foo-dev"):
        locate_library("vkshmem-foo", "foo", "foo/foo.h", prefix_var="FOO_PREFIX",
                       hint="apt-get install foo-dev")


def test_a_default_library_dir_gets_no_rpath() -> None:
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    if not Path("/usr/include/stdio.h").exists() or not any(
            (d / "libc.so").exists() for d in (Path("/usr/lib") / multiarch, Path("/usr/lib"))):
        pytest.skip("no libc development files")
    found = locate_library("libc", "c", "stdio.h", prefix="/usr")
    assert found.rpaths == [] and found.link_args() == ["-Wl,--disable-new-dtags"]


# -- NativeTransport -------------------------------------------------------------------------

_closed: list[int] = []


def _close(handle: int) -> None:
    _closed.append(handle)


class _Native(NativeTransport):
    name = "kit"
    native_timeout = 2.0

    def __init__(self, handle: int = 0) -> None:
        self.native_init()
        self.finalizer = self.own(_close, handle)

    def segment_size(self, pe: int, seg: int) -> int | None:
        return 4096 if seg == 0 else None

    def register(self, segment: Any) -> bytes: return b""
    def address(self) -> bytes: return b""
    def connect(self, peers: Any) -> None: pass
    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None: pass
    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None: pass
    def amo(self, pe: int, seg: int, offset: int, op: AmoOp, width: int, operand: int,
            compare: int, fetch: bool) -> int: return 0
    def fence(self) -> None: pass
    def quiet(self) -> None: pass
    def close(self) -> None: self.finalizer()


def test_held_buffers_and_the_flag() -> None:
    t = _Native()
    flag = FFI().new("int *")
    t.set_held_flag(flag)
    a, b = bytearray(4), bytearray(8)
    t.hold(a)
    assert flag[0] == 1
    t.hold(b)
    assert t.release_held() == [a, b] and flag[0] == 0 and t.release_held() == []
    t.hold(a)
    t.set_held_flag(FFI().new("int *"))
    assert t._held_flag[0] == 1  # a new flag starts as "held"
    t.drop_held()
    assert t.release_held() == [] and t._held_flag is None
    t.bury(a, None)
    assert t._graveyard == [a]


def test_the_finalizer_closes_once() -> None:
    _closed.clear()
    t = _Native(7)
    t.close()
    t.close()
    assert _closed == [7]
    _Native(8)
    gc.collect()
    assert _closed == [7, 8]


def test_status_to_exception() -> None:
    t = _Native()
    st = STATUS
    e = t.status_error(st["CLOSED"], "put to", 1)
    assert isinstance(e, TransportError) and "the transport is closed" in str(e)
    assert "PE 3 is not reachable through kit" in str(t.status_error(st["PEER"], "put to", 3))
    for code, text in ((st["SEG"], "PE 1 has no segment 2 registered"),
                       (st["AMO"], "AMO width 3"), (st["ALIGN"], "offset 6 is not aligned")):
        e = t.status_error(code, "AMO on", 1, 2, 6, 3)
        assert isinstance(e, InvalidArgumentError) and text in str(e), e
    e = t.status_error(st["BOUNDS"], "get from", 1, 0, 4090, 16)
    assert isinstance(e, InvalidArgumentError) and "outside segment 0 of PE 1 (4096" in str(e)
    e = t.status_error(st["TIMEDOUT"], "put to", 1, 0, 8, 4)
    assert "put to PE 1 (segment 0, offset 8, 4 bytes): no completion within 2 s" in str(e)
    assert e.status == status_message(st["TIMEDOUT"])
    assert "abandoned, a PE of the job failed" in str(t.status_error(st["FAILED"], "get from"))
    e = t.status_error(-5, "put to", 1, 0, 0, 1)
    assert "failed" in str(e) and e.status == "status -5"
    assert str(t.status_error(st["TIMEDOUT"], "quiet")).startswith(
        "transport 'kit': quiet: no completion within 2 s")
    assert "fence: an operation failed" in str(t.status_error(-5, "fence"))


def test_native_error_buries_the_buffer_of_an_unfinished_operation() -> None:
    t = _Native()
    buf = bytearray(4)
    t.native_error(STATUS["TIMEDOUT"], "put to", 1, 0, 0, 4, buf)
    t.native_error(STATUS["BOUNDS"], "put to", 1, 0, 0, 4, bytearray(2))
    assert t._graveyard == [buf]


# -- what importing the kit loads; the accelerators' load policy ------------------------------


def test_importing_the_kit_loads_no_gpu_layer() -> None:
    """A transport plugin or a build script importing vkshmem.plugin does not load vkshmem.gpu
    (its names come at first use, PEP 562)."""
    import subprocess
    import sys

    code = ("import vkshmem.plugin, sys; "
            "assert not any(m.startswith('vkshmem.gpu') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('vkshmem.gpu'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_gpu_names_load_at_first_use() -> None:
    import vkshmem.plugin as kit
    from vkshmem.core.config import parse_bool, parse_choice
    from vkshmem.plugin import GpuAccelerator, GpuError  # noqa: F401 - the lazy form works

    for name in ("GpuAccelerator", "DomainAccelerator", "GpuError", "CONTROL_BYTES",
                 "vulkan_initiator", "gpu_settings", "EnvVariable", "parse_variables"):
        assert name in kit.__all__ and name in dir(kit), name
    assert all(hasattr(kit, name) for name in kit.__all__)
    assert kit.parse_bool is parse_bool and kit.parse_choice is parse_choice
    with pytest.raises(AttributeError):
        kit.no_such_name  # noqa: B018
    assert kit.address_of(b"") != 0 and kit.address_of(bytearray(8)) != 0


class _EntryPoint:
    """What the loader reads of an entry point (no distribution: ``?``)."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value, self.dist, self._value = name, f"fake:{name}", None, value

    def load(self) -> Any:
        if isinstance(self._value, Exception):
            raise self._value
        return self._value


def test_accelerators_take_the_plugin_load_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """vkshmem.gpu_accelerators entry points are filtered, refused for another plugin API
    and skipped with the STRICT hint (or an error under VKSHMEM_PLUGINS_STRICT=1) as other
    plugins are."""
    from importlib import metadata

    from vkshmem.core.config import load
    from vkshmem.gpu.accel import ENTRY_POINT_GROUP, GpuAccelerator, _load, installed_accelerators
    from vkshmem.plugin import API_VERSION, PluginError

    class Fake(GpuAccelerator):
        def applies(self, info: Any) -> bool:
            return True

        def attach(self, domain: Any) -> Any:
            raise NotImplementedError

    class Old(Fake):
        api_version = "0.9"

    assert Fake.api_version == API_VERSION
    eps = [_EntryPoint("b_good", Fake()), _EntryPoint("a_broken", RuntimeError("boom")),
           _EntryPoint("c_old", Old()), _EntryPoint("d_denied", Fake())]
    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points", lambda group=None, **kw:
                        eps if group == ENTRY_POINT_GROUP else real(group=group, **kw))
    _load.cache_clear()
    try:
        with pytest.warns(RuntimeWarning) as seen:
            found = installed_accelerators(load({"VKSHMEM_PLUGINS_DENY": "d_denied"}))
        assert [e.name for e in found] == ["a_broken", "b_good", "c_old", "d_denied"]
        status = {e.name: e.status for e in found}
        assert status["a_broken"] == "failed: RuntimeError: boom"
        assert status["b_good"] == "loaded" and found[1].accelerator is eps[0]._value
        assert status["c_old"].startswith("refused: it was built for plugin API 0.9")
        assert status["d_denied"] == "denied (VKSHMEM_PLUGINS_DENY)"
        assert [e.accelerator for e in found if e.name != "b_good"] == [None] * 3
        messages = [str(w.message) for w in seen]
        assert len(messages) == 2 and all("VKSHMEM_PLUGINS_STRICT=1" in m for m in messages)
        with pytest.raises(PluginError, match=r"GPU accelerator 'a_broken' .*boom.*STRICT"):
            installed_accelerators(load({"VKSHMEM_PLUGINS_STRICT": "1"}))
    finally:
        _load.cache_clear()
