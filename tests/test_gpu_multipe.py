"""The GPU domain across PEs: tests/pe/gpu.py (DeviceArrays, the four CPU/GPU pairs for every
dtype, AMOs, signals, waits and collectives on GPU memory) under ``vkshmem run`` at 1, 2 and 4
PEs, with the Khronos validation layer on (its errors fail the run), over the shm path
(same-device peers import each other's GPU memory) and with it off (every peer's GPU heap is
reached through its GPU proxy over hostproxy or UCX). Runs on lavapipe without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from test_multipe import MODE_PARAMS, MODES, PE_DIR, check_run, launch

GPU_ENV = {"VKSHMEM_GPU_SYMMETRIC_SIZE": "64M", "VKSHMEM_GPU_VALIDATION": "1"}
#: scripts about the Vulkan domain itself (its CUDA import, copier and AMO kernel): they ask
#: for it where another domain (the cuda plugin's) would answer domain='gpu'
VULKAN_ENV = {**GPU_ENV, "VKSHMEM_GPU_PROVIDER": "vulkan"}


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_script(npes: int, mode: str) -> None:
    r = launch("gpu", npes, {**MODES[mode], **GPU_ENV}, timeout=240)
    check_run(r, "gpu", npes, mode)
    gpu = [line for line in r.stdout.splitlines() if "gpu: imported" in line]
    assert len(gpu) == npes, r.stdout
    one_device = len({line.split(" uuid ")[-1] for line in gpu}) == 1
    node_wide = "domain cuda " in gpu[0]  # CUDA VMM heaps map onto every GPU of the node
    if mode == "shm" and (one_device or node_wide):  # everyone imports everyone
        want = f"imported {list(range(npes))}, proxy off"
        assert all(want in line for line in gpu), gpu
    elif mode == "shm":  # one GPU per PE (a multi-GPU machine): the others via the proxy,
        # or links that carry AMOs too (the Vulkan domain's CUDA heaps mapped across GPUs)
        assert all("proxy on" in line or ("proxy off" in line and "(AMOs too)" in line)
                   for line in gpu), gpu
    elif npes > 1:  # the shm path is off: only the PE's own heap is local
        assert all("proxy on" in line for line in gpu), gpu


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_stream_fallback(npes: int) -> None:
    """tests/pe/gpu_stream.py: ``stream=`` on every call where no domain enqueues on the
    stream (the Vulkan domain, host arrays): the user's stream object is synchronized, then
    the blocking call runs; what is no stream is refused naming what is accepted."""
    r = launch("gpu_stream", npes, {**GPU_ENV, "VKSHMEM_GPU_PROVIDER": "vulkan"}, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_stream ok") == npes, r.stdout


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_script_without_domain_import(npes: int) -> None:
    """VKSHMEM_DOMAIN_IMPORT=0 with the shm path on: every peer's GPU heap through its proxy,
    whose pieces go by DMA straight into the peers' mailboxes (as between GPUs of a node)."""
    r = launch("gpu", npes, {**GPU_ENV, "VKSHMEM_DOMAIN_IMPORT": "0"}, timeout=240)
    check_run(r, "gpu", npes, "shm")
    gpu = [line for line in r.stdout.splitlines() if "gpu: imported" in line]
    assert len(gpu) == npes, r.stdout
    want = "proxy on" if npes > 1 else "imported [0], proxy off"
    assert all(want in line for line in gpu), gpu


#: the ring all-reduce's runs: peers through the GPU proxy (shm path on, no imports) at the
#: default threshold; at 4 bytes (small counts leave shares empty); through UCX's transport;
#: over CUDA links (heaps for two 64 MiB arrays: the pair's split round)
RING_RUNS = {"noimport": {"VKSHMEM_DOMAIN_IMPORT": "0"},
             "noimport-small": {"VKSHMEM_DOMAIN_IMPORT": "0", "VKSHMEM_GPU_RING_REDUCE": "4"},
             "ucx-sm": MODES["ucx-sm"],
             "linked": {"VKSHMEM_GPU_PROVIDER": "vulkan", "VKSHMEM_GPU_SYMMETRIC_SIZE": "256M"}}


@pytest.mark.parametrize(("npes", "run"), [(1, "noimport"), (2, "noimport"), (4, "noimport"),
                                           (3, "noimport-small"), (2, "ucx-sm"),
                                           (2, "linked"), (4, "linked")])
def test_gpu_ring_reduce(npes: int, run: str) -> None:
    """All-reduces of GPU arrays between PEs that do not map each other's GPU heaps: the ring
    reduce-scatter + all-gather into the targets from VKSHMEM_GPU_RING_REDUCE bytes, the
    scratch gather below it and in place; exact results, the same bytes on every PE. ``linked``:
    PEs spread over two GPUs or more (the Vulkan domain's CUDA links between them; the script
    checks that the last folds pushed through direct links)."""
    if run == "linked" and _cuda_gpus() < 2:
        pytest.skip("needs two NVIDIA GPUs (PEs on different GPUs are linked, not mapped)")
    r = launch("gpu_ring_reduce", npes, {**GPU_ENV, **RING_RUNS[run]}, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_ring_reduce ok") == npes, r.stdout
    if run == "linked":  # every PE's right neighbour is on the other GPU: its folds pushed
        assert r.stdout.count("folds pushed through a link: 0") == 0, r.stdout
        if npes == 2:  # and two PEs took the pair's round (vkshmem_cuda/vulkan_accel/pair.py)
            assert r.stdout.count("pair rounds: 0") == 0, r.stdout
    rings = 0 if npes == 1 else 12 if run == "noimport-small" else 8
    rings += 3 if (npes, run) == (2, "linked") else 0  # the script's three 64 MiB calls
    team = npes - 1 if npes >= 3 else 0  # PEs 1 .. npes-1 reduce once more, as a team
    assert r.stdout.count(f"ring taken {rings} times") == npes - team, r.stdout
    assert r.stdout.count(f"ring taken {rings + 1} times") == team, r.stdout


#: repeated all-reduces: same-device peers mapped, not mapped (the ring's steps), two GPUs
#: (the pair's round over the Vulkan domain's CUDA link)
AGAIN_RUNS = {"mapped": {}, "noimport": {"VKSHMEM_DOMAIN_IMPORT": "0"},
              "linked": {"VKSHMEM_GPU_PROVIDER": "vulkan"}}


@pytest.mark.parametrize(("npes", "run"), [(1, "mapped"), (2, "mapped"), (4, "mapped"),
                                           (2, "noimport"), (2, "linked")])
def test_gpu_reduce_again(npes: int, run: str) -> None:
    """tests/pe/gpu_reduce_again.py: a repeated GPU all-reduce goes straight to the call the
    first one took (kept where that was one domain call between two barriers); another op,
    size or a destroyed team does not."""
    if run == "linked" and _cuda_gpus() < 2:
        pytest.skip("needs two NVIDIA GPUs (PEs on different GPUs are linked, not mapped)")
    r = launch("gpu_reduce_again", npes, {**GPU_ENV, **AGAIN_RUNS[run]}, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_reduce_again ok") == npes, r.stdout
    kept = r.stdout.count("kept True")
    if run == "linked":  # the pair's round, counted each time
        assert kept == npes and r.stdout.count("pair rounds 0") == 0, r.stdout
    elif run == "noimport" or _cuda_gpus() == 0:  # the ring's steps, the scratch gather
        assert kept == 0, r.stdout
    elif "domain cuda" in r.stdout:  # the cuda domain reduces mapped peers in one call
        assert kept == npes, r.stdout


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_script_unmapped(npes: int) -> None:
    """VKSHMEM_GPU_MAPPED=0: the paths of a discrete GPU (staged copies, shader AMOs, polled
    waits) on lavapipe, with same-device peers importing each other's memory."""
    r = launch("gpu", npes, {**GPU_ENV, "VKSHMEM_GPU_MAPPED": "0"}, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu ok") == npes, r.stdout


@pytest.mark.parametrize("npes", [1, 2])
def test_gpu_cuda_view(npes: int) -> None:
    """DeviceArrays as DLPack tensors on NVIDIA (torch, CuPy, from_dlpack); refused with the
    reason elsewhere."""
    r = launch("gpu_cuda_view", npes, VULKAN_ENV, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_cuda_view ok") == npes, r.stdout


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_cuda_copy(npes: int) -> None:
    """Bulk copies through CUDA on NVIDIA (on Vulkan elsewhere): the bytes land either way."""
    r = launch("gpu_cuda_copy", npes, VULKAN_ENV, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_cuda_copy ok") == npes, r.stdout


@pytest.mark.parametrize("box", ["host", "gpu"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_amo_service(npes: int, box: str) -> None:
    """tests/pe/gpu_amo_service.py: the Vulkan domain's AMOs through the CUDA service kernel
    (forced on, never idle-exiting during the run), parked by Vulkan submissions; NVIDIA
    only. ``box``: requests in pinned host memory (the validation layer on: the heap is not
    CPU-mapped) or in the CPU-mapped heap (validation off)."""
    if _cuda_gpus() == 0:
        pytest.skip("the CUDA service kernel needs an NVIDIA GPU (tests/gpu/device_run.sh)")
    if os.environ.get("VKSHMEM_GPU_PROVIDER", "auto") not in ("auto", "vulkan"):
        pytest.skip("the Vulkan domain's service (VKSHMEM_GPU_PROVIDER picks another domain)")
    env = {**GPU_ENV, "VKSHMEM_GPU_CUDA_SERVICE": "on",
           "VKSHMEM_GPU_CUDA_SERVICE_IDLE_US": "600e6"}
    if box == "gpu":
        env.update(VKSHMEM_GPU_VALIDATION="0", VKSHMEM_TEST_GPU_BOX="1")
    r = launch("gpu_amo_service", npes, env, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_amo_service ok") == npes, r.stdout


def _cuda_gpus() -> int:
    """How many NVIDIA GPUs this machine has (nvidia-smi), 0 without the driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


@pytest.mark.parametrize("heap", ["cuda", "vulkan", "cuda-bar"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_link(npes: int, heap: str) -> None:
    """tests/pe/gpu_link.py: GPU<->GPU and CPU<->GPU transfers of 1 B to 72 MiB with every
    peer. With the Vulkan domain on two or more NVIDIA GPUs (PEs spread over them) every PE
    reaches the other GPUs' PEs through a CUDA link (vkshmem_cuda/vulkan_accel/link.py): the
    peer's heap mapped on this GPU where the heaps are CUDA's (``heap`` cuda,
    VKSHMEM_GPU_CUDA_HEAP=1), through a bounce buffer where they are Vulkan's; elsewhere the
    same bytes go over the direct route. ``cuda-bar``: a CUDA heap without the validation
    layer, so in the CPU-mapped BAR type (VKSHMEM_GPU_BAR=auto), which each PE also maps for
    its small copies across GPUs (vkshmem/gpu/domain/peermap.py)."""
    env = {**GPU_ENV, "VKSHMEM_GPU_SYMMETRIC_SIZE": "256M", "VKSHMEM_GPU_LINK_PIECE": "8M",
           "VKSHMEM_GPU_CUDA_HEAP": "0" if heap == "vulkan" else "1"}
    if heap == "cuda-bar":
        env["VKSHMEM_GPU_VALIDATION"] = "0"
    r = launch("gpu_link", npes, env, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_link ok") == npes, r.stdout
    if npes > 1 and _cuda_gpus() >= 2 and "domain vulkan" in r.stdout:
        assert r.stdout.count("gpu_link: 0 links") == 0, r.stdout
        assert r.stdout.count("(0 direct") == (npes if heap == "vulkan" else 0), r.stdout
        mapped = r.stdout.count(" 0 CPU-mapped)")
        assert mapped == (0 if heap == "cuda-bar" else npes), r.stdout


def test_gpu_validation_errors_fail_the_job() -> None:
    """A deliberate Vulkan misuse under VKSHMEM_GPU_VALIDATION=1 makes finalize fail."""
    r = launch("gpu_invalid", 1, GPU_ENV, timeout=120)
    assert r.returncode != 0, r.stdout
    assert "validation" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_a_silent_gpu_proxy_times_out_naming_the_pe() -> None:
    env = {**GPU_ENV, "VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "hostproxy",
           "VKSHMEM_GPU_TIMEOUT": "2"}
    r = launch("gpu_timeout", 2, env, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "gpu timeout ok" in r.stdout and r.stdout.count("gpu_timeout done") == 2, r.stdout


@pytest.mark.parametrize("mode", ["shm", "hostproxy", "ucx-tcp"])
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_initiated_put_signal(npes: int, mode: str) -> None:
    """Each PE's kernel puts a block into the next PE's GPU heap with a signal, through its
    request ring and ring service; the next PE's host waits on the signal and checks."""
    r = launch("gpu_initiated", npes, {**MODES[mode], **GPU_ENV}, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_initiated ok") == npes, r.stdout


@pytest.mark.parametrize(("npes", "path"), [(1, "direct"), (2, "direct"), (4, "direct"),
                                             (2, "ring"), (4, "ring")])
def test_gpu_device_api(npes: int, path: str) -> None:
    """tests/pe/gpu_direct.py: every call of the device API at thread and workgroup scope,
    kernels waiting for each other, concurrent atomics from kernels and hosts, the device
    barrier, a bounded wait that gives up; by direct loads and stores where the peers' heaps
    are mapped (same device), through the request ring where they are not (no imports)."""
    env = {**VULKAN_ENV, "DIRECT_EXPECTED": "1" if path == "direct" else "0"}
    if path == "ring":
        env.update(MODES["hostproxy"])  # VKSHMEM_SHM=0: no peer heap is imported
    r = launch("gpu_direct", npes, env, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_direct ok") == npes, r.stdout
    if path == "direct":
        assert r.stdout.count(" 0 ring requests") == npes, r.stdout


def test_gpu_device_barrier_on_a_shared_gpu_says_why() -> None:
    """As on NVIDIA, where other PEs' kernels on the GPU run only after this one's: the
    device barrier refuses at once and Launch.wait raises GpuError saying to run one PE per
    GPU (the ring header's shared bit set by the script; every other phase still passes)."""
    env = {**VULKAN_ENV, "DIRECT_EXPECTED": "1", "SIMULATE_SHARED_GPU": "1"}
    r = launch("gpu_direct", 2, env, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_direct ok") == 2, r.stdout


def test_gpu_initiated_unmapped() -> None:
    """VKSHMEM_GPU_MAPPED=0: the ring service's copies are staged on the domain's device while
    the kernels run on the launch device, as on a discrete GPU."""
    r = launch("gpu_initiated", 2, {**GPU_ENV, "VKSHMEM_GPU_MAPPED": "0"}, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_initiated ok") == 2, r.stdout


def test_stale_device_arrays_are_refused() -> None:
    """After finalize + init, a DeviceArray of the old heap raises instead of writing into the
    new heap at the same offset; DeviceArray.view refuses shapes numpy refuses."""
    # plain python, a 1-PE job (the launcher's rendezvous takes each rank once)
    env = {**os.environ, **GPU_ENV, "VKSHMEM_SYMMETRIC_SIZE": "64M"}
    r = subprocess.run([sys.executable, str(PE_DIR / "gpu_stale.py")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "gpu_stale ok" in r.stdout, r.stdout


#: the GPU proxy's pipeline: the discrete-GPU paths (batched device copies) over hostproxy,
#: the mapped paths over UCX shared memory, and peers on the shm path that do not import each
#: other's GPU heaps (pieces by DMA straight into the peers' mailboxes; with the heap mapped,
#: as on lavapipe, the target serves them in C: the proxy's native rounds)
PROXY_MODES = {"hostproxy-unmapped": {**MODES["hostproxy"], "VKSHMEM_GPU_MAPPED": "0"},
               "ucx-sm": MODES["ucx-sm"],
               "shm-noimport": {"VKSHMEM_DOMAIN_IMPORT": "0"},
               "shm-noimport-unmapped": {"VKSHMEM_DOMAIN_IMPORT": "0",
                                         "VKSHMEM_GPU_MAPPED": "0"}}


@pytest.mark.parametrize("mode", list(PROXY_MODES))
@pytest.mark.parametrize("npes", [1, 2, 4])
def test_gpu_proxy_pipeline(npes: int, mode: str) -> None:
    """tests/pe/gpu_proxy.py in 12 KiB pieces (above the 8 KiB inline size): transfers of
    many pieces, puts and gets interleaved on one range, every PE targeting PE 0, AMOs right
    after puts; the proxy had DEPTH (3) requests in flight."""
    env = {**GPU_ENV, **PROXY_MODES[mode], "VKSHMEM_GPU_PROXY_CHUNK": "12K"}
    r = launch("gpu_proxy", npes, env, timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_proxy ok") == npes, r.stdout
