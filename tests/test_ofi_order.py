"""fence over the ofi transport where the provider grants write-after-write ordering.

``tcp;ofi_rxm`` grants FI_ORDER_RMA_WAW on both sides, so fence there waits only for the
outstanding AMOs and leaves puts in flight; ``shm`` grants FI_ORDER_SAS only, so fence waits
for every write; the rail option ``fence=quiet`` forces the latter. The ordering a fence
promises is checked at the target while the puts are in flight. Real libfabric, one process.
"""

from __future__ import annotations

import threading

import pytest

from vkshmem.core.errors import ConfigError
from vkshmem.core.transports.contract import AmoOp

pytest.importorskip("vkshmem_ofi")
from test_ofi_unit import Job, context
from vkshmem_ofi._transport import OfiTransport

from vkshmem.testing.transport import word

pytestmark = pytest.mark.timeout(120)

DATA, SIZE, ROUNDS = 8192, 256 * 1024, 120


@pytest.mark.parametrize(("prov", "fence", "mode"), [
    ("tcp;ofi_rxm", "auto", "amos"), ("shm", "auto", "writes"), ("tcp;ofi_rxm", "quiet", "writes"),
])
def test_fence_waits_for_what_the_provider_does_not_order(prov: str, fence: str,
                                                          mode: str) -> None:
    with Job(options={"provider": prov, "fence": fence}) as job:
        assert job.t[0][0].stats()["fence"] == mode


def test_fence_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"VKSHMEM_RAIL0.*fence='sometimes'"):
        OfiTransport(context(0, 1, options={"fence": "sometimes"}))


@pytest.mark.parametrize("prov", ["tcp;ofi_rxm", "shm"])
@pytest.mark.parametrize("flag_by", ["put", "amo"])
def test_a_flag_after_fence_never_overtakes_the_data(prov: str, flag_by: str) -> None:
    """put_nbi 256 KiB of byte i; fence; flag = i (by put_nbi or atomic set): a watcher on the
    target that sees flag k always finds data of round k or later at both ends. Over tcp the
    put-flag case rests on the provider's granted FI_ORDER_RMA_WAW alone (fence no longer
    waits for the data)."""
    with Job(options={"provider": prov}) as job:
        tr, mem = job.t[0][0], job.mem(1)
        bad: list[tuple[int, int, int]] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                flag = word(mem, 0, 8)
                first, last = mem[DATA], mem[DATA + SIZE - 1]
                if first < flag or last < flag:
                    bad.append((flag, first, last))

        watcher = threading.Thread(target=watch)
        watcher.start()
        keep = []
        try:
            for i in range(1, ROUNDS + 1):
                data = memoryview(bytes([i]) * SIZE)
                keep.append(data)
                tr.put_nbi(1, 0, DATA, data)
                tr.fence()
                if flag_by == "put":
                    flag = memoryview(i.to_bytes(8, "little"))
                    keep.append(flag)
                    tr.put_nbi(1, 0, 0, flag)
                else:
                    tr.amo(1, 0, 0, AmoOp.SET, 8, i, 0, False)
            tr.quiet()
        finally:
            stop.set()
            watcher.join()
        assert word(mem, 0, 8) == ROUNDS and mem[DATA] == ROUNDS
        assert not bad, bad[:5]
