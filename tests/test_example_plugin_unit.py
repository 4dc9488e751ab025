"""Unit tests of the out-of-tree example transport plugin (examples/example-transport).

Two transports are opened by hand in one process as PE 0 and PE 1 of a two-PE job, each with a
memfd-backed segment, and connected through :class:`PeerInfo` as the core would. PE 1's segment
is reached through ``/proc/<pid>/fd/<fd>`` like a peer process's would be.
"""

from __future__ import annotations

import json
import os
import random
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from vkshmem.core._native import lib as native

from vkshmem.core.errors import ConfigError, InvalidArgumentError, TransportError
from vkshmem.core.transport import AmoOp, PeerInfo, TransportContext

# Pure Python: its unit tests import it from its folder (test_plugins.py pip-installs it).
sys.path.insert(0, str(Path(__file__).parent.parent / "examples" / "example-transport"))
from segments import Segment
from vkshmem_example_transport import ExampleTransport

pytestmark = pytest.mark.timeout(60)

SIZE = 256 * 1024


def context(pe: int, n: int = 2, node: str = "node0",
            options: dict[str, str] | None = None) -> TransportContext:
    return TransportContext(
        my_pe=pe, n_pes=n, rail=0, options=dict(options or {}), node_id=node,
        host_address="127.0.0.1", amo_function=native.vk_amo_address(),
    )


class Pair:
    def __init__(self, options: dict[str, str] | None = None) -> None:
        self.segs = [Segment(0, SIZE), Segment(0, SIZE)]
        self.t = [ExampleTransport(context(pe, options=options)) for pe in (0, 1)]
        peers = {pe: PeerInfo(pe, "node0", True, tr.address(), {0: tr.register(seg.info())})
                 for pe, (tr, seg) in enumerate(zip(self.t, self.segs, strict=True))}
        for tr in self.t:
            tr.connect(peers)

    def close(self) -> None:
        for tr in self.t:
            tr.close()
        for seg in self.segs:
            seg.close()  # fails (BufferError) if the transport still held a view of it


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def test_put_get_random(pair: Pair) -> None:
    rng = random.Random(7)
    for _ in range(200):
        src, pe = rng.randrange(2), rng.randrange(2)
        n = rng.choice([0, 1, 8, rng.randrange(1, 70_000)])
        offset = rng.randrange(0, SIZE - n + 1)
        data = rng.randbytes(n)
        pair.t[src].put(pe, 0, offset, memoryview(data))
        pair.t[src].quiet()
        assert pair.segs[pe].map[offset:offset + n] == data
        out = bytearray(n)
        pair.t[src].get(pe, 0, offset, memoryview(out))
        assert out == data


def test_typed_views(pair: Pair) -> None:
    pair.t[0].put(1, 0, 8, memoryview(struct.pack("<2d", 1.5, -2.0)).cast("d"))
    dst = memoryview(bytearray(16)).cast("d")
    pair.t[0].get(1, 0, 8, dst)
    assert dst.tolist() == [1.5, -2.0]


@pytest.mark.parametrize("width", [4, 8])
def test_amos(pair: Pair, width: int) -> None:
    tr, mem = pair.t[0], pair.segs[1].map
    mask = (1 << (8 * width)) - 1

    def word() -> int:
        return int.from_bytes(mem[0:width], "little")

    mem[0:width] = (10).to_bytes(width, "little")
    assert tr.amo(1, 0, 0, AmoOp.ADD, width, 5, 0, True) == 10
    assert word() == 15
    assert tr.amo(1, 0, 0, AmoOp.ADD, width, mask, 0, True) == 15  # adding -1
    assert word() == 14
    assert tr.amo(1, 0, 0, AmoOp.FETCH, width, 0, 0, True) == 14
    assert tr.amo(1, 0, 0, AmoOp.SWAP, width, 3, 0, True) == 14
    assert tr.amo(1, 0, 0, AmoOp.CSWAP, width, 9, 4, True) == 3  # fails
    assert word() == 3
    assert tr.amo(1, 0, 0, AmoOp.CSWAP, width, 9, 3, True) == 3  # succeeds
    assert word() == 9
    tr.amo(1, 0, 0, AmoOp.SET, width, 0b1100, 0, False)
    assert tr.amo(1, 0, 0, AmoOp.AND, width, 0b1010, 0, True) == 0b1100
    assert tr.amo(1, 0, 0, AmoOp.OR, width, 0b0001, 0, True) == 0b1000
    assert tr.amo(1, 0, 0, AmoOp.XOR, width, 0b1111, 0, True) == 0b1001
    assert word() == 0b0110
    tr.amo(0, 0, 0, AmoOp.SET, width, 77, 0, False)  # own segment
    assert int.from_bytes(pair.segs[0].map[0:width], "little") == 77


def test_bad_requests(pair: Pair) -> None:
    tr = pair.t[0]
    with pytest.raises(InvalidArgumentError):
        tr.put(1, 0, SIZE - 2, memoryview(b"abcd"))
    with pytest.raises(InvalidArgumentError):
        tr.amo(1, 0, 4, AmoOp.ADD, 8, 1, 0, True)
    with pytest.raises(TransportError, match="segment 3"):
        tr.get(1, 3, 0, memoryview(bytearray(1)))
    with pytest.raises(ConfigError, match="VKSHMEM_RAIL0"):
        ExampleTransport(context(0, options={"nope": "1"}))


def test_reaches_only_same_node() -> None:
    tr = ExampleTransport(context(0, node="nodeA"))
    try:
        assert tr.reaches(PeerInfo(1, "nodeA", True, b"{}", {}))
        assert not tr.reaches(PeerInfo(1, "nodeB", False, b"{}", {}))
        assert not tr.reaches(PeerInfo(1, "nodeA", True, None, {}))
    finally:
        tr.close()


def test_stats_file_and_close_twice(tmp_path: Path) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    p = Pair(options={"stats": str(tmp_path / "counts")})
    p.t[0].put(1, 0, 0, memoryview(b"x"))
    p.t[0].put(1, 0, 1, memoryview(b"y"))
    p.t[0].get(1, 0, 0, memoryview(bytearray(2)))
    p.t[1].amo(0, 0, 0, AmoOp.ADD, 8, 1, 0, True)
    p.close()
    p.t[0].close()  # second close is a no-op
    assert json.loads((tmp_path / "counts.0").read_text()) == {"puts": 2, "gets": 1, "amos": 0}
    assert json.loads((tmp_path / "counts.1").read_text()) == {"puts": 0, "gets": 0, "amos": 1}
    assert len(os.listdir("/proc/self/fd")) == fds
