"""Vulkan streams (vkshmem.gpu.Stream, shmem.gpu_stream): tests/pe/gpu_vkstream.py at 1, 2 and 4
PEs (and 2 with peers unmapped) on lavapipe with the validation layer on (its errors, leaks
included, fail the run)."""

from __future__ import annotations

import pytest
from test_gpu_multipe import VULKAN_ENV
from test_multipe import launch


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_vulkan_stream(npes: int) -> None:
    r = launch("gpu_vkstream", npes, VULKAN_ENV, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("gpu_vkstream ok") == npes, r.stdout


def test_vulkan_stream_unmapped_peers() -> None:
    """Peers' GPU heaps not imported (VKSHMEM_DOMAIN_IMPORT=0, as when a driver refuses an
    import): remote stream calls synchronize the stream and go the blocking route, with the
    same values; local ones still enqueue."""
    r = launch("gpu_vkstream", 2, {**VULKAN_ENV, "VKSHMEM_DOMAIN_IMPORT": "0"}, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("put_signal falls back") == 2, r.stdout
    assert r.stdout.count("gpu_vkstream ok") == 2, r.stdout


def test_stream_on_a_device() -> None:
    """A Stream on a VulkanDevice of its own (no runtime): copies (a memmove too), AMOs, waits
    (satisfied, released by the host later, timed out: WaitTimeoutError once), ordering after
    the device's first queue, and close; the validation layer reports nothing, leaks
    included."""
    np = pytest.importorskip("numpy")
    try:
        from vkshmem.gpu import VulkanDevice
        dev = VulkanDevice(validation=True)
    except Exception as exc:  # no Vulkan here
        pytest.skip(f"no Vulkan device: {exc}")
    from vkshmem.core.errors import WaitTimeoutError
    from vkshmem.core.transports.contract import AmoOp
    from vkshmem.gpu import Stream
    from vkshmem.gpu.vk.timeline import MAX_IN_FLIGHT

    try:
        a = dev.alloc(1 << 16, exportable=False)
        b = dev.alloc_mapped(1 << 16)
        b.map()[:] = bytes(1 << 16)  # new memory is not zero on every driver
        dev.write(a, 0, np.arange(512, dtype=np.uint64))
        # waits meant to succeed get seconds (a loaded CI machine), the one meant to fail 0.3 s
        with Stream(dev, wait_timeout=30) as s, Stream(dev, wait_timeout=0.3) as short:
            s.copy(b, 0, a, 0, 4096)
            s.copy(b, 8, b, 0, 64)  # overlapping: as memmove
            s.amo(b, 5120, AmoOp.ADD, 8, 5)
            s.amo(b, 5128, AmoOp.SET, 4, 9)
            s.wait_word(b, 5120, 1, 5)
            s.synchronize()
            out = np.frombuffer(bytes(b.map()[:6144]), np.uint64)
            assert out[0] == 0 and list(out[1:9]) == list(range(8)) and out[9] == 9, out[:12]
            assert out[640] == 5 and out[641] == 9, out[640:642]
            # the stream waits for the host: query() is False until the host writes the word
            s.wait_word(b, 2048, 1, 77)
            s.copy(b, 4096, a, 0, 8)
            assert not s.query()
            b.map()[2048:2056] = np.uint64(77).tobytes()
            s.synchronize()
            # a wait that times out: raised once, then the stream goes on
            short.wait_word(b, 2048, 1, 78)
            with pytest.raises(WaitTimeoutError, match="did not become == 78"):
                short.synchronize()
            short.synchronize()
            # after the device's own (blocking, batched) work, without a host wait
            dev.copy_nbi(a, 8192, a, 0, 64)
            dev.flush_nbi()
            s.after_device_queue()
            s.copy(b, 8192, a, 8192, 64)
            s.synchronize()
            got = np.frombuffer(bytes(b.map()[8192:8256]), np.uint64)
            assert list(got) == list(range(8)), got
            # large copies run as copy.comp on GPUs (as the blocking ones do); lavapipe keeps
            # the copy engine, so lower the threshold to record the shader path here: 16-byte,
            # 4-byte and byte-granular forms, after a copy-engine copy on the same stream
            c = dev.alloc(1 << 16, exportable=False)
            dev.write(c, 0, np.zeros(1 << 13, np.uint64))
            dev.shader_copy_min = 4096
            assert dev.shader_copies(c, 0, a, 0, 4096) and not dev.shader_copies(c, 0, a, 0, 64)
            s.copy(c, 0, a, 0, 64)
            s.copy(c, 4096, a, 0, 4096)
            s.copy(c, 16384 + 4, a, 4, 4096 + 8)
            s.copy(c, 32768 + 3, a, 1, 4096 + 5)
            s.synchronize()
            dev.shader_copy_min = 1 << 62
            want = np.zeros(8192, np.uint8)
            got8 = np.zeros(1 << 16, np.uint8)
            dev.read(a, 0, want)
            dev.read(c, 0, got8)
            assert np.array_equal(got8[:64], want[:64])
            assert np.array_equal(got8[4096:8192], want[:4096])
            assert np.array_equal(got8[16388:16388 + 4104], want[4:4108])
            assert np.array_equal(got8[32771:32771 + 4101], want[1:4102])
            assert not got8[32771 + 4101:].any() and not got8[16388 + 4104:32771].any()
            c.free()
            for _ in range(1000):
                s.amo(b, 5136, AmoOp.ADD, 8, 1)
            st = s.stats()
            assert st["command_buffers"] <= MAX_IN_FLIGHT and st["semaphores"] == 2, st
            s.synchronize()
            assert int(np.frombuffer(bytes(b.map()[5136:5144]), np.uint64)[0]) == 1000
        assert s.closed and s.stats()["command_buffers"] == 0
        assert short.closed and short.stats()["command_buffers"] == 0
        assert not dev.streams
        assert dev.validation_errors == []
        a.free()
        b.free()
    finally:
        dev.close()
    assert dev.validation_errors == []


def test_gpu_wait_shader_on_a_cpu_driver() -> None:
    """stream_wait.spv, the one-invocation wait a GPU runs (CPU drivers run stream_wait_cpu),
    loaded and dispatched on lavapipe with the validation layer on: a word that already holds
    its value ends the wait as satisfied; one that never does, within a few passes, records
    the failure the host raises (word, comparison, value, value seen)."""
    try:
        from vkshmem.gpu import VulkanDevice
        dev = VulkanDevice(validation=True)
    except Exception as exc:  # no Vulkan here
        pytest.skip(f"no Vulkan device: {exc}")
    from vkshmem.gpu.vk.clock import STATE, STATE_SIZE, WAIT_PUSH, ZERO_OFF

    try:
        if not (dev.info.int64_atomics and dev.info.device_clock):
            pytest.skip("no 64-bit atomics or shader clock")
        state = dev.alloc_mapped(STATE_SIZE)
        view = state.map()
        pipe = dev.pipeline("stream_wait")
        word = state.device_address + ZERO_OFF
        for value, cmp, want in ((0, 1, 1), (7, 1, 2), (0, 6, 1), (1, 5, 1), (0, 2, 2)):
            view[:] = bytes(STATE_SIZE)  # EQ, EQ, GE, LT, NE on a word holding 0
            pipe.dispatch(1, WAIT_PUSH.pack(word, value, state.device_address, 1 << 62, cmp,
                                            100, 1, 0))
            st = STATE.unpack_from(view, 0)
            assert st[0] == want, (value, cmp, st)
            if want == 2:  # the failure record: word, comparison, value, seen
                assert st[3] == 1 and st[4:8] == (word, cmp, value, 0), st
        del view
        state.free()
        assert dev.validation_errors == []
    finally:
        dev.close()
    assert dev.validation_errors == []
