"""Unit tests of the config registry."""

from __future__ import annotations

import pytest

from vkshmem.core.config import load, parse_size, registry
from vkshmem.core.errors import ConfigError


@pytest.mark.parametrize("text,value", [("4096", 4096), ("512M", 512 << 20), ("4G", 4 << 30),
                                         ("1.5k", 1536), ("2GiB", 2 << 30), ("64 mb", 64 << 20)])
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_defaults() -> None:
    cfg = load({})
    assert cfg.symmetric_size == 512 << 20
    assert cfg.shm is True and cfg.transports == () and cfg.rails == ()


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="VKSHMEM_SYMMETRIC_SIZE"):
        load({"VKSHMEM_SYMMETRIC_SIZE": "lots"})
    with pytest.raises(ConfigError, match="VKSHMEM_SHM"):
        load({"VKSHMEM_SHM": "maybe"})
    for text in ("inf", "nan", "-1"):  # 0 is "no limit"; inf would overflow a GPU wait's ns
        with pytest.raises(ConfigError, match=r"VKSHMEM_WAIT_TIMEOUT.*0 means no limit"):
            load({"VKSHMEM_WAIT_TIMEOUT": text})
        with pytest.raises(ConfigError, match=r"VKSHMEM_GPU_TIMEOUT.*finite number > 0"):
            load({"VKSHMEM_GPU_TIMEOUT": text})


def test_rails() -> None:
    cfg = load({"VKSHMEM_RAIL0": "hostproxy:addr=127.0.0.1:port=0", "VKSHMEM_RAIL1": "ucx"})
    assert [r.transport for r in cfg.rails] == ["hostproxy", "ucx"]
    assert cfg.rails[0].options == {"addr": "127.0.0.1", "port": "0"}
    with pytest.raises(ConfigError, match="without gaps"):
        load({"VKSHMEM_RAIL1": "ucx"})
    with pytest.raises(ConfigError, match="VKSHMEM_RAIL0"):
        load({"VKSHMEM_RAIL0": "ucx:noequals"})


def test_every_variable_documented_in_readme() -> None:
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for name, var in registry.items():
        assert var.doc
        assert name in readme, f"{name} missing from README"


def test_gpu_proxy_chunk_auto_fits_an_eighth_of_the_heap() -> None:
    from vkshmem.core.proxy.mailbox import DEPTH, Layout
    from vkshmem.core.proxy.protocol import proxy_chunk

    assert load({"VKSHMEM_GPU_PROXY_CHUNK": "auto"}).gpu_proxy_chunk == 0
    assert load({"VKSHMEM_GPU_PROXY_CHUNK": "1M"}).gpu_proxy_chunk == 1 << 20
    assert proxy_chunk(0, 512 << 20, 2) == 4 << 20  # the default heap, two PEs
    assert proxy_chunk(0, 512 << 20, 64) == 256 << 10  # not below 256K while in a quarter
    # 512 PEs: 256K pieces would take 1.5 x the heap; an eighth of it fits 20K pieces
    assert proxy_chunk(0, 512 << 20, 512) == 20 << 10
    assert proxy_chunk(0, 64 << 20, 4096) == 16 << 10  # never below 16K
    for heap, n in ((512 << 20, 16), (512 << 20, 32), (64 << 20, 2), (64 << 20, 4)):
        chunk = proxy_chunk(0, heap, n)
        assert chunk % 4096 == 0 and 256 << 10 <= chunk < 4 << 20, (heap, n, chunk)
        # the mailbox as laid out (2 x DEPTH pieces per PE, their headers, the bells and
        # answers) takes an eighth of the heap, give or take a piece
        size = Layout(n, DEPTH, chunk).size
        assert heap // 8 - 2 * DEPTH * n * 4096 <= size <= heap // 8 + (64 << 10), (heap, n)
    assert proxy_chunk(1 << 20, 8 << 20, 64) == 1 << 20  # what the user set, as set


def test_the_job_secret_is_listed_but_never_shown() -> None:
    secret = "s3cret-" + "x" * 20
    cfg = load({"VKSHMEM_JOB_SECRET": secret, "VKSHMEM_BOOTSTRAP_BIND": "127.0.0.1"})
    shown = dict((var.name, value) for var, value in cfg.items())
    assert shown["VKSHMEM_JOB_SECRET"] == "(set, not shown)"
    assert secret not in " ".join(shown.values())
    assert shown["VKSHMEM_BOOTSTRAP_BIND"] == "127.0.0.1"
    assert shown["VKSHMEM_JOB_SECRET_FILE"] == ""


def test_gpu_variables_are_owned_by_their_component() -> None:
    """The core's registry keeps the GPU variables the core reads itself; the vulkan domain
    declares its own (DomainSpec.variables, which vkshmem info lists), parsed once per process
    (the same parse while the environment is unchanged), and vkshmem-cuda (plugins/cuda) those
    of its accelerations of the vulkan domain: 23 in all, each documented in README.md."""
    import importlib.util
    import sys
    from pathlib import Path

    from vkshmem.gpu.env import settings
    from vkshmem.gpu.plugin import SPEC

    root = Path(__file__).parent.parent
    core = {n for n in registry if n.startswith("VKSHMEM_GPU_")}
    assert core == {"VKSHMEM_GPU_TIMEOUT", "VKSHMEM_GPU_PROVIDER", "VKSHMEM_GPU_NATIVE",
                    "VKSHMEM_GPU_PROXY_CHUNK", "VKSHMEM_GPU_RING_REDUCE"}
    path = root / "plugins" / "cuda" / "vkshmem_cuda" / "vulkan_accel" / "settings.py"
    spec = importlib.util.spec_from_file_location("_cuda_accel_settings", path)
    assert spec is not None and spec.loader is not None
    cuda = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cuda  # for its dataclass
    try:
        spec.loader.exec_module(cuda)
    finally:
        del sys.modules[spec.name]
    vulkan = {name for name, _default, _doc in SPEC.variables}
    accel = {name for name, _default, _doc in cuda.VARIABLES}
    assert len(core | vulkan | accel) == len(core) + len(vulkan) + len(accel) == 23
    readme = (root / "README.md").read_text()
    for name, _default, doc in (*SPEC.variables, *cuda.VARIABLES):
        assert doc and name in readme, f"{name} missing from README"
    env = {"VKSHMEM_GPU_MAPPED": "0", "VKSHMEM_GPU_STAGING_SIZE": "1M"}
    assert settings(env) is settings(dict(env))
    assert not settings(env).mapped and settings(env).staging_size == 1 << 20
    assert settings({}).mapped and settings({}).symmetric_size == 256 << 20
    with pytest.raises(ConfigError, match="VKSHMEM_GPU_BAR"):
        settings({"VKSHMEM_GPU_BAR": "maybe"})
    assert cuda.settings({}) is cuda.settings({}) and cuda.settings({}).copy == 256 << 10
    with pytest.raises(ConfigError, match="VKSHMEM_GPU_CUDA_SERVICE"):
        cuda.settings({"VKSHMEM_GPU_CUDA_SERVICE": "sometimes"})


def test_gpu_env_seconds_are_finite(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Vulkan layer's own reads (a VulkanDevice without a runtime) refuse what the
    registry refuses: a wait's nanoseconds must be an integer."""
    from vkshmem.gpu.env import env_float

    monkeypatch.setenv("VKSHMEM_GPU_TIMEOUT", "2.5")
    assert env_float("VKSHMEM_GPU_TIMEOUT", 30.0) == 2.5
    for text in ("inf", "nan", "-3", "soon"):
        monkeypatch.setenv("VKSHMEM_GPU_TIMEOUT", text)
        with pytest.raises(ConfigError, match="VKSHMEM_GPU_TIMEOUT"):
            env_float("VKSHMEM_GPU_TIMEOUT", 30.0)
