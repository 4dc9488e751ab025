"""The ``cuda`` memory domain (plugins/cuda), pip-installed from its folder as a user would.

Everywhere: the plugin is discovered through ``vkshmem.domains``; on a machine without CUDA
(CI) ``domain='gpu'`` still means the Vulkan domain, ``domain='cuda'`` fails with an error
that says why, and ``VKSHMEM_GPU_PROVIDER=cuda`` makes ``domain='gpu'`` fail the same way. On a
machine with NVIDIA GPUs the multi-PE script runs at 1, 2 and 4 PEs, over the imported
mappings and through the domain proxy, and (with the ucx plugin installed) with shm off so
that UCX carries the heap's puts and gets as CUDA memory and the domain proxy its AMOs."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_multipe import MODES, check_run, launch

from vkshmem.core.config import load
from vkshmem.core.plugins import loader as plugins

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



@pytest.mark.parametrize("run", ["mapped", "noimport"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_cuda_stream(cuda_installed: bool, npes: int, run: str) -> None:
    """tests/pe/cuda_stream.py: ``stream=`` on the cuda domain with torch, CuPy (each where
    importable) and cuda-bindings streams: enqueued where the peers' heaps are mapped (the
    call returns while an earlier kernel runs), the stream synchronized where they are not
    (``VKSHMEM_DOMAIN_IMPORT=0``); the same values either way; a stream wait times out into
    WaitTimeoutError (VKSHMEM_WAIT_TIMEOUT=5 here)."""
    if not cuda_installed:
        pytest.skip("no CUDA GPU here (tests/gpu/device_run.sh runs this on one)")
    env = {"VKSHMEM_WAIT_TIMEOUT": "5",
           **({"VKSHMEM_DOMAIN_IMPORT": "0"} if run == "noimport" else {})}
    r = launch("cuda_stream", npes, env, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("cuda_stream ok") == npes, r.stdout
    print("\n".join(line for line in r.stdout.splitlines() if "barrier_all(stream=)" in line))


@pytest.mark.parametrize("cpu_map", ["on", "off"])
@pytest.mark.parametrize("mode", ["shm", "hostproxy"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_cuda_service_multipe(cuda_installed: bool, npes: int, mode: str, cpu_map: str) -> None:
    if not cuda_installed:
        pytest.skip("no CUDA GPU here (tests/gpu/device_run.sh runs this on one)")
    env = {**MODES[mode], "VKSHMEM_CUDA_SERVICE": "on", "VKSHMEM_CUDA_SERVICE_IDLE_US": "2000",
           "VKSHMEM_CUDA_CPU_MAP": cpu_map}
    check_run(launch("cuda_service", npes, env), "cuda_service", npes, mode)


@pytest.mark.parametrize("mode", ["shm", "hostproxy"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_cuda_gpu_initiated(cuda_installed: bool, npes: int, mode: str) -> None:
    """Vulkan kernels on the CUDA heap: each PE's kernel (tests/gpu/shaders/put_signal.comp)
    writes its block and puts it into the next PE's heap with a signal through the request
    ring; the heap is the VMM allocation, imported into Vulkan."""
    if not cuda_installed:
        pytest.skip("no CUDA GPU here (tests/gpu/device_run.sh runs this on one)")
    env = {**MODES[mode], "VKSHMEM_GPU_PROVIDER": "cuda"}
    r = launch("gpu_initiated", npes, env, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_initiated ok") == npes, r.stdout
    assert r.stdout.count("(domain cuda)") == npes, r.stdout


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_cuda_device_api(cuda_installed: bool, npes: int) -> None:
    """tests/pe/cuda_device_api.py: the CUDA device header from a CuPy RawKernel, every call
    at thread/warp/block scope, AMOs, the device barrier, a wait that gives up."""
    if not cuda_installed:
        pytest.skip("no CUDA GPU here (tests/gpu/device_run.sh runs this on one)")
    pytest.importorskip("cupy", reason="the test kernel is a CuPy RawKernel")
    r = launch("cuda_device_api", npes, {"VKSHMEM_GPU_PROVIDER": "cuda"}, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("cuda_device_api ok") == npes, r.stdout


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_cuda_triton(cuda_installed: bool, npes: int) -> None:
    """tests/pe/cuda_triton.py: Triton kernels store into peers through shmem.ptr's views and
    synchronise with vkshmem_cuda.triton_device's signals, AMOs and bounded waits."""
    if not cuda_installed:
        pytest.skip("no CUDA GPU here (tests/gpu/device_run.sh runs this on one)")
    pytest.importorskip("triton", reason="the test kernels are Triton kernels")
    r = launch("cuda_triton", npes, {"VKSHMEM_GPU_PROVIDER": "cuda"}, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("cuda_triton ok") == npes, r.stdout


def test_cuda_device_header_ships_with_the_plugin(cuda_installed: bool) -> None:
    import vkshmem_cuda

    text = (Path(vkshmem_cuda.include_dir()) / "vkshmem_device.cuh").read_text()
    for call in ("vks_ptr", "vks_putmem_block", "vks_getmem_warp", "vks_putmem_signal",
                 "vks_signal_wait_until", "vks_atomic_compare_swap", "vks_barrier_all",
                 "vks_quiet", "vks_my_pe"):
        assert re.search(rf"\b{call}\(", text), call


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_cuda_domain_over_ucx(cuda_installed: bool, npes: int) -> None:
    """tests/pe/cuda_ucx.py: every peer's CUDA heap registered with UCX (route ucx+proxy)."""
    if not cuda_installed:
        pytest.skip("no CUDA GPU here (tests/gpu/device_run.sh runs this on one)")
    pytest.importorskip("vkshmem_ucx", reason="the ucx plugin is not installed (device_run.sh "
                        "installs it where a libucx-cu12 wheel is carried)")
    env = {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx",
           "VKSHMEM_CUDA_SYMMETRIC_SIZE": "256M"}  # UCX_TLS as UCX's default: cuda_copy in
    r = launch("cuda_ucx", npes, env, timeout=300)
    print(r.stdout)  # the routes and PE 0's timings, in the device log (pytest -s / -rA)
    check_run(r, "cuda_ucx", npes, "ucx-sm")
    for pe in range(npes):
        for q in range(npes):
            route = "direct" if q == pe else "ucx+proxy"
            assert f"PE {pe} -> PE {q}: cuda route {route}" in r.stdout, r.stdout


def test_carriage_of_cuda_memory_per_transport(cuda_installed: bool) -> None:
    """What `vkshmem info` says each transport does with the cuda domain's memory: ucx puts and
    gets it (AMOs through the domain proxy), hostproxy leaves it all to the proxy."""
    from vkshmem._info import _carriage

    reg = plugins.load_plugins(load({}))
    text = _carriage(reg.domains["cuda"], reg.transports.values())
    assert text.startswith("memory cuda_va/dmabuf: same-node peers on the same device"), text
    if "ucx" in reg.transports:
        assert "ucx registers it (cuda_va): puts and gets; AMOs through the domain proxy" in text
    assert "hostproxy through the domain proxy" in text, text


def test_every_cuda_variable_is_declared_for_info(cuda_installed: bool) -> None:
    """Each VKSHMEM_CUDA_* variable the plugin's code names is in DomainSpec.variables (what
    `vkshmem info` lists), with its meaning; `vkshmem info` prints them with their values."""
    import vkshmem_cuda

    source = Path(vkshmem_cuda.__file__).parent
    named = {m for f in source.glob("*.py") if f.name != "__init__.py"
             for m in re.findall(r"VKSHMEM_CUDA_[A-Z_]+", f.read_text())}
    declared = {name: doc for name, _default, doc in vkshmem_cuda.SPEC.variables}
    assert named and named <= set(declared), named - set(declared)
    assert all(declared.values()), declared
    r = subprocess.run([sys.executable, "-m", "vkshmem", "info", "-n", "1"], capture_output=True,
                       text=True, timeout=200, env={**os.environ, "VKSHMEM_CUDA_SPIN_US": "7"})
    assert r.returncode == 0, r.stderr
    assert re.search(r"\* VKSHMEM_CUDA_SPIN_US +=\s+7 +\[default 100\]", r.stdout), r.stdout
    assert re.search(r" VKSHMEM_CUDA_CPU_MAP +=\s+\(unset\) +\[default auto\]", r.stdout)


def test_cuda_service_setting_is_checked(cuda_installed: bool) -> None:
    from vkshmem_cuda.service import service_mode

    from vkshmem.core.errors import ConfigError

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VKSHMEM_CUDA_SERVICE", "sometimes")
        with pytest.raises(ConfigError, match="VKSHMEM_CUDA_SERVICE"):
            service_mode()
        mp.setenv("VKSHMEM_CUDA_SERVICE", " ON ")
        assert service_mode() == "on"


def test_cuda_cpu_map_setting_is_checked(cuda_installed: bool) -> None:
    """VKSHMEM_CUDA_CPU_MAP takes auto/on/off (any case) and names itself when wrong; off
    opens no Vulkan device (CpuMaps.open gives None without importing Vulkan)."""
    from vkshmem_cuda.cpumap import CpuMaps, map_mode

    from vkshmem.core.errors import ConfigError

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VKSHMEM_CUDA_CPU_MAP", "yes")
        with pytest.raises(ConfigError, match="VKSHMEM_CUDA_CPU_MAP"):
            map_mode()
        mp.setenv("VKSHMEM_CUDA_CPU_MAP", " Off ")
        assert map_mode() == "off" and CpuMaps.open(0, 1.0) is None
        mp.delenv("VKSHMEM_CUDA_CPU_MAP")
        assert map_mode() == "auto"


def test_link_pieces(cuda_installed: bool) -> None:
    """A CUDA link's piece (the Vulkan domain's, vkshmem_cuda.vulkan_accel): VKSHMEM_GPU_LINK_PIECE
    where set (at least 4 KiB), else a quarter of the copy in 2 MiB steps, 2 to 32 MiB (the
    bounce holds four of the largest)."""
    from vkshmem_cuda.vulkan_accel.bounce import PIECE_MAX, piece_size

    assert piece_size(0, 8) == 2 << 20
    assert piece_size(0, 16 << 20) == 4 << 20
    assert piece_size(0, 72 << 20) == 18 << 20
    assert piece_size(0, 256 << 20) == PIECE_MAX == 32 << 20
    assert piece_size(8 << 20, 1 << 30) == 8 << 20
    assert piece_size(100, 1 << 20) == 4096


def test_vulkan_accelerator_declared(cuda_installed: bool,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The Vulkan domain's NVIDIA accelerations come from this plugin through the entry-point
    group vkshmem.gpu_accelerators; they apply to NVIDIA devices only, and vkshmem info lists
    them."""
    from vkshmem.gpu.accel import _load, installed_accelerators
    from vkshmem.plugin import GpuAccelerator

    _load.cache_clear()
    found = {e.name: e for e in installed_accelerators(load({}))}
    assert found["cuda"].distribution == "vkshmem-cuda", found
    accel = found["cuda"].accelerator
    assert isinstance(accel, GpuAccelerator)

    class Info:
        vendor = "NVIDIA"

    assert accel.applies(Info())
    Info.vendor = "Mesa"
    assert not accel.applies(Info())
    denied = installed_accelerators(load({"VKSHMEM_PLUGINS_DENY": "vkshmem-cuda"}))
    assert [e.accelerator for e in denied if e.name == "cuda"] == [None]
    from vkshmem import _info

    _info._gpu_accelerators(load({}))
    out = capsys.readouterr().out
    assert "cuda " in out and "from vkshmem-cuda" in out, out
    for name, _default, _doc in accel.variables:  # its 8 variables, with their values
        assert name in out, name
    assert len(accel.variables) == 8
