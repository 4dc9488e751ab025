"""User kernels: your own SPIR-V compute shader, dispatched with the vkshmem push header.

A kernel written against ``shaders/vkshmem.glsl`` starts its push-constant block with
``VKS_PUSH_HEADER`` (32 bytes; its layout in :mod:`~vkshmem.gpu.initiated.push`).

:class:`UserKernel` loads the module into a compute pipeline
(:class:`~vkshmem.gpu.vk.pipeline.ComputePipeline`), fills the header and dispatches
**asynchronously**: :meth:`UserKernel.dispatch` records and submits a command buffer of its
own (with its own fence) and returns a :class:`Launch` at once, so the host can serve the
kernel's requests (:class:`~vkshmem.gpu.initiated.ringservice.RingService`) while it runs;
:meth:`Launch.wait` waits with a timeout (:class:`~vkshmem.gpu.errors.GpuTimeoutError`, never
a hang) and :meth:`Launch.done` asks without waiting.

The scratch (``scratch_bytes=``) is :meth:`VulkanDevice.alloc_mapped
<vkshmem.gpu.vk.device.VulkanDevice.alloc_mapped>` memory, zeroed: where a running kernel sees
host writes, so it is the place for fetched AMO values (``result`` addresses), and the host
reads it after a launch (:meth:`UserKernel.scratch_view`).

Launches of one kernel share its header and scratch; they may overlap on the GPU unless the
caller waits between them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vkshmem.core.errors import InvalidArgumentError

from ..errors import GpuError
from ..vk.memory import GpuMemory
from ..vk.pipeline import PUSH_CONSTANT_SIZE, ComputePipeline, load_spirv
from .launched import Launch
from .push import PUSH_HEADER, PUSH_HEADER_SIZE, USER_PUSH_SIZE, Pushable, entry_points, pack_push
from .ring import Ring

if TYPE_CHECKING:
    from ..stream import Stream
    from ..vk.device import VulkanDevice
    from ..vk.submit import Slot

__all__ = ["Launch", "UserKernel"]


def _address(what: str, value: Any, device: VulkanDevice) -> int:
    """The device address of a GpuMemory, a Ring, or an int."""
    mem: GpuMemory | None = None
    addr = value
    if isinstance(value, Ring):
        mem, addr = value.memory, value.device_address
    elif isinstance(value, GpuMemory):
        mem, addr = value, value.device_address
    if mem is not None and mem.device is not device:
        raise InvalidArgumentError(f"the {what} belongs to another Vulkan device")
    if isinstance(addr, bool) or not isinstance(addr, int | np.integer) \
            or not 0 <= int(addr) < 1 << 64:
        raise InvalidArgumentError(f"{what} must be a device address (an int), a GpuMemory or "
                                   f"a Ring; got {value!r}")
    return int(addr)


class UserKernel:
    """A user's compute shader on ``device``, dispatched with the vkshmem push header.

    ``spirv``: SPIR-V bytes, a path to a ``.spv`` file, or the name of a shipped module.
    ``heap``/``ring``: this PE's GPU heap and request ring (a
    :class:`~vkshmem.gpu.vk.memory.GpuMemory` / :class:`~vkshmem.gpu.initiated.ring.Ring`, or device
    addresses; 0 when the kernel does not use them), ``my_pe``/``n_pes`` the PE numbers the
    kernel sees; all four can be changed later with :meth:`set_header`. ``scratch_bytes``
    allocates the kernel's scratch (see the module doc). ``entry`` names the compute entry
    point. Close it (or use ``with``) before closing the device.
    """

    def __init__(self, device: VulkanDevice, spirv: str | os.PathLike[str] | bytes, *,
                 name: str | None = None, entry: str = "main", heap: Any = 0, ring: Any = 0,
                 my_pe: int = 0, n_pes: int = 1, scratch_bytes: int = 0) -> None:
        device.check_open()
        code, default_name = self._load(spirv)
        self.name = name or default_name
        entries = entry_points(code)
        if entry not in entries:
            have = ", ".join(sorted(entries)) or "none"
            raise InvalidArgumentError(f"{self.name}: the module has no compute entry point "
                                       f"{entry!r} (compute entry points: {have})")
        #: local workgroup size of the entry point (None: set by specialisation constants)
        self.local_size = entries[entry]
        self.device = device
        self.scratch: GpuMemory | None = None
        self._lock = threading.Lock()
        self._idle: list[Slot] = []
        self._in_flight: set[Launch] = set()
        self._closed = False
        #: called after each launch is known to be done (the runtime's check of what the
        #: kernel reported through its ring: GpuError), or None
        self.after_launch: Callable[[], None] | None = None
        self.pipeline = ComputePipeline(device, code, name=self.name, entry=entry)
        try:
            if scratch_bytes < 0:
                raise InvalidArgumentError(f"scratch_bytes must be >= 0, got {scratch_bytes}")
            if scratch_bytes:
                self.scratch = device.alloc_mapped(scratch_bytes)
                self.clear_scratch()
            self._header = b""
            self.set_header(heap=heap, ring=ring, my_pe=my_pe, n_pes=n_pes)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _load(spirv: str | os.PathLike[str] | bytes) -> tuple[bytes, str]:
        if isinstance(spirv, bytes | bytearray | memoryview):
            return load_spirv(bytes(spirv)), "user kernel"
        path = Path(spirv)
        if path.is_file():
            if path.suffix in (".comp", ".glsl"):
                raise InvalidArgumentError(
                    f"{path} is GLSL: compile it to SPIR-V first (glslc, or "
                    "vkshmem.gpu.shaders.compile_glsl, which puts vkshmem.glsl on the include "
                    "path)")
            return load_spirv(path.read_bytes()), path.stem
        if path.suffix or len(path.parts) > 1:
            raise InvalidArgumentError(f"no SPIR-V file {path}")
        return load_spirv(str(spirv)), str(spirv)  # a shipped module's name

    # -- the header -------------------------------------------------------------------------

    def set_header(self, *, heap: Any = None, ring: Any = None, my_pe: int | None = None,
                   n_pes: int | None = None) -> None:
        """Change what later dispatches put in the push header (None: keep)."""
        old = PUSH_HEADER.unpack(self._header) if self._header else (0, 0, 0, 0, 1)
        dev = self.device
        h = _address("heap", heap, dev) if heap is not None else old[0]
        r = _address("ring", ring, dev) if ring is not None else old[1]
        me = old[3] if my_pe is None else my_pe
        n = old[4] if n_pes is None else n_pes
        if not (isinstance(n, int) and 0 < n < 1 << 32):
            raise InvalidArgumentError(f"n_pes must be a positive int, got {n!r}")
        if not (isinstance(me, int) and 0 <= me < n):
            raise InvalidArgumentError(f"my_pe must be in [0, {n}), got {me!r}")
        scratch = self.scratch.device_address if self.scratch is not None else 0
        self._header = PUSH_HEADER.pack(h, r, scratch, me, n)

    @property
    def header(self) -> dict[str, int]:
        """The header later dispatches push, by field."""
        h, r, s, me, n = PUSH_HEADER.unpack(self._header)
        return {"heap": h, "ring": r, "scratch": s, "my_pe": me, "n_pes": n}

    # -- the scratch ------------------------------------------------------------------------

    def scratch_view(self) -> memoryview:
        """A CPU view of the scratch (drop it, and arrays made from it, before :meth:`close`)."""
        if self.scratch is None:
            raise InvalidArgumentError(f"{self.name} has no scratch (pass scratch_bytes=)")
        view = self.scratch.map()
        if view is None:  # pragma: no cover - alloc_mapped memory always maps
            raise GpuError(f"the scratch is not mappable: {self.scratch.map_reason}")
        return view

    def clear_scratch(self) -> None:
        """Zero the scratch (not while a launch may use it)."""
        if self.scratch is not None:
            view = self.scratch_view()
            view[:] = bytes(len(view))
            del view

    def finished(self) -> None:
        """Called when one of this kernel's launches is known to be done: runs
        :attr:`after_launch` (the runtime raises there what the kernel reported)."""
        if self.after_launch is not None:
            self.after_launch()

    # -- dispatching ------------------------------------------------------------------------

    def groups_for(self, invocations: int) -> int:
        """Workgroups along x that cover ``invocations`` (by the entry point's local size)."""
        if self.local_size is None:
            raise InvalidArgumentError(f"{self.name}: the local size is set by specialisation "
                                       "constants; compute the workgroup count yourself")
        return max(1, -(-invocations // self.local_size[0]))

    def _groups(self, groups: tuple[Any, Any, Any]) -> tuple[int, int, int]:
        limit = self.device.info.max_workgroup_count
        out = []
        for axis, g in zip("xyz", groups, strict=True):
            if isinstance(g, bool) or not isinstance(g, int | np.integer):
                raise InvalidArgumentError(f"{self.name}: workgroup count {axis} must be an int, "
                                           f"got {g!r}")
            out.append(int(g))
        for axis, g, lim in zip("xyz", out, limit, strict=True):
            if g < 1:
                raise InvalidArgumentError(f"{self.name}: workgroup count {axis} must be at "
                                           f"least 1, got {g}")
            if g > lim:
                raise InvalidArgumentError(
                    f"{self.name}: {g} workgroups along {axis} exceed the device limit {lim} "
                    f"(maxComputeWorkGroupCount {limit} on {self.device.info.name}); split the "
                    "work into several dispatches")
        return out[0], out[1], out[2]

    def _push(self, push: Pushable) -> bytes:
        if isinstance(push, bytes | bytearray | memoryview):
            user = bytes(push)
        elif isinstance(push, Sequence) and not isinstance(push, str):
            user = pack_push(*push)
        else:
            raise InvalidArgumentError(f"{self.name}: push must be bytes or a sequence of numpy "
                                       f"scalars, got {type(push).__name__}")
        if len(user) > USER_PUSH_SIZE:
            raise InvalidArgumentError(
                f"{self.name}: {len(user)} bytes of push constants do not fit: {USER_PUSH_SIZE} "
                f"bytes follow the {PUSH_HEADER_SIZE}-byte vkshmem header in the "
                f"{PUSH_CONSTANT_SIZE}-byte push-constant range")
        return self._header + user + bytes(-len(user) % 4)

    def dispatch(self, groups_x: int, groups_y: int = 1, groups_z: int = 1,
                 push: Pushable = b"", *, stream: Stream | None = None) -> Launch:
        """Submit one dispatch of ``groups_x * groups_y * groups_z`` workgroups with the header
        and ``push`` (bytes, or numpy scalars packed by :func:`pack_push`) and return at once;
        wait with :meth:`Launch.wait`. The dispatch is ordered after all work submitted to the
        device before it (and later work after it: while it runs, the device's copies and
        shader AMOs wait). With ``stream`` (a :class:`~vkshmem.gpu.stream.Stream` of this
        kernel's device, e.g. ``shmem.gpu_stream()``) it is ordered on the stream instead:
        after the stream's work before it, before the stream's work after it, no host wait."""
        groups = self._groups((groups_x, groups_y, groups_z))
        data = self._push(push)
        dev = self.device
        if stream is not None:
            return self._on_stream(stream, groups, data)
        with self._lock:
            if self._closed:
                raise GpuError(f"{self.name} is closed")
            dev.check_open()
            slot = self._idle.pop() if self._idle else dev.slot(f"dispatch of {self.name}",
                                                                 launch=True)
        try:
            with dev.lock:
                slot.begin()
                try:
                    self.pipeline.record(slot, groups, data)
                finally:
                    slot.end()
                slot.submit()
        except BaseException:
            slot.close()
            raise
        launch = Launch(self, slot, groups)
        with self._lock:
            self._in_flight.add(launch)
        return launch

    def _on_stream(self, stream: Stream, groups: tuple[int, int, int], data: bytes) -> Launch:
        from ..stream import Stream
        if not isinstance(stream, Stream):
            raise InvalidArgumentError(f"{self.name}: stream= takes a vkshmem.gpu.Stream "
                                       f"(shmem.gpu_stream()), got {type(stream).__name__}")
        if stream.device is not self.device:
            raise InvalidArgumentError(
                f"{self.name}: {stream!r} belongs to another Vulkan device than the kernel's "
                f"({self.device.info.name}); make it with shmem.gpu_stream()")
        if self._closed:
            raise GpuError(f"{self.name} is closed")
        launch = Launch(self, None, groups)
        launch._stream = stream
        launch._value = stream.dispatch(self.pipeline, groups, data)
        with self._lock:
            self._in_flight.add(launch)
        return launch

    def run(self, groups_x: int, groups_y: int = 1, groups_z: int = 1, push: Pushable = b"", *,
            timeout: float | None = None) -> None:
        """:meth:`dispatch` and wait (``timeout`` seconds)."""
        self.dispatch(groups_x, groups_y, groups_z, push).wait(timeout)

    def _release(self, launch: Launch, slot: Slot) -> None:
        with self._lock:
            self._in_flight.discard(launch)
            if self._closed:
                slot.close()
            else:
                self._idle.append(slot)

    @property
    def in_flight(self) -> int:
        """Launches not yet known to be finished."""
        with self._lock:
            return len(self._in_flight)

    # -- teardown ---------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Wait for launches in flight (``timeout`` each; :class:`GpuTimeoutError` leaves the
        kernel open), then free the pipeline, command buffers and scratch."""
        if self.device.handle is None:
            self._closed = True
            return
        with self._lock:
            pending = list(self._in_flight)
        for launch in pending:
            launch.wait(timeout)
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.close()
        self.pipeline.close()
        if self.scratch is not None:
            self.scratch.free()
            self.scratch = None

    def __enter__(self) -> UserKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<UserKernel {self.name} on {self.device.info.name}>"
