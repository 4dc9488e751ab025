"""The bootstrap store under attack: wrong secrets, replays, garbage, truncated and oversized
frames, stalled frames, unauthenticated control requests and a flood of idle connections.

Real sockets against a real :class:`StoreServer` in this process; after each attack the store
must still serve a real job, must not have grown its memory or threads, and must never have
told the attacker what it expected.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from attack import read_all, rss_kib

from vkshmem.core.auth import derive_key, new_secret
from vkshmem.core.bootstrap import store as store_module
from vkshmem.core.bootstrap.store import MAX_PENDING, StoreClient, StoreServer
from vkshmem.core.bootstrap.wire import (
    HEADER,
    HELLO,
    MAGIC,
    MAX_BLOB,
    Msg,
    Role,
    client_proof,
    recv_frame,
    send_frame,
)
from vkshmem.core.errors import BootstrapError

pytestmark = pytest.mark.timeout(120)

SECRET = new_secret()
JOB_ID = "job-id-XYZZY"  # must never be echoed to a stranger


@pytest.fixture
def server() -> Iterator[StoreServer]:
    with StoreServer(2, job_id=JOB_ID, secret=SECRET) as s:
        yield s


def client(server: StoreServer, rank: int, secret: bytes = SECRET, **kw: object) -> StoreClient:
    host, port = server.address
    return StoreClient(host, port, rank, server.size, timeout=10, job_id=JOB_ID,
                       secret=secret, **kw)  # type: ignore[arg-type]


def job_still_works(server: StoreServer) -> None:
    """Both PEs of the job join, exchange blobs and leave, within a few seconds."""
    out: dict[int, list[bytes]] = {}

    def pe(rank: int) -> None:
        c = client(server, rank)
        try:
            out[rank] = c.allgather(b"blob %d" % rank)
        finally:
            c.close()

    threads = [threading.Thread(target=pe, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out == {0: [b"blob 0", b"blob 1"], 1: [b"blob 0", b"blob 1"]}


def hello_bytes(rank: int = 0, size: int = 2, role: Role = Role.MEMBER,
                job_id: str = JOB_ID) -> bytes:
    return HELLO.pack(MAGIC, int(role), rank, size, os.getpid(), b"T" * 8,
                      b"N" * 16) + job_id.encode()


def raw(server: StoreServer) -> socket.socket:
    return socket.create_connection(server.address, timeout=10)






# -- wrong secrets and replays -------------------------------------------------------------


def test_a_client_with_the_wrong_secret_is_refused_and_told_nothing(server: StoreServer) -> None:
    with pytest.raises(BootstrapError, match="could not prove that it knows this job's "
                       "secret") as info:
        client(server, 0, secret=new_secret())
    assert JOB_ID not in str(info.value)
    # The raw exchange: the store's challenge and refusal quote neither its job nor its size.
    with raw(server) as s:
        send_frame(s, Msg.HELLO, hello_bytes(rank=1, size=7, job_id="other"))
        kind, challenge = recv_frame(s, time.monotonic() + 5, 4096)
        assert kind == Msg.CHALLENGE and len(challenge) == 48
        send_frame(s, Msg.AUTH, b"\0" * 32)
        rest = read_all(s)
    assert b"authentication failed" in rest
    assert JOB_ID.encode() not in challenge + rest and b" 2 " not in rest
    assert server.dropped["auth"] == 1
    job_still_works(server)


def test_a_member_with_the_secret_but_other_claims_is_told_only_what_it_claimed(
    server: StoreServer,
) -> None:
    with pytest.raises(BootstrapError, match="thinks the job has 7 PEs") as info:
        StoreClient(*server.address, 0, 7, timeout=5, job_id=JOB_ID, secret=SECRET)
    assert "2" not in str(info.value).split(f":{server.address[1]}: ")[1]
    with pytest.raises(BootstrapError, match="job id mismatch") as info:
        StoreClient(*server.address, 0, 2, timeout=5, job_id="stale", secret=SECRET)
    assert JOB_ID not in str(info.value)
    job_still_works(server)


def test_a_replayed_answer_is_refused(server: StoreServer) -> None:
    """An eavesdropper records a real client's hello and answer; replaying them on a new
    connection fails, because the store's challenge is new."""
    key = derive_key(SECRET, "store")
    hello = hello_bytes(rank=0)
    with raw(server) as s:
        send_frame(s, Msg.HELLO, hello)
        _, challenge = recv_frame(s, time.monotonic() + 5, 4096)
        recorded = client_proof(key, hello, challenge[:16])
        send_frame(s, Msg.AUTH, recorded)
        kind, _ = recv_frame(s, time.monotonic() + 5, 4096)
        assert kind == Msg.OK  # the genuine exchange works
        send_frame(s, Msg.BYE)
        read_all(s)
    with raw(server) as s:
        send_frame(s, Msg.HELLO, hello)
        recv_frame(s, time.monotonic() + 5, 4096)
        send_frame(s, Msg.AUTH, recorded)  # replayed
        assert b"authentication failed" in read_all(s)
    assert server.dropped["auth"] == 1


def test_an_unauthenticated_control_connection_cannot_abort_or_fail_the_job() -> None:
    seen: list[tuple[str, int]] = []
    with StoreServer(2, job_id=JOB_ID, secret=SECRET, fail_fast=True,
                     on_abort=lambda r, s: seen.append(("abort", r)),
                     on_failure=lambda r, t: seen.append(("failure", r))) as server:
        for kind, payload in ((Msg.ABORT, struct.pack("!i", 3)), (Msg.FAILURE, b"x")):
            with raw(server) as s:  # skips the handshake: straight to the request
                send_frame(s, Msg.HELLO, hello_bytes(role=Role.CONTROL))
                recv_frame(s, time.monotonic() + 5, 4096)
                send_frame(s, kind, payload)
                read_all(s)
        stranger = StoreClient.__new__(StoreClient)  # a real client with the wrong secret
        with pytest.raises(BootstrapError):
            StoreClient.__init__(stranger, *server.address, 0, 2, timeout=5, job_id=JOB_ID,
                                 secret=new_secret(), role=Role.CONTROL)
        assert seen == [] and server.aborts == [] and server.failures == []
        job_still_works(server)


def test_a_stranger_cannot_take_a_rank_before_the_real_pe(server: StoreServer) -> None:
    with pytest.raises(BootstrapError):
        client(server, 0, secret=b"guessed-secret-guessed-secret")
    assert server.connected() == []
    job_still_works(server)


# -- malformed input -----------------------------------------------------------------------

GARBAGE = [
    ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("truncated header", HEADER.pack(Msg.HELLO, 40)[:5]),
    ("truncated hello", HEADER.pack(Msg.HELLO, 200) + b"VKS\x03" + b"\0" * 20),
    ("oversized header", HEADER.pack(Msg.HELLO, 1 << 40)),
    ("oversized after hello", HEADER.pack(Msg.HELLO, MAX_BLOB * 4) + b"x" * 1000),
    ("zero kind", HEADER.pack(0, 0)),
    ("random", bytes(range(256)) * 8),
    ("old protocol", HEADER.pack(Msg.HELLO, 17) + struct.pack("!4sBIII", b"VKS\x01", 0, 0,
                                                              1, 0)),
]


@pytest.mark.parametrize("what,data", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_is_dropped_and_the_job_still_works(server: StoreServer, what: str,
                                                    data: bytes) -> None:
    with raw(server) as s:
        with contextlib.suppress(OSError):  # the store may drop it before it is all sent
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        answer = read_all(s)
    assert JOB_ID.encode() not in answer
    job_still_works(server)


def test_a_stalled_frame_is_dropped_after_the_frame_timeout(
    server: StoreServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_module, "FRAME_TIMEOUT", 0.5)
    with raw(server) as s:
        s.sendall(HEADER.pack(Msg.HELLO, 100) + b"VKS")  # and then nothing
        start = time.monotonic()
        assert read_all(s) == b""
        assert time.monotonic() - start < 5


def test_a_silent_connection_is_dropped_after_the_hello_timeout(
    server: StoreServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_module, "HELLO_TIMEOUT", 0.5)
    with raw(server) as s:
        start = time.monotonic()
        assert read_all(s) == b""
        assert time.monotonic() - start < 5


def test_an_oversized_allgather_blob_is_refused_before_sending(server: StoreServer) -> None:
    c = client(server, 0)
    try:
        with pytest.raises(BootstrapError, match="larger than the store's limit"):
            c.allgather(b"x" * (MAX_BLOB + 1))
    finally:
        c.close()


# -- a flood of idle connections -------------------------------------------------------------


def test_a_flood_of_idle_connections_neither_blocks_the_job_nor_grows_the_store(
    server: StoreServer,
) -> None:
    job_still_works(server)  # warm up: first-use allocations are not growth
    threads_before, rss_before = threading.active_count(), rss_kib()
    for _ in range(2):
        flood = []
        try:
            for _ in range(300):
                flood.append(raw(server))
            time.sleep(0.5)
            # Threads are bounded: at most MAX_PENDING connections wait for a hello at a time.
            assert threading.active_count() - threads_before <= MAX_PENDING + 2
            job_still_works(server)
        finally:
            for s in flood:
                s.close()
    deadline = time.monotonic() + 10
    while threading.active_count() > threads_before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threading.active_count() <= threads_before + 2
    assert server.dropped["pending"] >= 300
    assert rss_kib() - rss_before < 32 * 1024, "the store grew by more than 32 MiB"
