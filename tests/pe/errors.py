"""Bad arguments raise clear errors and corrupt nothing."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import InvalidArgumentError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
right = (me + 1) % n
buf = shmem.zeros(16, np.int64)
guard = shmem.full(16, 7, np.int64)  # right after buf: must never change
local = np.arange(16, dtype=np.int64)


def expect_error(fn, *args, match: str, **kw) -> None:
    try:
        fn(*args, **kw)
    except InvalidArgumentError as exc:
        check(match in str(exc), f"{fn.__name__}: {exc!s} lacks {match!r}")
    else:
        check(False, f"{fn.__name__}{args} did not raise")


expect_error(shmem.put, buf, local, n, match="does not exist")
expect_error(shmem.put, buf, local, -1, match="does not exist")
expect_error(shmem.get, local, buf, n + 5, match="does not exist")
expect_error(shmem.put, local, local, right, match="not in the symmetric heap")
expect_error(shmem.put, buf, local.astype(np.int32), right, match="dtype mismatch")
expect_error(shmem.put, buf, local, right, size=17, match="larger than")
expect_error(shmem.put, buf[::2], local[:8], right, match="not contiguous")
expect_error(shmem.atomic_add, buf, 1, right, match="one element")
expect_error(shmem.atomic_add, buf[:1], 1.5, right, match="not an integer")
expect_error(shmem.atomic_add, shmem.zeros(1, np.int16), 1, right, match="32/64-bit")
expect_error(shmem.atomic_fetch, np.zeros(1, np.int64), right, match="not in the symmetric")
expect_error(shmem.wait_until, buf[:1], "almost", 0, match="unknown comparison")
expect_error(shmem.free, local, match="not in the symmetric")
expect_error(shmem.iput, buf, local, right, tst=0, match="strides")
shmem.barrier_all()
check((guard == 7).all() and not buf.any(), "nothing was written by refused calls")
check(shmem.info_get_version() >= (1, 5), "version")
check(shmem.info_get_name().startswith("vkshmem"), "name")
check(shmem.pe_accessible(right) and not shmem.pe_accessible(n), "pe_accessible")
check(shmem.addr_accessible(buf, right) and not shmem.addr_accessible(local, right),
      "addr_accessible")
check(shmem.query_thread() == shmem.THREAD_MULTIPLE, "thread level")
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"errors ok: {n} PEs")
