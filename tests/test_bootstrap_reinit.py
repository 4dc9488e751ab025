"""Re-initialisation after the last finalize (OpenSHMEM 1.6) at the bootstrap store: a PE that
said goodbye may join again, as the next generation, from the same process; a second live
connection, another process, or a PE that dropped its connection without a goodbye (a crash)
is refused, the last as the failure it is. Every wait has a time limit."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
import types
from typing import Any

import pytest
from test_bootstrap import (
    PE_DIR,
    SUB_TIMEOUT,
    _finish,
    _mpirun_cmd,
    clean_env,
    client,
    free_port,
    threads,
)
from test_multipe import MODES

from vkshmem.core.bootstrap import builtin
from vkshmem.core.bootstrap import client as client_mod
from vkshmem.core.bootstrap.members import Members, Refusal
from vkshmem.core.bootstrap.store import StoreClient, StoreServer
from vkshmem.core.bootstrap.wire import Msg, recv_frame, send_frame
from vkshmem.core.errors import BootstrapError

REJOIN = str(PE_DIR / "boot_rejoin.py")
REINIT = str(PE_DIR / "reinit.py")


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


# --------------------------------------------------------------------------------------------
# Real processes: env (torchrun style) and mpi; vkshmem run is tests/test_launcher.py's and
# tests/test_multipe_spec.py's (tests/pe/reinit.py)
# --------------------------------------------------------------------------------------------

def env_job(n: int, script: str, *args: str, **extra: str) -> list[tuple[int, str, str]]:
    """Run ``script`` as the ``n`` PEs of a torchrun-style job; (rc, stdout, stderr) each."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=clean_env(RANK=str(r), WORLD_SIZE=str(n),
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                            **extra))
             for r in range(n)]
    return _finish(procs)


def rejoined(out: str, name: str, n: int, generation: str) -> None:
    """Every PE printed its REJOINED line."""
    for r in range(n):
        line = f"REJOINED rank={r} size={n} name={name} generation={generation}"
        assert line in out, out


@pytest.mark.parametrize("n", [1, 2, 4])
def test_env_bootstrap_rejoin(n: int) -> None:
    """Rank 0 closes last: the others open again while its store from the first init is up.
    It stays up (rank 0's close waits only for this generation), and they all join it again."""
    results = env_job(n, REJOIN, "env", VKSHMEM_BOOTSTRAP_TIMEOUT="20")
    for rc, _out, err in results:
        assert rc == 0, err
    rejoined("".join(out for _, out, _ in results), "env", n, "1")


@pytest.mark.parametrize("mode", ["shm", "hostproxy"])
def test_env_bootstrap_reinit_runtime(mode: str) -> None:
    results = env_job(2, REINIT, VKSHMEM_SYMMETRIC_SIZE="64M", VKSHMEM_WAIT_TIMEOUT="60",
                      VKSHMEM_PLUGINS_ALLOW="", **MODES[mode])
    for rc, out, err in results:
        assert rc == 0, out + err
        assert f"routes: ['{mode}']" in out and "reinit ok: 2 PEs" in out, out


@pytest.mark.parametrize("n", [1, 2, 4])
def test_mpi_bootstrap_rejoin(n: int) -> None:
    cmd = [*_mpirun_cmd(n), sys.executable, REJOIN, "mpi"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUB_TIMEOUT,
                          env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rejoined(proc.stdout, "mpi", n, "-")


def test_mpi_bootstrap_reinit_runtime() -> None:
    cmd = [*_mpirun_cmd(2), sys.executable, REINIT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUB_TIMEOUT * 2,
                          env=clean_env(VKSHMEM_SYMMETRIC_SIZE="64M", VKSHMEM_PLUGINS_ALLOW=""))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("reinit ok: 2 PEs") == 2, proc.stdout


def test_mpi_bootstrap_after_mpi_finalize_says_why() -> None:
    cmd = [*_mpirun_cmd(2), sys.executable, REJOIN, "mpi", "mpi-finalized"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUB_TIMEOUT,
                          env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("REFUSED: BootstrapError: bootstrap 'mpi': MPI is already "
                             "finalized") == 2, proc.stdout
    assert "MPI cannot be initialised twice" in proc.stdout


@pytest.mark.parametrize(("finalized", "initialized", "match"), [
    (True, True, r"MPI is already finalized .* cannot be initialised twice"),
    (False, False, r"MPI is not initialised \(mpi4py.rc.initialize = False\?\)"),
])
def test_check_mpi_usable(finalized: bool, initialized: bool, match: str) -> None:
    fake = types.SimpleNamespace(Is_finalized=lambda: finalized,
                                 Is_initialized=lambda: initialized)
    with pytest.raises(BootstrapError, match=match):
        builtin.check_mpi_usable(fake)
    builtin.check_mpi_usable(types.SimpleNamespace(Is_finalized=lambda: False,
                                                   Is_initialized=lambda: True))


def test_a_hello_of_the_previous_protocol_is_told_the_mismatch() -> None:
    """A version-1 client (whose hello is shorter) learns why, instead of a dropped line."""
    with StoreServer(1) as server, socket.create_connection(server.address, timeout=5) as s:
        send_frame(s, Msg.HELLO, struct.pack("!4sBII", b"VKS\x01", 0, 0, 1))
        kind, payload = recv_frame(s, time.monotonic() + 5, 1 << 16)
        assert kind == Msg.ERROR and b"protocol mismatch" in payload
