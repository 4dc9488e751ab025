"""The hostproxy server under attack: wrong secrets (both ways), replays, requests before
authentication, garbage, truncated and oversized headers, out-of-range PEs and offsets, stalled
requests and a flood of idle connections.

A real two-PE job of hand-opened transports (as in test_hostproxy_unit.py); after each attack
the server must still serve the job, must not have touched memory or grown, and its replies to
strangers must say nothing of the job.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from attack import read_all, rss_kib

from vkshmem.core.auth import derive_key
from vkshmem.core.errors import TransportError
from vkshmem.core.transports.contract import PeerInfo

pytest.importorskip("vkshmem_hostproxy")
from test_hostproxy_unit import REP, REQ, SEG_SIZES, Job, raw_connect, recv_exact
from vkshmem_hostproxy import HostProxyTransport
from vkshmem_hostproxy._client import hp_mac
from vkshmem_hostproxy._server import lib as hp

from vkshmem.testing import transport as contract
from vkshmem.testing.transport import context

pytestmark = pytest.mark.timeout(120)

CLIENT = b"vkshmem hostproxy client v2"


@pytest.fixture
def job() -> Iterator[Job]:
    with Job(options={"addr": "127.0.0.1", "timeout": "1"}) as j:
        yield j


def job_still_works(job: Job) -> None:
    job.t[0][0].put(1, 0, 64, memoryview(b"still ok"))
    out = bytearray(8)
    job.t[0][0].get(1, 0, 64, memoryview(out))
    assert out == b"still ok"


def untouched(job: Job) -> None:
    for seg in job.segs[1].values():
        seg.map[:] = b"\xa5" * len(seg.map)


def still_untouched(job: Job) -> None:
    for seg in job.segs[1].values():
        assert seg.map[:] == b"\xa5" * len(seg.map)


def stranger(job: Job, secret: bytes) -> HostProxyTransport:
    """A transport of PE 0 of 2 with ``secret``, told where PE 1's server is."""
    tr = HostProxyTransport(context(0, 2, options={"addr": "127.0.0.1"}, secret=secret))
    target = job.t[0][1]
    tr.connect({1: PeerInfo(1, "node0", True, target.address(),
                            {0: struct.pack("<IQ", 0, SEG_SIZES[0])})})
    return tr






# -- secrets ---------------------------------------------------------------------------------


def test_a_client_with_the_wrong_secret_is_refused(job: Job) -> None:
    untouched(job)
    target = job.t[0][1]
    tr = stranger(job, b"not-the-job-secret-at-all")
    try:
        # The server's proof does not verify under the stranger's key: it stops there.
        with pytest.raises(TransportError, match="could not prove that it knows this job's "
                           "secret"):
            tr.put(1, 0, 0, memoryview(b"intruder"))
    finally:
        tr.close()
    # A raw client that skips checking the server and sends a made-up answer is refused too.
    with socket.create_connection(target.listen_address, timeout=10) as s:
        s.sendall(REQ.pack(hp.HP_OP_HELLO, 0, 0, 0, hp.HP_MAGIC, hp.HP_VERSION, 0) + b"n" * 16)
        assert REP.unpack(recv_exact(s, REP.size))[0] == 0
        recv_exact(s, 48)
        s.sendall(REQ.pack(hp.HP_OP_AUTH, 0, 0, 0, 0, 0, 0) + b"\0" * 32)
        s.sendall(REQ.pack(hp.HP_OP_PUT, 0, 0, 0, 0, 8, 0) + b"intruder")
        reply = recv_exact(s, REP.size)
        assert REP.unpack(reply)[0] == hp.VK_ST_AUTH
        assert read_all(s) == b""  # dropped, nothing more said
    still_untouched(job)
    stats = target.server_stats()
    assert stats["errors"] == 0 and stats["refused"] >= 1
    job_still_works(job)


def test_a_server_without_the_secret_is_not_trusted(job: Job) -> None:
    """A server of another job (another secret) at the address a peer published: the client
    refuses it before sending any data."""
    impostor = HostProxyTransport(context(1, 2, options={"addr": "127.0.0.1"},
                                          secret=b"another-jobs-secret-here"))
    tr = job.t[0][0].create_context()
    try:
        tr.connect({1: PeerInfo(1, "node0", True, impostor.address(),
                                {0: struct.pack("<IQ", 0, SEG_SIZES[0])})})
        with pytest.raises(TransportError, match="could not prove"):
            tr.put(1, 0, 0, memoryview(b"for PE 1 only"))
        assert impostor.server_stats()["requests"] == 0
    finally:
        tr.close()
        impostor.close()


def test_a_replayed_answer_is_refused(job: Job) -> None:
    target = job.t[0][1]
    key = derive_key(contract.SECRET, "hostproxy")
    nc = b"c" * 16
    hello = REQ.pack(hp.HP_OP_HELLO, 0, 0, 0, hp.HP_MAGIC, hp.HP_VERSION, 0) + nc
    with socket.create_connection(target.listen_address, timeout=10) as s:
        s.sendall(hello)
        recv_exact(s, REP.size)
        ns = recv_exact(s, 48)[:16]
        answer = REQ.pack(hp.HP_OP_AUTH, 0, 0, 0, 0, 0, 0) + hp_mac(key, CLIENT, nc, ns, 0, 1)
        s.sendall(answer)
        assert REP.unpack(recv_exact(s, REP.size))[0] == 0  # genuine: admitted
    with socket.create_connection(target.listen_address, timeout=10) as s:
        s.sendall(hello)  # the same hello and the recorded answer
        recv_exact(s, REP.size + 48)
        s.sendall(answer)
        assert REP.unpack(recv_exact(s, REP.size))[0] == hp.VK_ST_AUTH
    job_still_works(job)


# -- malformed input -------------------------------------------------------------------------

BEFORE_AUTH = [
    ("get before auth", REQ.pack(hp.HP_OP_GET, 0, 0, 0, 0, 8, 0), hp.VK_ST_AUTH),
    ("put before auth", REQ.pack(hp.HP_OP_PUT, 0, 0, 0, 0, 8, 0) + b"X" * 8, hp.VK_ST_AUTH),
    ("auth before hello", REQ.pack(hp.HP_OP_AUTH, 0, 0, 0, 0, 0, 0) + b"\0" * 32,
     hp.VK_ST_AUTH),
    ("hello from PE 5 of 2", REQ.pack(hp.HP_OP_HELLO, 0, 0, 5, hp.HP_MAGIC, hp.HP_VERSION,
                                      0), hp.VK_ST_HELLO),
    ("hello of version 1", REQ.pack(hp.HP_OP_HELLO, 0, 0, 0, hp.HP_MAGIC, 1, 0), hp.VK_ST_HELLO),
    ("unknown op", REQ.pack(200, 0, 0, 0, 0, 0, 0), hp.VK_ST_AUTH),
    ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b" " * 8, hp.VK_ST_AUTH),
]


@pytest.mark.parametrize("what,data,status", BEFORE_AUTH, ids=[b[0] for b in BEFORE_AUTH])
def test_requests_before_authentication_are_refused(job: Job, what: str, data: bytes,
                                                    status: int) -> None:
    untouched(job)
    with socket.create_connection(job.t[0][1].listen_address, timeout=10) as s:
        s.sendall(data)
        reply = recv_exact(s, REP.size)
        assert REP.unpack(reply)[0] == status
        assert read_all(s) == b""
    still_untouched(job)
    assert job.t[0][1].server_stats()["errors"] == 0  # strangers are not the job's errors
    job_still_works(job)


OUT_OF_RANGE = [
    ("offset past the end", REQ.pack(hp.HP_OP_GET, 0, 0, 0, SEG_SIZES[0], 8, 0)),
    ("offset wraps", REQ.pack(hp.HP_OP_GET, 0, 0, 0, 2**64 - 4, 8, 0)),
    ("size of 2**63", REQ.pack(hp.HP_OP_PUT, 0, 0, 0, 0, 2**63, 0)),
    ("segment 255", REQ.pack(hp.HP_OP_GET, 0, 0, 255, 0, 8, 0)),
    ("AMO at the last byte", REQ.pack(hp.HP_OP_AMO_FETCH, 4, 8, 0, SEG_SIZES[0] - 1, 1, 0)),
]


@pytest.mark.parametrize("what,data", OUT_OF_RANGE, ids=[o[0] for o in OUT_OF_RANGE])
def test_out_of_range_requests_of_a_peer_touch_nothing(job: Job, what: str,
                                                       data: bytes) -> None:
    untouched(job)
    with contextlib.closing(raw_connect(job.t[0][1])) as s:
        s.sendall(data)
        assert REP.unpack(recv_exact(s, REP.size))[0] in (hp.VK_ST_BOUNDS, hp.VK_ST_SEG)
        assert read_all(s) == b""
    still_untouched(job)
    job_still_works(job)


def test_truncated_requests_and_silent_connections_are_dropped_in_time(job: Job) -> None:
    target = job.t[0][1]
    # A stranger that says nothing, one that stops mid-hello, a peer that stops mid-header and
    # one that stops mid-payload: each is dropped within about the rail's timeout (1 s).
    silent = socket.create_connection(target.listen_address, timeout=10)
    mid_hello = socket.create_connection(target.listen_address, timeout=10)
    mid_hello.sendall(REQ.pack(hp.HP_OP_HELLO, 0, 0, 0, hp.HP_MAGIC, hp.HP_VERSION, 0) + b"n")
    mid_header = raw_connect(target)
    mid_header.sendall(REQ.pack(hp.HP_OP_GET, 0, 0, 0, 0, 8, 0)[:10])
    mid_payload = raw_connect(target)
    mid_payload.sendall(REQ.pack(hp.HP_OP_PUT, 0, 0, 0, 0, 1000, 0) + b"x" * 10)
    start = time.monotonic()
    for s in (silent, mid_hello, mid_header, mid_payload):
        with contextlib.closing(s):
            read_all(s)
    assert time.monotonic() - start < 6
    stats = target.server_stats()
    assert stats["stalled"] == 2 and stats["open"] <= 1  # (job_still_works' own connection)
    job_still_works(job)


def closed_by_server(s: socket.socket, wait: float) -> bool:
    """Whether the server has closed ``s`` (FIN or reset), waiting at most ``wait`` s."""
    s.settimeout(wait)
    try:
        return s.recv(1) == b""  # (a stranger's HELLO is answered only once it is complete)
    except TimeoutError:
        return False
    except OSError:  # reset: the server closed with our bytes unread
        return True


def test_a_trickled_hello_does_not_buy_time(job: Job) -> None:
    """Slowloris: bytes that keep arriving do not extend the deadline to authenticate, which
    counts from accept (the rail's timeout here, 1 s): a valid-looking HELLO sent a byte every
    0.2 s (48 bytes: 9.6 s) is cut off after about 1 s."""
    target = job.t[0][1]
    before = target.server_stats()
    hello = REQ.pack(hp.HP_OP_HELLO, 0, 0, 0, hp.HP_MAGIC, hp.HP_VERSION, 0) + b"n" * 16
    with socket.create_connection(target.listen_address, timeout=10) as s:
        start = time.monotonic()
        closed_at = None
        for byte in hello:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed_at = time.monotonic() - start
                break
            if closed_by_server(s, 0.2):
                closed_at = time.monotonic() - start
                break
            if time.monotonic() - start > 4:
                break
    assert closed_at is not None, "the server kept a trickling stranger for over 4 s"
    assert closed_at < 1 + 0.25 + 0.75  # the deadline, the sweep's period and a margin
    stats = target.server_stats()
    assert stats["refused"] == before["refused"] + 1
    assert stats["errors"] == 0 and stats["last_error"] == ""
    job_still_works(job)


def test_strangers_that_leave_are_counted_not_recorded(job: Job) -> None:
    """Connections that never authenticated and failed (closed mid-header, mid-HELLO, mid-AUTH,
    reset, or said nothing) count as refused; they are not the job's errors, and last_error
    stays empty (it describes the job's own peers)."""
    target = job.t[0][1]
    before = target.server_stats()
    hello = REQ.pack(hp.HP_OP_HELLO, 0, 0, 0, hp.HP_MAGIC, hp.HP_VERSION, 0)
    auth = REQ.pack(hp.HP_OP_AUTH, 0, 0, 0, 0, 0, 0)

    def leave(data: bytes, challenge: bool = False, reset: bool = False) -> None:
        with socket.create_connection(target.listen_address, timeout=10) as s:
            s.sendall(hello + b"n" * 16 if challenge else b"")
            if challenge:
                assert REP.unpack(recv_exact(s, REP.size))[0] == 0
                recv_exact(s, hp.HP_NONCE + hp.HP_MAC)
            if data:
                s.sendall(data)
            time.sleep(0.05)  # let the server read it before the connection ends
            if reset:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    strangers = [
        lambda: leave(b""),                                  # said nothing
        lambda: leave(hello[:10]),                           # mid-header
        lambda: leave(hello + b"n" * 5),                     # mid-nonce (claims PE 0)
        lambda: leave(auth + b"m" * 7, challenge=True),      # mid-AUTH
        lambda: leave(hello[:20], reset=True),               # reset mid-header
        lambda: leave(hello + b"n" * 3, reset=True),         # reset mid-nonce
        lambda: leave(auth[:5], challenge=True, reset=True),  # reset mid-AUTH
    ]
    for go in strangers:
        go()
    deadline = time.monotonic() + 5
    while (target.server_stats()["refused"] < before["refused"] + len(strangers)
           and time.monotonic() < deadline):
        time.sleep(0.05)
    stats = target.server_stats()
    assert stats["errors"] == 0, stats["last_error"]
    assert stats["last_error"] == ""
    assert stats["refused"] == before["refused"] + len(strangers)
    assert stats["open"] == 0
    job_still_works(job)
    assert target.server_stats()["errors"] == 0


# -- a flood ---------------------------------------------------------------------------------


def test_a_flood_of_idle_connections_neither_blocks_peers_nor_grows_the_server(
    job: Job,
) -> None:
    target = job.t[0][1]
    job_still_works(job)
    rss_before = rss_kib()
    for _ in range(3):
        flood = [socket.create_connection(target.listen_address, timeout=10)
                 for _ in range(300)]
        try:
            time.sleep(0.3)
            # at most HP_MAX_PENDING strangers are held; a new peer still gets in
            assert target.server_stats()["open"] <= hp.HP_MAX_PENDING + 2
            fresh = job.t[0][0].create_context()
            try:
                fresh.put(1, 0, 128, memoryview(b"through the flood"))
                fresh.quiet()
            finally:
                fresh.close()
        finally:
            for s in flood:
                s.close()
    assert bytes(job.mem(1)[128:145]) == b"through the flood"
    assert target.server_stats()["refused"] >= 3 * (300 - hp.HP_MAX_PENDING)
    assert rss_kib() - rss_before < 16 * 1024, "the server grew by more than 16 MiB"
    job_still_works(job)
