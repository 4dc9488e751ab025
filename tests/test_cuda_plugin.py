"""The ``cuda`` memory domain (plugins/cuda), pip-installed from its folder as a user would.

Everywhere: the plugin is discovered through ``vkshmem.domains``; on a machine without CUDA
(CI) ``domain='gpu'`` still means the Vulkan domain, ``domain='cuda'`` fails with an error
that says why, and ``VKSHMEM_GPU_PROVIDER=cuda`` makes ``domain='gpu'`` fail the same way. On a
machine with NVIDIA GPUs the multi-PE script runs at 1, 2 and 4 PEs, over the imported
mappings and through the domain proxy."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_multipe import MODES, check_run, launch

from vkshmem.core import plugins
from vkshmem.core.config import load

PLUGIN = Path(__file__).parent.parent / "plugins" / "cuda"


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, timeout=600,
                   capture_output=True)


@pytest.fixture(scope="module")
def cuda_installed() -> Iterator[bool]:
    """Install the plugin (and cuda-bindings); yield whether CUDA can open here."""
    _pip("install", "--no-build-isolation", str(PLUGIN))
    importlib.invalidate_caches()
    try:
        from vkshmem_cuda.driver import device_count

        yield device_count() > 0
    finally:
        _pip("uninstall", "-y", "vkshmem-cuda")


def test_discovered_through_its_entry_point(cuda_installed: bool) -> None:
    reg = plugins.load_plugins(load({}))
    assert reg.origin["cuda"] == "vkshmem-cuda"
    spec = reg.domains["cuda"]
    assert spec.family == "gpu" and spec.priority > reg.domains["vulkan"].priority
    assert spec.available is not None and spec.available(load({})) == cuda_installed


def _one_pe(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, **env})


def test_without_cuda_gpu_means_vulkan_and_cuda_says_why(cuda_installed: bool) -> None:
    if cuda_installed:
        pytest.skip("this machine has CUDA")
    code = ("import numpy as np\nfrom vkshmem import shmem\n"
            "a = shmem.zeros(2, np.int64, domain='gpu')\nprint(type(a).__name__)\n"
            "try:\n    shmem.zeros(2, np.int64, domain='cuda')\n"
            "except Exception as exc:\n    print('refused:', type(exc).__name__, exc)\n")
    r = _one_pe(code, {"VKSHMEM_GPU_SYMMETRIC_SIZE": "64M"})
    assert r.returncode == 0, r.stderr
    assert "DeviceArray" in r.stdout, r.stdout
    assert "refused:" in r.stdout and "NVIDIA" in r.stdout, r.stdout
    r = _one_pe(code.split("print(type")[0], {"VKSHMEM_GPU_PROVIDER": "cuda"})
    assert r.returncode != 0
    assert "VKSHMEM_GPU_PROVIDER" in r.stderr and "cuda" in r.stderr, r.stderr


@pytest.mark.parametrize("mode", ["shm", "hostproxy"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_cuda_domain_multipe(cuda_installed: bool, npes: int, mode: str) -> None:
    if not cuda_installed:
        pytest.skip("no CUDA GPU here (tests/gpu/device_run.sh runs this on one)")
    check_run(launch("cuda_domain", npes, MODES[mode]), "cuda_domain", npes, mode)


class _HostExport:
    """A numpy buffer exported through the plugin's DLPack code as a CPU tensor (numpy
    consumes only CPU tensors; CUDA ones are checked on a GPU by tests/pe/cuda_domain.py)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        from vkshmem_cuda.dlpack import KDL_CPU, dlpack_capsule

        return dlpack_capsule(self.data.ctypes.data, self.data.shape, self.data.dtype, 0,
                              self.data, dl_device, copy, device_type=KDL_CPU)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def test_dlpack_capsules_are_consumed_and_released(cuda_installed: bool) -> None:
    import gc

    import numpy as np
    from vkshmem_cuda.dlpack import dtype_code, live_tensors

    before = live_tensors()
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = np.from_dlpack(_HostExport(src))
    assert view.shape == (3, 4) and view.dtype == np.float32
    src[1, 2] = 99.0  # the same memory, no copy
    assert view[1, 2] == 99.0
    assert live_tensors() == before + 1
    del view
    gc.collect()
    assert live_tensors() == before  # numpy called the deleter
    _HostExport(src).__dlpack__()  # a capsule nobody consumes is released when dropped
    gc.collect()
    assert live_tensors() == before
    with pytest.raises(BufferError, match="without a copy"):
        _HostExport(src).__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not"):
        _HostExport(src).__dlpack__(dl_device=(2, 0))
    assert dtype_code(np.dtype(np.complex64)) == (5, 64)
    with pytest.raises(ValueError, match="no type"):
        dtype_code(np.dtype(">i4"))
