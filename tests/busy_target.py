"""One check shared by the network transports' tests: a target PE busy in pure Python (holding
its GIL, never calling the transport) still serves the initiator's puts, gets and AMOs
promptly — the job of each transport's native progress thread."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from vkshmem.core._native import lib as native

from vkshmem.core.transports.contract import AmoOp, PeerInfo, Transport, TransportContext

_TARGET = """
import json, mmap, os, sys, time
from vkshmem.core._native import lib, ffi
from vkshmem.core.transports.contract import SegmentInfo, TransportContext
from {module} import {cls}

fd = os.memfd_create("busy")
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
address = int(ffi.cast("uintptr_t", ffi.from_buffer(m)))
t = {cls}(TransportContext(1, 2, 0, {{{option!r}: sys.argv[1]}}, "node0", "127.0.0.1",
                           lib.vk_amo_address()))
key = t.register(SegmentInfo(0, "host", address, 1 << 20, fd, memoryview(m)))
print(json.dumps({{"address": t.address().hex(), "key": key.hex()}}), flush=True)
sys.stdin.readline()  # the initiator is connected: be busy now
start = time.monotonic()
spins = 0
while time.monotonic() - start < float(sys.argv[2]):
    for _ in range(10000):  # pure Python holding the GIL, never calling the transport
        spins += 1
print(json.dumps({{"busy_from": start, "busy_until": time.monotonic(),
                   "head": m[:16].hex()}}), flush=True)
t.close()
"""


def check_busy_target(cls: type[Transport], option: str, value: str, rounds: int,
                      busy: float = 2.0) -> None:
    """Run a target of transport ``cls`` (rail option ``option=value``) in a child process
    that is busy for ``busy`` s, and check that ``rounds`` rounds of put+quiet, get, fetch_add
    and add+quiet into it all ran while it was busy, each under 0.2 s (well under the ~1 s
    stall of a target without a progress thread), with the right results."""
    script = _TARGET.format(module=cls.__module__, cls=cls.__name__, option=option)
    child = subprocess.Popen([sys.executable, "-c", script, value, str(busy)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    tr: Any = cls(TransportContext(0, 2, 0, {option: value}, "node0", "127.0.0.1",  # type: ignore[call-arg]
                                   native.vk_amo_address()))
    worst: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., object], *args: object) -> object:
        t0 = time.monotonic()
        out = fn(*args)
        worst[name] = max(worst.get(name, 0.0), time.monotonic() - t0)
        return out

    try:
        assert child.stdin is not None and child.stdout is not None
        info = json.loads(child.stdout.readline())
        tr.connect({1: PeerInfo(1, "node0", True, bytes.fromhex(info["address"]),
                                {0: bytes.fromhex(info["key"])})})
        tr.put(1, 0, 0, memoryview(b"busy PE\0"))  # connected before the busy phase
        tr.quiet()
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(0.2)  # the target is in its loop now
        first = time.monotonic()
        out = bytearray(4096)
        for i in range(rounds):
            timed("put+quiet", lambda i=i: (tr.put(1, 0, 4096, memoryview(bytes([i]) * 4096)),
                                            tr.quiet()))
            timed("get", tr.get, 1, 0, 4096, memoryview(out))
            assert out == bytes([i]) * 4096
            assert timed("fetch_add", tr.amo, 1, 0, 8, AmoOp.ADD, 8, 1, 0, True) == i
            timed("add+quiet", lambda: (tr.amo(1, 0, 16, AmoOp.ADD, 8, 1, 0, False),
                                        tr.quiet()))
        last = time.monotonic()
    finally:
        tr.close()
        final = child.communicate(timeout=60)[0].splitlines()
    assert child.returncode == 0
    done = json.loads(final[-1])
    assert done["busy_from"] <= first and last <= done["busy_until"], \
        "the operations did not all run while the target was busy"
    assert bytes.fromhex(done["head"]) == b"busy PE\0" + rounds.to_bytes(8, "little")
    assert all(t < 0.2 for t in worst.values()), {k: f"{v * 1e3:.1f} ms"
                                                  for k, v in worst.items()}
