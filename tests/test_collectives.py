"""Collectives: tests/pe/coll.py under the launcher at 1-4 PEs over shm, hostproxy and UCX (and
with a small team scratch, so every algorithm runs in chunks), and unit tests of the offload
dispatch and the OP enum."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from test_multipe import MODE_PARAMS, MODES, check_run, launch

from vkshmem.core.collectives.team import find_offload
from vkshmem.core.transports.contract import CollectiveArgs, PeerInfo, SegmentInfo, Transport


def _run(npes: int, mode: str, extra: Mapping[str, str] | None = None) -> None:
    check_run(launch("coll", npes, {**MODES[mode], **(extra or {})}, timeout=150), "coll",
              npes, mode)


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("npes", [1, 2, 3, 4])
def test_collectives(npes: int, mode: str) -> None:
    _run(npes, mode)


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_collectives_small_scratch(mode: str) -> None:
    """64K of team scratch: reductions, scans and strided alltoalls run in many chunks."""
    _run(3, mode, {"VKSHMEM_TEAM_SCRATCH": "64K"})


class _Hook(Transport):
    """A transport that implements only the offload hook (the data path is never used)."""

    def __init__(self, offers: set[str]) -> None:
        self.offers = offers
        self.asked: list[tuple[str, tuple[int, ...]]] = []

    def collective(self, name: str,
                   team_pes: tuple[int, ...]) -> Callable[[CollectiveArgs], None] | None:
        self.asked.append((name, team_pes))
        return self.run if name in self.offers else None

    def run(self, args: CollectiveArgs) -> None:
        pass

    def register(self, segment: SegmentInfo) -> bytes:
        raise NotImplementedError

    def address(self) -> bytes:
        raise NotImplementedError

    def connect(self, peers: Mapping[int, PeerInfo]) -> None:
        raise NotImplementedError

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        raise NotImplementedError

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        raise NotImplementedError

    def amo(self, pe: int, seg: int, offset: int, op: object, width: int, operand: int,
            compare: int, fetch: bool) -> int:
        raise NotImplementedError

    def fence(self) -> None:
        raise NotImplementedError

    def quiet(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_offload_used_only_when_every_member_shares_the_transport() -> None:
    a, b = _Hook({"reduce"}), _Hook({"reduce"})
    impl = find_offload([a, a, a], "reduce", (4, 5, 6))
    assert impl == a.run and a.asked == [("reduce", (4, 5, 6))]
    assert find_offload([a, a, a], "broadcast", (4, 5, 6)) is None  # declined
    a.asked.clear()
    # two objects (even of one class, even both offering it): the core's algorithm, and the
    # transports are not even asked
    assert find_offload([a, b, a], "reduce", (0, 1, 2)) is None
    assert find_offload([a, a, b], "reduce", (0, 1, 2)) is None
    assert a.asked == [] and b.asked == []
    assert find_offload([b], "reduce", (3,)) == b.run
    assert find_offload([], "reduce", ()) is None


def test_default_transport_offers_nothing() -> None:
    hook = _Hook(set())
    assert Transport.collective(hook, "reduce", (0, 1)) is None


def test_op_enum() -> None:
    from vkshmem._api.enums import OP

    assert [op.value for op in OP] == ["and", "or", "xor", "max", "min", "sum", "prod"]
    assert OP.SUM == "sum" and str(OP.PROD) == "prod" and OP("max") is OP.MAX
