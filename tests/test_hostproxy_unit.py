"""Unit tests of the hostproxy transport, in one process over real loopback sockets.

Two (or four) transports are opened by hand as the PEs of a small job, each registering
memfd-backed segments, and exchange their address/rkey blobs through :class:`PeerInfo` as the
core would. No mocks: every request crosses a TCP connection to a native server thread.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from vkshmem.core.auth import derive_key
from vkshmem.core.errors import ConfigError, TransportError
from vkshmem.core.transports.contract import AmoOp, PeerInfo

hostproxy = pytest.importorskip("vkshmem_hostproxy")
from vkshmem_hostproxy import HostProxyTransport  # noqa: E402
from vkshmem_hostproxy._client import hp_mac  # noqa: E402
from vkshmem_hostproxy._server import lib as hp  # noqa: E402

from vkshmem.testing import transport as contract  # noqa: E402
from vkshmem.testing.transport import context, fd_count, thread_count  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SEG_SIZES = {0: 1 << 20, 1: 64 * 1024}
REQ = struct.Struct("<BBBxIQQQ")
REP = struct.Struct("<iIQ")


class Job(contract.Job[HostProxyTransport]):
    """``n`` PEs of one node, each with one hostproxy transport per rail."""

    transport = HostProxyTransport
    default_options = {"addr": "127.0.0.1"}
    seg_sizes = SEG_SIZES


@pytest.fixture
def job() -> Iterator[Job]:
    with Job() as j:
        yield j


# -- discovery -----------------------------------------------------------------------------


def test_spec_is_registered_through_the_entry_point() -> None:
    _, spec = contract.registered_host_transport("hostproxy", "vkshmem-hostproxy")
    assert spec.factory is HostProxyTransport
    assert spec.priority == 10


# -- RMA -----------------------------------------------------------------------------------


def test_put_get_random(job: Job) -> None:
    contract.put_get_random(job, rounds=300, nbi_gets=False)


def test_put_source_reusable_and_get_sees_earlier_put_without_quiet(job: Job) -> None:
    tr = job.t[0][0]
    buf = bytearray(b"A" * 4096)
    tr.put(1, 0, 100, memoryview(buf))
    buf[:] = b"B" * 4096  # reusing the source must not change what was put
    out = bytearray(4096)
    tr.get(1, 0, 100, memoryview(out))  # same ordered stream: sees the put
    assert out == b"A" * 4096


def test_put_and_get_typed_memoryviews(job: Job) -> None:
    contract.put_and_get_typed_memoryviews(job)


def test_large_transfers(job: Job) -> None:
    contract.large_transfers(job)


def test_concurrent_large_transfers_between_three_pes() -> None:
    """Transfers far larger than socket buffers, from every PE to every PE at once."""
    with Job(n=3, sizes={0: 48 << 20}) as j:
        contract.concurrent_transfers_between_three_pes(j)
        assert all(tr.server_stats()["errors"] == 0 for tr in j.t[0])


def test_quiet_after_many_put_nbi(job: Job) -> None:
    contract.quiet_after_many_put_nbi(job, 20_000)  # the FLUSH alone proves completion
    assert job.t[0][1].server_stats()["errors"] == 0


def test_quiet_with_nothing_outstanding(job: Job) -> None:
    contract.quiet_and_fence_with_nothing_outstanding(job)


# -- AMOs ----------------------------------------------------------------------------------


@contract.WIDTHS
@contract.ALL_OPS
def test_amo_fetching(job: Job, op: AmoOp, width: int) -> None:
    # to itself (applied in place); a SET returns nothing
    contract.amo_fetching(job, op, width, rounds=20, set_fetches=False)


@contract.WIDTHS
@contract.NON_FETCHING_OPS
def test_amo_non_fetching(job: Job, op: AmoOp, width: int) -> None:
    contract.amo_non_fetching(job, op, width, cases=50, from_pes=(0,))


@contract.WIDTHS
def test_compare_swap_success_and_failure(job: Job, width: int) -> None:
    contract.compare_swap_success_and_failure(job, width)


def test_amo_operands_are_masked_to_the_width(job: Job) -> None:
    contract.amo_operands_are_masked_to_the_width(job)


def test_concurrent_fetch_add_from_threads_and_lazy_connect(job: Job) -> None:
    contract.concurrent_fetch_add_from_threads(job, threads=8, per_thread=500)
    assert job.t[0][1].server_stats()["accepted"] == 1  # one connection despite the race


def test_two_rails_coexist_and_amos_are_atomic_across_them() -> None:
    with Job(n=2, rails=2) as j:
        contract.amos_are_atomic_across_two_rails(j, per_thread=1000)
        assert j.t[0][1].listen_address != j.t[1][1].listen_address


# -- bad requests --------------------------------------------------------------------------


def test_client_rejects_out_of_bounds_before_sending(job: Job) -> None:
    contract.range_errors_are_caught_before_sending(job)


def raw_connect(tr: HostProxyTransport, hello: bool = True,
                secret: bytes = contract.SECRET) -> socket.socket:
    """A raw connection to ``tr``'s server (PE 1), authenticated as PE 0 when ``hello``."""
    sock = socket.create_connection(tr.listen_address, timeout=10)
    if hello:
        key = derive_key(secret, "hostproxy")
        nc = bytes(range(16))
        sock.sendall(REQ.pack(hp.HP_OP_HELLO, 0, 0, 0, hp.HP_MAGIC, hp.HP_VERSION, 0) + nc)
        status, _, value = REP.unpack(recv_exact(sock, REP.size))
        assert (status, value) == (0, 1)
        challenge = recv_exact(sock, hp.HP_NONCE + hp.HP_MAC)
        ns = challenge[:hp.HP_NONCE]
        sock.sendall(REQ.pack(hp.HP_OP_AUTH, 0, 0, 0, 0, 0, 0)
                     + hp_mac(key, b"vkshmem hostproxy client v2", nc, ns, 0, 1))
        status, op, _ = REP.unpack(recv_exact(sock, REP.size))
        assert (status, op) == (0, hp.HP_OP_AUTH)
    return sock


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


BAD_REQUESTS = [
    ("put past the end", REQ.pack(hp.HP_OP_PUT, 0, 0, 0, SEG_SIZES[0] - 4, 8, 0) + b"X" * 8,
     hp.VK_ST_BOUNDS),
    ("put with wrapping offset", REQ.pack(hp.HP_OP_PUT, 0, 0, 0, 2**64 - 8, 16, 0) + b"X" * 16,
     hp.VK_ST_BOUNDS),
    ("put of a huge length", REQ.pack(hp.HP_OP_PUT, 0, 0, 0, 8, 2**64 - 1, 0) + b"X" * 64,
     hp.VK_ST_BOUNDS),
    ("put to an unknown segment", REQ.pack(hp.HP_OP_PUT, 0, 0, 9, 0, 8, 0) + b"X" * 8,
     hp.VK_ST_SEG),
    ("put to a huge segment id", REQ.pack(hp.HP_OP_PUT, 0, 0, 2**32 - 1, 0, 8, 0) + b"X" * 8,
     hp.VK_ST_SEG),
    ("get past the end", REQ.pack(hp.HP_OP_GET, 0, 0, 1, SEG_SIZES[1], 1, 0), hp.VK_ST_BOUNDS),
    ("amo past the end", REQ.pack(hp.HP_OP_AMO, AmoOp.SET, 8, 0, SEG_SIZES[0], 1, 0),
     hp.VK_ST_BOUNDS),
    ("misaligned amo", REQ.pack(hp.HP_OP_AMO_FETCH, AmoOp.ADD, 8, 0, 4, 1, 0), hp.VK_ST_ALIGN),
    ("amo of width 2", REQ.pack(hp.HP_OP_AMO, AmoOp.SET, 2, 0, 0, 1, 0), hp.VK_ST_AMO),
    ("unknown amo op", REQ.pack(hp.HP_OP_AMO, 99, 8, 0, 0, 1, 0), hp.VK_ST_AMO),
    ("unknown op", REQ.pack(200, 0, 0, 0, 0, 0, 0), hp.VK_ST_PROTO),
]


@pytest.mark.parametrize("what,request_bytes,status", BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_server_rejects_bad_requests_without_touching_memory(
    job: Job, what: str, request_bytes: bytes, status: int,
) -> None:
    target = job.t[0][1]
    for seg in job.segs[1].values():
        seg.map[:] = b"\xa5" * len(seg.map)
    errors_before = target.server_stats()["errors"]
    with contextlib.closing(raw_connect(target)) as sock:
        sock.sendall(request_bytes)
        reply = recv_exact(sock, REP.size)
        assert REP.unpack(reply)[0] == status
        assert recv_exact(sock, 1) == b""  # and the connection is dropped
    for seg in job.segs[1].values():
        assert seg.map[:] == b"\xa5" * len(seg.map)
    stats = target.server_stats()
    assert stats["errors"] == errors_before + 1
    assert "rejected a request from PE 0" in stats["last_error"]
    # the server still serves well-behaved peers
    job.t[0][0].put(1, 0, 0, memoryview(b"fine"))
    job.t[0][0].quiet()
    assert job.mem(1)[:4] == b"fine"


def test_server_rejects_requests_before_hello_and_bad_hello(job: Job) -> None:
    target = job.t[0][1]
    with contextlib.closing(raw_connect(target, hello=False)) as sock:
        sock.sendall(REQ.pack(hp.HP_OP_GET, 0, 0, 0, 0, 8, 0))
        assert REP.unpack(recv_exact(sock, REP.size))[0] == hp.VK_ST_AUTH
    with contextlib.closing(raw_connect(target, hello=False)) as sock:
        sock.sendall(REQ.pack(hp.HP_OP_HELLO, 0, 0, 0, 12345, hp.HP_VERSION, 0))
        assert REP.unpack(recv_exact(sock, REP.size))[0] == hp.VK_ST_HELLO
    # Strangers are counted, not recorded as errors of the job. The server counts a stranger
    # when it drops the connection, after the reply the client has read: poll for it.
    deadline = time.monotonic() + 10
    while (stats := target.server_stats())["refused"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (stats["errors"], stats["refused"]) == (0, 2)


def test_rejected_put_is_reported_at_the_next_quiet(job: Job) -> None:
    # A client that believes PE 1's segment is larger than it is (a corrupted rkey).
    real = SEG_SIZES[1]
    tr = HostProxyTransport(context(0, 2, options={"addr": "127.0.0.1"}))
    try:
        liar = PeerInfo(1, "node0", True, job.t[0][1].address(),
                        {1: struct.pack("<IQ", 1, 2 * real)})
        tr.connect({1: liar})
        job.mem(1, 1)[:] = b"\x00" * real
        tr.put(1, 1, real - 2, memoryview(b"overflow"))  # the server must refuse it
        with pytest.raises(TransportError, match=r"PE 1 at 127\.0\.0\.1:\d+.*outside the "
                                                 r"registered segment"):
            tr.quiet()
        assert job.mem(1, 1)[:] == b"\x00" * real
        with pytest.raises(TransportError, match="PE 1"):  # the connection stays broken
            tr.get(1, 1, 0, memoryview(bytearray(8)))
    finally:
        tr.close()


# -- failures and lifetime -----------------------------------------------------------------


def test_dead_peer_raises_naming_it(job: Job) -> None:
    tr = job.t[0][0]
    tr.get(1, 0, 0, memoryview(bytearray(8)))  # connection open
    host, port = job.t[0][1].listen_address
    job.t[0][1].close()
    old = signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # writing to the dead peer must not kill
    try:
        with pytest.raises(TransportError, match=rf"PE 1 at {host}:{port}") as info:
            for _ in range(100):  # the first puts may still fit in the socket buffer
                tr.put(1, 0, 0, memoryview(b"x" * 4096))
            tr.quiet()
    finally:
        signal.signal(signal.SIGPIPE, old)
    assert info.value.transport == "hostproxy"
    with pytest.raises(TransportError, match="PE 1"):
        tr.get(1, 0, 0, memoryview(bytearray(8)))


def test_unresponsive_peer_times_out() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts (in the kernel) but never answers
    tr = HostProxyTransport(context(0, 2, options={"addr": "127.0.0.1", "timeout": "0.3"}))
    try:
        port = listener.getsockname()[1]
        blob = json.dumps({"host": "127.0.0.1", "port": port}).encode()
        tr.connect({1: PeerInfo(1, "node0", True, blob, {0: struct.pack("<IQ", 0, 4096)})})
        start = time.monotonic()
        with pytest.raises(TransportError, match=r"no progress for 0\.3 s"):
            tr.get(1, 0, 0, memoryview(bytearray(8)))
        assert time.monotonic() - start < 5
    finally:
        tr.close()
        listener.close()


def test_unreachable_pe(job: Job) -> None:
    with pytest.raises(TransportError, match="PE 5 is not reachable"):
        job.t[0][0].put(5, 0, 0, memoryview(b"x"))


def test_close_twice_no_leaked_threads_or_fds() -> None:
    contract.close_twice_without_leaks(Job, exact_threads=True, quiet_after_close_raises=False)


def test_close_after_failed_peer_releases_everything() -> None:
    fds, threads = fd_count(), thread_count()
    j = Job(n=2)
    j.t[0][0].get(1, 0, 0, memoryview(bytearray(8)))
    j.t[0][1].close()
    with contextlib.suppress(TransportError):
        j.t[0][0].get(1, 0, 0, memoryview(bytearray(8)))
    j.close()
    assert (fd_count(), thread_count()) == (fds, threads)


# -- options -------------------------------------------------------------------------------


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"VKSHMEM_RAIL3.*unknown option"):
        HostProxyTransport(context(0, 1, rail=3, options={"bogus": "1"}))
    with pytest.raises(ConfigError, match="port="):
        HostProxyTransport(context(0, 1, options={"port": "70000"}))
    with pytest.raises(ConfigError, match="timeout="):
        HostProxyTransport(context(0, 1, options={"timeout": "-1"}))
    with pytest.raises(ConfigError, match="spin="):
        HostProxyTransport(context(0, 1, options={"spin": "x"}))


def test_fixed_port_and_wildcard_address() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    tr = HostProxyTransport(context(0, 1, options={"addr": "127.0.0.1", "port": str(port)}))
    try:
        assert json.loads(tr.address()) == {"host": "127.0.0.1", "port": port}
    finally:
        tr.close()
    tr = HostProxyTransport(context(0, 1, options={"addr": "0.0.0.0"}))
    try:  # a wildcard bind advertises the host address the core gave
        assert json.loads(tr.address())["host"] == "127.0.0.1"
    finally:
        tr.close()


def test_spin_option_serves_requests() -> None:
    with Job(options={"addr": "127.0.0.1", "spin": "50"}) as j:
        j.t[0][0].put(1, 0, 0, memoryview(b"spin"))
        assert j.t[0][0].amo(1, 0, 0, AmoOp.FETCH, 4, 0, 0, True) == int.from_bytes(
            b"spin", "little")


def test_only_host_memory_can_be_registered() -> None:
    tr = HostProxyTransport(context(0, 1, options={"addr": "127.0.0.1"}))
    contract.only_host_memory_can_be_registered(tr, hp.HP_MAX_SEGS)
