"""Re-initialisation after the last finalize (OpenSHMEM 1.6) at the bootstrap store: a PE that
said goodbye may join again, as the next generation, from the same process; a second live
connection, another process, or a PE that dropped its connection without a goodbye (a crash)
is refused, the last as the failure it is. Every wait has a time limit."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from test_bootstrap import client, threads

from vkshmem.core.bootstrap import client as client_mod
from vkshmem.core.bootstrap.members import Members, Refusal
from vkshmem.core.bootstrap.store import StoreClient, StoreServer
from vkshmem.core.errors import BootstrapError


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``fn()`` in a thread; its result or exception lands in the returned box."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, box


# --------------------------------------------------------------------------------------------
# The member table alone
# --------------------------------------------------------------------------------------------

def test_members_admit_rules() -> None:
    m = Members(2)
    assert m.admit(0, b"a" * 8, 10) == 0
    refused = m.admit(0, b"b" * 8, 11)
    assert isinstance(refused, Refusal) and not refused.failure
    assert "already connected (process 10" in refused.text
    m.leave(0, said_bye=True)
    other = m.admit(0, b"b" * 8, 11)
    assert isinstance(other, Refusal) and "finalized in process 10" in other.text
    assert m.admit(0, b"a" * 8, 10) == 1  # the same process: the next generation
    m.leave(0, said_bye=False)  # crashed
    crash = m.admit(0, b"a" * 8, 10)
    assert isinstance(crash, Refusal) and crash.failure
    assert "without a goodbye" in crash.text


def test_members_absence_by_generation() -> None:
    m = Members(3)
    for r in range(3):
        m.admit(r, bytes([r]) * 8, r)
    m.leave(1, said_bye=True)
    assert "closed its bootstrap" in str(m.absent(1, 0, fail_fast=False))
    assert m.absent(1, 1, fail_fast=False) is None  # it may still join generation 1
    m.admit(1, bytes([1]) * 8, 1)
    assert "without taking part" in str(m.absent(1, 0, fail_fast=False))
    m.leave(2, said_bye=False)
    assert m.absent(2, 0, fail_fast=False) is None  # left to the launcher
    assert "without a goodbye" in str(m.absent(2, 0, fail_fast=True))
    assert m.exited(2) and not m.exited(2)
    assert "exited without finalizing" in str(m.absent(2, 0, fail_fast=False))
    assert m.connected() == [0, 1] and m.connected(up_to=0) == [0]


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fail_fast", [False, True])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_pe_rejoins_after_a_clean_close(n: int, fail_fast: bool) -> None:
    with StoreServer(n, fail_fast=fail_fast) as server:
        def pe(rank: int) -> list[Any]:
            out: list[Any] = []
            for gen in range(3):
                c = client(server, rank)
                try:
                    out.append(c.generation)
                    out.append(c.allgather(f"g{gen}r{rank}".encode()))
                    c.barrier()
                finally:
                    c.close()
            return out

        results = threads(n, pe)
        assert server.wait_members_gone(5)
    for res in results:
        assert not isinstance(res, BaseException), res
        for gen in range(3):
            assert res[2 * gen] == gen
            assert res[2 * gen + 1] == [f"g{gen}r{r}".encode() for r in range(n)]
    assert server.failures == []


def test_close_then_connect_again_at_once_never_races() -> None:
    """The client's close waits until the store recorded the goodbye."""
    with StoreServer(1) as server:
        for gen in range(30):
            c = client(server, 0)
            assert c.generation == gen
            assert c.allgather(b"x") == [b"x"]
            c.close()


@pytest.mark.parametrize("fail_fast", [False, True])
def test_a_new_generation_waits_for_a_pe_still_closing_the_old_one(fail_fast: bool) -> None:
    """PE 0 joined generation 1 and waits in its first round while PE 1 is still in generation
    0: PE 1's goodbye must not fail that round, and the rounds of the two generations never
    pair up."""
    with StoreServer(2, fail_fast=fail_fast) as server:
        c0, c1 = client(server, 0), client(server, 1)
        assert threads(2, lambda r: [c0, c1][r].allgather(bytes([r]))) == [[b"\0", b"\1"]] * 2
        c0.close()
        c0 = client(server, 0)
        t, box = in_thread(lambda: c0.allgather(b"new0"))
        time.sleep(0.3)
        assert t.is_alive()  # waiting for PE 1 to join generation 1
        c1.close()
        time.sleep(0.2)
        assert t.is_alive(), box
        c1 = client(server, 1)
        assert c1.allgather(b"new1") == [b"new0", b"new1"]
        t.join(10)
        assert box == {"result": [b"new0", b"new1"]}
        c0.close()
        c1.close()


def test_a_second_live_connection_for_a_connected_rank_is_refused() -> None:
    with StoreServer(2) as server:
        first = client(server, 1)
        with pytest.raises(BootstrapError, match=r"PE 1 is already connected \(process \d+; "
                                                 r"two processes with the same rank\?\)"):
            client(server, 1)
        # The refused one did not disturb the live one.
        c0 = client(server, 0)
        assert threads(2, lambda r: [c0, first][r].allgather(b"k")) == [[b"k", b"k"]] * 2
        assert server.failures == []
        first.close()
        c0.close()


def test_only_the_process_that_finalized_may_rejoin(monkeypatch: pytest.MonkeyPatch) -> None:
    with StoreServer(1) as server:
        client(server, 0).close()
        monkeypatch.setattr(client_mod, "_token", b"another!")  # as another process would
        with pytest.raises(BootstrapError, match=r"PE 0 finalized in process \d+; process "
                                                 r"\d+ cannot take its rank"):
            client(server, 0)


@pytest.mark.parametrize("fail_fast", [False, True])
def test_a_rejoin_after_a_crash_is_refused_as_a_failure(fail_fast: bool) -> None:
    seen: list[tuple[int, str]] = []
    with StoreServer(2, fail_fast=fail_fast,
                     on_failure=lambda r, t: seen.append((r, t))) as server:
        c0, c1 = client(server, 0, timeout=30), client(server, 1)
        assert c1._sock is not None
        c1._sock.close()  # as if the connection died with its process: no goodbye
        c1._sock = None
        deadline = time.monotonic() + 5
        while 1 in server.connected() and time.monotonic() < deadline:
            time.sleep(0.01)  # until the store saw the drop
        with pytest.raises(BootstrapError, match=r"PE 1 cannot join again: its previous "
                                                 r"connection .* ended without a goodbye"):
            client(server, 1)
        assert len(seen) == 1 and seen[0][0] == 1 and "without a goodbye" in seen[0][1]
        assert server.failures == seen  # the launcher hears of it and ends the job
        if fail_fast:  # no launcher: the others learn it at once
            with pytest.raises(BootstrapError, match="PE 1 left the job"):
                c0.allgather(b"x")
        c0.close()


def test_a_pe_that_does_not_rejoin_times_out_by_name() -> None:
    with StoreServer(2) as server:
        c0, c1 = client(server, 0, timeout=0.5), client(server, 1, timeout=0.5)
        c0.close()
        c1.close()
        c0 = client(server, 0, timeout=0.5)
        start = time.monotonic()
        with pytest.raises(BootstrapError) as info:
            c0.allgather(b"x")
        assert time.monotonic() - start < 5
        text = str(info.value)
        assert "allgather round 0 of runtime generation 1 timed out" in text, text
        assert "not initialised again yet: PE 1 (generation 0, finalized)" in text, text
        assert "VKSHMEM_BOOTSTRAP_TIMEOUT" in text
        c0.close()


def test_a_pe_whose_process_exited_fails_the_next_generation_at_once() -> None:
    with StoreServer(2) as server:
        c0, c1 = client(server, 0, timeout=30), client(server, 1)
        c0.close()
        c1.close()
        c0 = client(server, 0, timeout=30)
        t, box = in_thread(lambda: c0.allgather(b"x"))
        time.sleep(0.2)
        start = time.monotonic()
        server.member_exited(1)  # what the launcher says when PE 1's process ends
        t.join(10)
        assert time.monotonic() - start < 3
        assert isinstance(box.get("error"), BootstrapError), box
        assert "PE 1 will not take part: its process exited after it finalized " \
               "(generation 0); it did not initialise again" in str(box["error"])
        c0.close()


def test_waiting_for_members_of_one_generation() -> None:
    with StoreServer(2) as server:
        c0, c1 = client(server, 0), client(server, 1)
        c1.close()
        c1 = client(server, 1)  # already in generation 1
        c0.close()
        start = time.monotonic()
        assert server.wait_members_gone(5, generation=0)
        assert time.monotonic() - start < 1
        assert server.wait_members_gone(0.2) is False  # PE 1 is still connected
        c1.close()
        assert server.wait_members_gone(5)


def test_a_client_closing_against_a_dead_store_does_not_hang() -> None:
    server = StoreServer(1).start()
    c = StoreClient(*server.address, 0, 1, timeout=0)  # no time limit at all
    server.close()
    start = time.monotonic()
    c.close()
    assert time.monotonic() - start < 6
