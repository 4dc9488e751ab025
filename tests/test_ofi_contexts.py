"""Contexts of the ofi transport (rail option ``contexts``): by default a context counts its
operations on the transport's own endpoint and CQ, so creating one opens nothing and its first
operation needs no new connection; ``contexts=own`` gives each its own endpoint and CQ. Either
way a context's quiet and fence wait only for its own operations. In one process over real
libfabric, as tests/test_ofi_unit.py."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import pytest

from vkshmem.core.errors import ConfigError
from vkshmem.core.transports.contract import AmoOp

pytest.importorskip("vkshmem_ofi")
from test_ofi_unit import PROVIDERS, Job, context, word
from vkshmem_ofi._ofi import lib as vko
from vkshmem_ofi._transport import OfiTransport

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=[(p, c) for p in PROVIDERS for c in ("shared", "own")],
                ids=lambda pc: f"{pc[0]}-{pc[1]}")
def job(request: pytest.FixtureRequest) -> Iterator[Job]:
    prov, contexts = request.param
    with Job(options={"provider": PROVIDERS[prov], "contexts": contexts}) as j:
        yield j


def test_contexts_count_their_own_operations(job: Job) -> None:
    tr = job.t[0][0]
    ctxs = [tr.create_context() for _ in range(4)]
    try:
        for k, ctx in enumerate(ctxs):
            for i in range(50):
                ctx.put_nbi(1, 0, 8 * (50 * k + i), memoryview(struct.pack("<Q", k * 1000 + i)))
        for k, ctx in enumerate(ctxs):
            ctx.quiet()
            assert all(word(job.mem(1), 8 * (50 * k + i), 8) == k * 1000 + i for i in range(50))
        # a context's quiet waits for its own operations only: the transport's are its own
        first = ctxs[0]
        before = first.amo(1, 0, 8 * 400, AmoOp.FETCH, 8, 0, 0, True)
        for ctx in ctxs:
            ctx.amo(1, 0, 8 * 400, AmoOp.ADD, 8, 1, 0, False)
            ctx.fence()
        for ctx in ctxs:
            ctx.quiet()
        assert first.amo(1, 0, 8 * 400, AmoOp.FETCH, 8, 0, 0, True) == before + 4
    finally:
        for ctx in ctxs:
            ctx.close()
    tr.put(1, 0, 0, memoryview(b"after ok"))  # the transport outlives its contexts
    tr.quiet()
    again = tr.create_context()  # a parked one
    assert again.amo(1, 0, 8 * 400, AmoOp.FETCH, 8, 0, 0, True) == before + 4
    again.close()


def test_shared_contexts_open_nothing() -> None:
    with Job(options={"provider": PROVIDERS["tcp"]}) as j:
        tr = j.t[0][0]
        tr.amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, False)
        tr.quiet()
        t0 = time.perf_counter()
        ctxs = [tr.create_context() for _ in range(32)]
        made = time.perf_counter() - t0
        t0 = time.perf_counter()
        for ctx in ctxs:
            ctx.amo(1, 0, 0, AmoOp.ADD, 8, 1, 0, True)
        first = time.perf_counter() - t0
        assert made < 0.1 and first < 1.0, (made, first)  # own endpoints: seconds each
        assert word(j.mem(1), 0, 8) == 33
        for ctx in ctxs:
            assert vko.vko_native_ops(ctx._e) != vko.vko_native_ops(tr._e)
            ctx.close()


def test_the_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="contexts="):
        OfiTransport(context(0, 1, options={"provider": PROVIDERS["tcp"], "contexts": "some"}))
