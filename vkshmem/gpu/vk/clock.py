"""The shader clock that bounds a stream's waits (``stream_wait.comp``), calibrated once per
device: its rate in ticks per second (two reads 20 ms apart; Vulkan leaves the unit to the
device), and on CPU drivers how long one pass of ``stream_wait_cpu`` spins (how many
dispatches a wait chains to spin for its timeout). Also the layout both sides of the wait
share: its push constants and the stream's state block."""

from __future__ import annotations

import struct
import threading
import time
from typing import TYPE_CHECKING

from ..errors import GpuError

if TYPE_CHECKING:
    from .device import VulkanDevice
    from .memory import GpuMemory

__all__ = ["CLOCK", "DESC_OFF", "STATE", "STATE_SIZE", "WAIT_PUSH", "ZERO_OFF", "clock_rate",
           "cpu_pass_ticks"]

WAIT_PUSH = struct.Struct("<QQQQIIII")  #: stream_wait.comp's push constants
STATE = struct.Struct("<9Q")  #: stream_wait.comp's State
#: a stream's state block: the State (72 bytes), the AMO descriptor at DESC_OFF, a zero word
STATE_SIZE = 256
DESC_OFF = 128
ZERO_OFF = 192
CLOCK = 4  #: stream_wait.comp's flag: write the clock into State.start

_lock = threading.Lock()


def clock_rate(device: VulkanDevice) -> float:
    """Ticks per second of ``device``'s shader clock, measured once (two reads by
    ``stream_wait.comp`` 20 ms apart)."""
    rate = getattr(device, "_streamclock_rate", None)
    if rate is not None:
        return float(rate)
    with _lock:
        rate = getattr(device, "_streamclock_rate", None)
        if rate is None:
            rate = _measure(device)
            device._streamclock_rate = rate  # type: ignore[attr-defined]
    return float(rate)


def _run_wait(device: VulkanDevice, state: GpuMemory, push: bytes) -> None:
    name = "stream_wait_cpu" if device.info.is_cpu else "stream_wait"
    device.pipeline(name).dispatch(1, push)


def _measure(device: VulkanDevice) -> float:
    state = device.alloc_mapped(STATE_SIZE)
    try:
        view = state.map()
        assert view is not None
        view[:] = bytes(STATE_SIZE)
        push = WAIT_PUSH.pack(0, 0, state.device_address, 0, 1, 0, 1, CLOCK)
        _run_wait(device, state, push)
        t0, h0 = struct.unpack_from("<Q", view, 8)[0], time.perf_counter()
        time.sleep(0.02)
        _run_wait(device, state, push)
        t1, h1 = struct.unpack_from("<Q", view, 8)[0], time.perf_counter()
        del view
    finally:
        state.free()
    rate = (t1 - t0) / (h1 - h0)
    if not rate > 0:
        raise GpuError(f"{device.info.name}: the shader clock did not advance (read {t0}, "
                       f"then {t1}); waits on a stream cannot be bounded")
    return rate


def cpu_pass_ticks(device: VulkanDevice) -> float:
    """Clock ticks one pass of ``stream_wait_cpu`` spins for on ``device`` times its
    spinners per dispatch, measured once (a wait on a word that never changes)."""
    per = getattr(device, "_stream_pass_ticks", None)
    if per is not None:
        return float(per)
    with _lock:
        per = getattr(device, "_stream_pass_ticks", None)
        if per is None:
            state = device.alloc_mapped(STATE_SIZE)
            try:
                view = state.map()
                assert view is not None
                view[:] = bytes(STATE_SIZE)
                passes = 200
                # a word that stays 0: "== 1" never holds
                push = WAIT_PUSH.pack(state.device_address + ZERO_OFF, 1, state.device_address,
                                       1 << 62, 1, passes, 1, 0)
                _run_wait(device, state, push)
                waited = STATE.unpack_from(view, 0)[8]
                del view
            finally:
                state.free()
            per = waited / passes  # every spinner of the dispatch, one pass each
            device._stream_pass_ticks = per  # type: ignore[attr-defined]
    return float(per)
