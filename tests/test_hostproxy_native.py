"""The core's compiled hot path over hostproxy's C client (``HostProxyTransport.native_ops``):
real jobs under the launcher at 1, 2 and 4 PEs whose puts, gets, AMOs and quiets the client
counts as having come through C; and, in this process, the native path to a peer that never
answers or is gone raising the transport's own named errors, and Ctrl-C (a real signal whose
handler raises) ending a native wait at once."""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_fast import routed_through, shmem  # noqa: F401 - shmem: a fixture
from test_multipe import MODES, check_run, launch

from vkshmem.core.errors import TransportError
from vkshmem.core.transports.contract import PeerInfo

pytest.importorskip("vkshmem_hostproxy")
from vkshmem_hostproxy import HostProxyTransport

from vkshmem.testing.transport import context

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("npes", [1, 2, 4])
def test_native_path_under_the_launcher(npes: int) -> None:
    check_run(launch("hostproxy_native", npes, MODES["hostproxy"]), "hostproxy_native", npes,
              "hostproxy")


@contextlib.contextmanager
def silent_peer(timeout: str) -> Iterator[tuple[HostProxyTransport, socket.socket]]:
    """A hostproxy transport of PE 5 whose PE 0 is a listener that accepts (in the kernel) and
    never answers, its segment 0 as large as any heap offset."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    tr = HostProxyTransport(context(5, 6, options={"addr": "127.0.0.1", "timeout": timeout}))
    try:
        blob = json.dumps({"host": "127.0.0.1", "port": listener.getsockname()[1]}).encode()
        tr.connect({0: PeerInfo(0, "node0", True, blob, {0: struct.pack("<IQ", 0, 1 << 40)})})
        yield tr, listener
    finally:
        tr.close()
        listener.close()


def native_route(tr: HostProxyTransport) -> Any:
    """The fast paths sending this PE's (PE 5's) requests for PE 0 to ``tr``'s C client."""
    return routed_through(ctypes.c_char.from_address(tr.native_ops()), tr)


def test_native_path_raises_the_transports_errors(shmem: Any) -> None:  # noqa: F811
    a = shmem.zeros(4, np.int64)
    with silent_peer("0.3") as (tr, listener), native_route(tr):
        start = time.monotonic()
        with pytest.raises(TransportError, match=r"PE 0 at 127\.0\.0\.1:\d+ failed while "
                                                 r"saying hello: no progress for 0\.3 s"):
            shmem.get(a, a, 0)
        assert time.monotonic() - start < 5
        port = listener.getsockname()[1]
        listener.close()  # now nobody listens there
        with pytest.raises(TransportError, match=rf"cannot connect to PE 0 at 127\.0\.0\.1:"
                                                 rf"{port}: \[Errno 111\]"):
            shmem.put(a, a, 0)
        with pytest.raises(TransportError, match="cannot connect to PE 0"):
            shmem.atomic_fetch_add(a[1:2], 1, 0)
        stats = tr.client_stats()
    assert stats == {"native": 3, "python": 0, "opened": 1}


def test_ctrl_c_ends_a_native_wait(shmem: Any) -> None:  # noqa: F811
    """A get waiting (without the GIL, in C) for a peer that never answers: a SIGALRM whose
    handler raises KeyboardInterrupt ends it well before the 60 s timeout."""
    a = shmem.zeros(1, np.int64)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        with silent_peer("60") as (tr, _), native_route(tr):
            start = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(KeyboardInterrupt):
                shmem.get(a, a, 0)
            assert time.monotonic() - start < 5
            assert tr.client_stats()["native"] == 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
