"""Probe (run by hand on a GPU, one process): what a submit + completion round trip costs, and
whether a completion flag written by the GPU into host-visible memory is seen earlier than the
fence. Prerecorded command buffers: empty, a dispatch of one workgroup, an 8-byte copy; each
bare, with only the leading barrier, with only the trailing barrier to the host stage, with
both; each optionally followed by a vkCmdFillBuffer of a sequence number into host-visible
memory that the host spins on. Prints per-call microseconds (median of 5 rounds)."""

from __future__ import annotations

import statistics
import struct
import time

from vkshmem.gpu import VulkanDevice
from vkshmem.gpu.vk.submit import Slot

dev = VulkanDevice()
vk = dev._vk
ffi, lib = vk.ffi, vk.lib
nat = dev.native
src = dev.alloc(1 << 20)
dst = dev.alloc(1 << 20)
flag = dev.alloc(4096, exportable=False, host_visible=True)
fv = flag.map()
assert fv is not None
words = fv.cast("I")
pipe = dev.pipeline("copy_u32")
push1 = struct.pack("<QQII", dst.device_address, src.device_address, 1, 0)
ALL = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
print(f"device {dev.name} ({dev.driver}); memory type of the flag: "
      f"{flag.memory_type_index}", flush=True)


def build(slot: Slot, body: str, bin_: bool, bout: bool, fill: int | None) -> None:
    with dev.lock:
        lib.vkBeginCommandBuffer(slot.cmd, dev._begin_info_reuse)
        if bin_:
            lib.vkCmdPipelineBarrier(slot.cmd, ALL, ALL, 0, 1, dev._barrier_in, 0, ffi.NULL, 0,
                                     ffi.NULL)
        if body == "dispatch":
            pipe.record(slot, 1, push1)
        elif body == "copy":
            r = ffi.new("VkBufferCopy*", {"srcOffset": 0, "dstOffset": 0, "size": 8})
            lib.vkCmdCopyBuffer(slot.cmd, src.buffer, dst.buffer, 1, r)
        if bout:
            lib.vkCmdPipelineBarrier(slot.cmd, ALL, vk.VK_PIPELINE_STAGE_HOST_BIT if fill is None
                                     else ALL, 0, 1, dev._barrier_out if fill is None
                                     else dev._barrier_mid, 0, ffi.NULL, 0, ffi.NULL)
        if fill is not None:
            lib.vkCmdFillBuffer(slot.cmd, flag.buffer, 0, 4, fill)
        lib.vkEndCommandBuffer(slot.cmd)


def measure(body: str, bin_: bool, bout: bool, use_flag: bool, launch: bool,
            nslots: int = 2) -> tuple[float, float]:
    """(us per round trip, us from submit to the flag (or fence) seen)."""
    seq = [0]
    slots = []
    for k in range(nslots):  # command buffers writing alternating values
        s = Slot(dev, "probe", launch=launch)
        build(s, body, bin_, bout, (k + 1) if use_flag else None)
        slots.append(s)
    seen = []

    def run() -> None:
        i = seq[0] % nslots
        seq[0] += 1
        s = slots[i]
        s.wait()  # its previous use (long done when flags are used)
        words[0] = 0
        t0 = time.perf_counter()
        with dev.lock:
            s.submit()
        if use_flag:
            want = i + 1
            while words[0] != want:
                pass
            seen.append(time.perf_counter() - t0)
        else:
            s.wait()
            seen.append(time.perf_counter() - t0)
    for _ in range(50):
        run()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(400):
            run()
        samples.append((time.perf_counter() - t0) / 400)
    for s in slots:
        s.close()
    return statistics.median(samples) * 1e6, statistics.median(seen) * 1e6


t0 = time.perf_counter()
n = 0
while time.perf_counter() - t0 < 0.05:
    lib.vkGetFenceStatus(dev.handle, dev.transfer._aux.fence)  # type: ignore[union-attr]
    n += 1
print(f"vkGetFenceStatus (Python): {0.05e6 / n:.2f} us per call", flush=True)
for body in ("empty", "copy", "dispatch"):
    for nslots in (1, 2):
        rt, seen = measure(body, False, False, False, False, nslots)
        print(f"{nslots} slot(s) {body} bare fence: round trip {rt:6.2f} us", flush=True)
for launch in (False, True):
    for body in ("empty", "copy", "dispatch"):
        for bin_, bout in ((False, False), (True, False), (False, True), (True, True)):
            for use_flag in (False, True):
                rt, seen = measure(body, bin_, bout, use_flag, launch)
                print(f"{'launch' if launch else 'first '} {body:<8} in={int(bin_)} "
                      f"out={int(bout)} {'flag ' if use_flag else 'fence'}: round trip "
                      f"{rt:6.2f} us, seen after {seen:6.2f} us", flush=True)
words.release()
fv.release()
for m in (src, dst, flag):
    m.free()
dev.close()
