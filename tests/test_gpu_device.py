"""The Vulkan layer on lavapipe, validation layer on: device, memory, copies, export/import.

Each test has a timeout; the module's device fixture fails on any validation error,
including leak reports when the device and instance are destroyed.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gpu.helpers import device_fixture, fd_count, fd_targets, open_device

from vkshmem.core.errors import (
    ConfigError,
    FeatureNotAvailableError,
    InvalidArgumentError,
)
from vkshmem.core.transports.contract import AmoOp
from vkshmem.gpu import ExportInfo, GpuSegment, VulkanDevice, list_devices
from vkshmem.gpu.errors import GpuTimeoutError

pytestmark = pytest.mark.timeout(60)

STAGING = 256 << 10  # small staging buffer so "larger than staging" stays cheap
_IMPORTED: list[mmap.mmap] = []  # host memory the module's device imported


@pytest.fixture(scope="module")
def dev() -> Iterator[VulkanDevice]:
    yield from device_fixture(staging_size=STAGING)


def test_properties(dev: VulkanDevice) -> None:
    info = dev.info
    assert dev.name == info.name
    if info.is_cpu:
        assert "llvmpipe" in dev.name.lower()
    assert isinstance(dev.vendor, str) and dev.vendor
    assert dev.driver
    assert len(dev.uuid) == 16 and info.uuid.count("-") == 4
    assert dev.has_external_memory_fd
    assert dev.has_buffer_device_address
    assert isinstance(dev.has_dma_buf, bool)
    assert isinstance(dev.has_int64_atomics, bool)
    assert isinstance(dev.has_device_local_host_visible, bool)
    assert isinstance(dev.can_map_exportable, bool)
    if info.is_cpu:  # lavapipe: one memory type, device-local and host-visible
        assert dev.has_device_local_host_visible and dev.has_int64_atomics
    assert info.max_push_constants_size >= 128
    listed = list_devices()
    assert any(d.device_uuid == dev.uuid for d in listed)
    assert [d.index for d in listed] == list(range(len(listed)))


def test_device_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    n = len(list_devices())
    monkeypatch.setenv("VKSHMEM_GPU_DEVICE", str(n))  # one past the end
    with pytest.raises(ConfigError, match="VKSHMEM_GPU_DEVICE"):
        VulkanDevice()
    monkeypatch.setenv("VKSHMEM_GPU_DEVICE", "x")
    with pytest.raises(ConfigError, match="VKSHMEM_GPU_DEVICE"):
        VulkanDevice()
    monkeypatch.delenv("VKSHMEM_GPU_DEVICE")
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        VulkanDevice(index=n)
    d = open_device(local_rank=n + 3, staging_size=64 << 10)  # modulo the device count
    try:
        assert d.info.index < n
    finally:
        d.close()
    assert d.validation_errors == []


def test_round_trip_odd_offsets_and_sizes(dev: VulkanDevice) -> None:
    rng = np.random.default_rng(0)
    size = 3 * STAGING + 4096
    mem = dev.alloc_exportable(size)
    try:
        for off, n in [(0, 1), (1, 7), (13, 4093), (5, STAGING // 2 + 3), (3, STAGING + 1),
                       (17, 2 * STAGING + 999), (0, size), (size - 1, 1)]:
            data = rng.integers(0, 256, n, dtype=np.uint8)
            dev.write(mem, off, data)
            out = np.zeros(n, np.uint8)
            dev.read(mem, off, out)
            assert np.array_equal(out, data), (off, n)
        # Any buffer type, and other dtypes as bytes.
        words = rng.random(1000)
        mem.write(8, words)
        back = np.empty_like(words)
        mem.read(8, back)
        assert np.array_equal(back, words)
        dev.write(mem, 0, b"hello")
        buf = bytearray(5)
        dev.read(mem, 0, buf)
        assert buf == b"hello"
        view = mem.map()
        if view is None:  # e.g. NVIDIA: exportable memory is never host-visible
            assert not dev.can_map_exportable and mem.map_reason
            with pytest.raises(FeatureNotAvailableError, match="mapped memory"):
                dev.write(mem, 0, b"x", direct=True)
            return
        assert bytes(view[:5]) == b"hello" and dev.can_map_exportable
        del view
        # Through the mapping, bypassing the staging buffer.
        data = rng.integers(0, 256, 1001, dtype=np.uint8)
        dev.write(mem, 3, data, direct=True)
        out = np.zeros(1001, np.uint8)
        dev.read(mem, 3, out)
        assert np.array_equal(out, data)
        dev.write(mem, 5, data[::-1].copy())
        dev.read(mem, 5, out, direct=True)
        assert np.array_equal(out, data[::-1])
        with pytest.raises(InvalidArgumentError, match="outside"):
            dev.write(mem, size - 1, b"ab", direct=True)
    finally:
        mem.free()


def test_bounds_and_argument_errors(dev: VulkanDevice) -> None:
    mem = dev.alloc_exportable(4096)
    try:
        with pytest.raises(InvalidArgumentError, match="outside"):
            dev.write(mem, 4090, bytes(7))
        with pytest.raises(InvalidArgumentError, match="outside"):
            dev.read(mem, -1, bytearray(1))
        with pytest.raises(InvalidArgumentError, match="read-only"):
            dev.read(mem, 0, b"abc")
        with pytest.raises(InvalidArgumentError, match="contiguous"):
            dev.write(mem, 0, np.zeros((4, 4))[:, 1])
        with pytest.raises(InvalidArgumentError, match="buffer"):
            dev.write(mem, 0, 12)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="positive"):
            dev.alloc_exportable(0)
        with pytest.raises(InvalidArgumentError, match="largest single allocation"):
            dev.alloc_exportable(dev.info.max_allocation_size + 1)
    finally:
        mem.free()


def test_device_to_device_copy(dev: VulkanDevice) -> None:
    rng = np.random.default_rng(1)
    n = 2 * STAGING + 77
    a = dev.alloc_exportable(n + 64)
    b = dev.alloc_exportable(n + 64)
    try:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        dev.write(a, 3, data)
        dev.copy(b, 61, a, 3, n)
        out = np.empty(n, np.uint8)
        dev.read(b, 61, out)
        assert np.array_equal(out, data)
        # Overlapping ranges of one allocation behave like memmove, both directions.
        model = np.zeros(n + 64, np.uint8)
        model[3:3 + n] = data
        dev.write(a, 0, model)
        for dst, src, k in [(10, 3, n - 20), (0, 40, n - 50), (5, 6, STAGING + 5)]:
            dev.copy(a, dst, a, src, k)
            model[dst:dst + k] = model[src:src + k].copy()
            got = np.empty_like(model)
            dev.read(a, 0, got)
            assert np.array_equal(got, model), (dst, src, k)
        with pytest.raises(InvalidArgumentError):
            dev.copy(b, 0, a, 1, n + 64)
    finally:
        a.free()
        b.free()


def test_timeouts_raise_instead_of_hanging(dev: VulkanDevice) -> None:
    n = 64 << 20
    a = dev.alloc_exportable(n)
    b = dev.alloc_exportable(n)
    try:
        with pytest.raises(GpuTimeoutError, match="did not finish"):
            dev.copy(b, 0, a, 0, n, timeout=0)  # a 64 MiB copy cannot be done at once
        # The in-flight copy is waited for before its command buffer is recorded again.
        dev.write(a, 0, b"ok")
        dev.copy(b, 0, a, 0, 2)
        out = bytearray(2)
        dev.read(b, 0, out)
        assert out == b"ok"
    finally:
        a.free()
        b.free()


def test_leading_barrier_only_while_work_is_in_flight(dev: VulkanDevice) -> None:
    """A command buffer starts with the barrier ordering it after earlier work on its queue
    only while some is in flight (device.in_flight counts it): the copy left in flight by a
    timeout is seen by the read recorded after it, and the count drops back."""
    n = 64 << 20
    a = dev.alloc_exportable(n)
    b = dev.alloc_exportable(n)
    aux = dev.transfer._aux
    assert aux is not None
    base = dev.in_flight[0]  # an earlier test's timed-out work may not have been waited for
    try:
        assert aux.lead() == (base > 0)
        dev.write(a, n - 8, b"in order")
        with pytest.raises(GpuTimeoutError):
            dev.transfer.copy(b, 0, a, 0, n, 0)  # the copy engine's slot
        assert aux.pending and dev.in_flight[0] == base + 1 and aux.lead()
        out = bytearray(8)
        dev.read(b, n - 8, out)  # recorded with the leading barrier: after the copy
        assert out == b"in order"
        aux.wait()
        assert dev.in_flight[0] == base and aux.lead() == (base > 0)
    finally:
        a.free()
        b.free()


def test_batched_copies_complete_at_quiet(dev: VulkanDevice) -> None:
    """copy_nbi/write_nbi/read_nbi queue copies (more than one batch) that quiet_nbi
    completes; overlapping ranges are copied at once."""
    from vkshmem.gpu.vk.batch import BATCH_MAX

    k = BATCH_MAX + 44
    a = dev.alloc_exportable(16 * k)
    b = dev.alloc_exportable(16 * k)
    host = mmap.mmap(-1, 1 << 16)
    _IMPORTED.append(host)  # imported for the device's life: never unmapped before it closes
    hv = np.frombuffer(host, np.uint8)
    dev.register_host(hv.ctypes.data, hv.nbytes)
    try:
        data = np.arange(16 * k, dtype=np.uint8)
        dev.write(a, 0, data)
        for i in range(k):
            dev.copy_nbi(b, 16 * i, a, 16 * (k - 1 - i), 16)  # reversed blocks
        hv[:4096] = 7
        dev.write_nbi(a, 0, hv[:4096])
        dev.read_nbi(b, 0, hv[8192:8192 + 16])
        assert dev._batch is not None and 0 < dev._batch.pending < BATCH_MAX
        dev.quiet_nbi()
        assert dev._batch.pending == 0 and not any(s.pending for s in dev._batch.slots)
        want = data.reshape(k, 16)[::-1].ravel()
        out = np.empty(16 * k, np.uint8)
        dev.read(b, 0, out)
        assert np.array_equal(out, want)
        assert np.array_equal(hv[8192:8192 + 16], want[:16])
        dev.read(a, 0, out[:4096])
        assert (out[:4096] == 7).all()
        dev.copy_nbi(a, 1, a, 0, 64)  # overlapping: a memmove, done on return
        assert dev._batch.pending == 0
        got = bytearray(2)
        dev.read(a, 1, got)
        assert got == b"\x07\x07"
    finally:
        a.free()
        b.free()
        del hv


def test_validation_layer_reports_errors() -> None:
    """The messenger really records what the layer says (a deliberately invalid call)."""
    d = open_device(staging_size=64 << 10)
    try:
        vk = d._vk
        ffi = vk.ffi
        info = ffi.new("VkBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": 0,
            "usage": vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT})
        out = ffi.new("VkBuffer*")
        res = vk.lib.vkCreateBuffer(d.handle, info, ffi.NULL, out)
        if res == 0:
            vk.lib.vkDestroyBuffer(d.handle, out[0], ffi.NULL)
        # And a leak: the layer reports it when the device is destroyed.
        info.size = 64
        assert vk.lib.vkCreateBuffer(d.handle, info, ffi.NULL, out) == 0
    finally:
        d.close()
    assert any("VkBufferCreateInfo-size" in e for e in d.validation_errors)
    assert any("vkDestroyDevice-device-00378" in e for e in d.validation_errors)


def test_nothing_leaks() -> None:
    """No fd survives a device's life (export, import, staging, close)."""
    warm = open_device(staging_size=64 << 10)  # loader/driver libraries load once
    warm.close()
    before = fd_count()
    d = open_device(staging_size=64 << 10)
    mem = d.alloc_exportable(1 << 20)
    fd = mem.export_fd()
    imp = d.import_fd(fd, mem.size)
    d.write(imp, 0, b"x" * 100)
    os.close(fd)
    seg = GpuSegment(d, 1, 1 << 16)
    assert seg.info().kind == "opaque_fd" and seg.info().fd >= 0
    seg.close()
    d.amo(mem, 0, AmoOp.ADD, 8, 1)
    imp.free()
    mem.free()
    kept = d.alloc_exportable(4096)  # close() frees what is left
    del kept
    d.close()
    assert fd_count() == before
    assert d.validation_errors == []  # includes the layer's leak report at destroy time


def test_free_refuses_while_viewed(dev: VulkanDevice) -> None:
    mem = dev.alloc_mapped(4096)
    view = mem.map()
    assert view is not None
    arr = np.frombuffer(view, np.uint8)
    del view  # the array alone still keeps the mapping in use
    with pytest.raises(BufferError, match="still viewed"):
        mem.free()
    assert arr.sum() >= 0
    del arr
    mem.free()
    with pytest.raises(Exception, match="freed"):
        mem.map()


def _start_peer(info: ExportInfo, size: int, rounds: int
                ) -> tuple[subprocess.Popen[str], socket.socket]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "gpu" / "peer.py"), str(child.fileno()),
         info.pack().hex(), str(size), str(rounds)],
        pass_fds=[child.fileno()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child.close()
    parent.settimeout(40)
    return proc, parent


def test_export_import_across_processes(dev: VulkanDevice) -> None:
    size, rounds = 1 << 20, 200
    half = size // 2
    rng = np.random.default_rng(1)
    mine = rng.integers(0, 256, half - 8, dtype=np.uint8)  # = peer.pattern(1, half - 8)
    warm = dev.alloc_exportable(4096)  # drivers open some fds (shader caches, first export)
    os.close(warm.export_fd())
    dev.amo(warm, 0, AmoOp.ADD, 8, 1)
    dev.kernels.amo_batch(warm, [0, 8], AmoOp.ADD, 8, 1)
    warm.free()
    fds_before = fd_targets()
    mem = dev.alloc_exportable(size)
    try:
        dev.write(mem, 0, np.zeros(8, np.uint8))
        dev.write(mem, 8, mine)
        fd = mem.export_fd()
        proc, sock = _start_peer(mem.export_info(), size, rounds)
        with sock:
            socket.send_fds(sock, [b"f"], [fd])
            os.close(fd)
            assert sock.recv(1) == b"r", proc.communicate(timeout=10)
            # Hammer the shared counter while the peer does the same.
            olds = [dev.amo(mem, 0, AmoOp.ADD, 8, 1) for _ in range(rounds)]
            batch = dev.kernels.amo_batch(mem, [0] * rounds, AmoOp.ADD, 8, 1)
            assert sock.recv(1) == b"d"
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        assert report == {"uuid_match": True, "saw_exporter_data": True,
                          "olds_increasing": True, "batch_distinct": True,
                          "validation_errors": []}, report
        assert olds == sorted(olds) and len(set(olds)) == rounds
        assert len(set(batch.tolist())) == rounds
        counter = np.zeros(1, np.uint64)
        dev.read(mem, 0, counter)
        assert int(counter[0]) == 4 * rounds  # no lost update across the two processes
        theirs = np.empty(size - half, np.uint8)
        dev.read(mem, half, theirs)
        assert np.array_equal(theirs, np.random.default_rng(2).integers(0, 256, size - half,
                                                                         dtype=np.uint8))
    finally:
        mem.free()
    assert fd_targets() == fds_before


def test_import_rejects_wrong_memory_type(dev: VulkanDevice) -> None:
    mem = dev.alloc_exportable(4096)
    fd = mem.export_fd()
    try:
        with pytest.raises(InvalidArgumentError, match="memory type"):
            dev.import_fd(fd, 4096, memory_type_index=31)
    finally:
        os.close(fd)
        mem.free()


def test_export_info_blob_round_trips(dev: VulkanDevice) -> None:
    mem = dev.alloc_exportable(12345)
    try:
        info = mem.export_info()
        assert ExportInfo.unpack(info.pack()) == info
        assert info.size == 12345 and info.allocation_size >= 12345
        assert info.device_uuid == dev.uuid
        if not dev.has_dma_buf:
            with pytest.raises(FeatureNotAvailableError, match="dma-buf"):
                mem.export_dmabuf()
    finally:
        mem.free()


def test_missing_driver_is_a_clear_error() -> None:
    """No ICD: FeatureNotAvailableError naming the package/variable (in a fresh process)."""
    code = ("from vkshmem.gpu import VulkanDevice\n"
            "from vkshmem.core.errors import FeatureNotAvailableError\n"
            "try:\n    VulkanDevice()\nexcept FeatureNotAvailableError as e:\n    print(e)\n")
    env = dict(os.environ, VK_ICD_FILENAMES="/nonexistent/icd.json",
               VK_DRIVER_FILES="/nonexistent/icd.json")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "VK_DRIVER_FILES" in res.stdout or "mesa-vulkan-drivers" in res.stdout, res.stdout


def test_an_accelerator_that_fails_to_attach_leaves_the_domain_vulkan_only(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A third party's accelerator raising in attach does not abort the domain's open: a
    warning, and the Vulkan-only accelerator saying why (VKSHMEM_PLUGINS_STRICT=1: an error)."""
    import logging

    from vkshmem.core.config import load
    from vkshmem.core.domains.contract import DomainContext
    from vkshmem.gpu import accel
    from vkshmem.gpu.accel import DomainAccelerator, GpuAccelerator
    from vkshmem.gpu.domain import vulkan
    from vkshmem.gpu.plugin import SPEC
    from vkshmem.plugin import PluginError

    class Broken(GpuAccelerator):
        name = "broken"

        def applies(self, info: object) -> bool:
            return True

        def attach(self, domain: object) -> DomainAccelerator:
            raise RuntimeError("a vendor's bug")

    open_device().close()  # skips without Vulkan
    monkeypatch.setattr(accel, "accelerator_for", lambda info, config: Broken())
    monkeypatch.setenv("VKSHMEM_GPU_SYMMETRIC_SIZE", "1M")
    monkeypatch.setenv("VKSHMEM_GPU_STAGING_SIZE", "256K")

    def context(env: dict[str, str]) -> DomainContext:
        return DomainContext(0, 1, 0, "node", 1, load(env), lambda blob: [blob], lambda: None)

    with caplog.at_level(logging.WARNING, logger="vkshmem"):
        dom = vulkan.VulkanDomain(SPEC, context({}))
    try:
        assert type(dom.accel) is DomainAccelerator
        assert dom.accel.why == ("GPU accelerator 'broken' failed to attach: RuntimeError: "
                                 "a vendor's bug")
        assert "a vendor's bug" in caplog.text and "Vulkan-only" in caplog.text
        dom.write(dom.memory, 0, np.arange(4, dtype=np.uint32))
        out = np.zeros(4, np.uint32)
        dom.read(dom.memory, 0, out)
        assert out.tolist() == [0, 1, 2, 3]
    finally:
        dom.close()
    with pytest.raises(PluginError, match=r"'broken' failed to attach.*STRICT"):
        vulkan.VulkanDomain(SPEC, context({"VKSHMEM_PLUGINS_STRICT": "1"}))
