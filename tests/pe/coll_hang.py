"""Mismatched collectives end with an error on every PE instead of a hang
(VKSHMEM_COLLECTIVE_TIMEOUT, with VKSHMEM_WAIT_TIMEOUT=0: waits otherwise unbounded).

COLL_HANG_CASE picks the mistake:

* ``broadcast``: PE 0 (the root) broadcasts 16 elements, the others 300,000 (pulled in
  chunks: they wait for chunks the root never announces);
* ``broadcast_root_large``: the root broadcasts 300,000 elements, the others 16 (the root
  waits for children that never read);
* ``sum_reduce``: PE 0 reduces 16 elements, the others 300,000 (ring, in chunks);
* ``barrier``: the last PE skips a ``barrier_all`` and goes on to a ``sum_reduce``.

Each PE then makes the program's next call, a ``barrier_all``. Every PE must raise
WaitTimeoutError naming VKSHMEM_COLLECTIVE_TIMEOUT (in the mismatched call, or in that
barrier when the mismatched call returned on it), within two timeouts. The PEs then meet
through the bootstrap (so that every PE has printed its error) and leave the error uncaught:
the job ends with exit status 1."""

from __future__ import annotations

import os
import time

import numpy as np
from _common import check

from vkshmem import WaitTimeoutError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
case = os.environ["COLL_HANG_CASE"]
timeout = float(os.environ["VKSHMEM_COLLECTIVE_TIMEOUT"])
check(float(os.environ.get("VKSHMEM_WAIT_TIMEOUT", "0")) == 0, "the wait timeout must be off")
BIG = 300_000
t = shmem.zeros(BIG, np.int64)
s = np.arange(BIG, dtype=np.int64) + me
last = n - 1


def mistake() -> None:
    if case == "broadcast":
        cnt = 16 if me == 0 else BIG
        shmem.broadcast(t[:cnt], s[:cnt], 0)
    elif case == "broadcast_root_large":
        cnt = BIG if me == 0 else 16
        shmem.broadcast(t[:cnt], s[:cnt], 0)
    elif case == "sum_reduce":
        cnt = 16 if me == 0 else BIG
        shmem.sum_reduce(t[:cnt], s[:cnt])
    elif case == "barrier":
        if me != last:
            shmem.barrier_all()
        shmem.sum_reduce(t[:16], s[:16])
    else:
        raise SystemExit(f"unknown COLL_HANG_CASE {case!r}")


shmem.barrier_all()
start = time.monotonic()
error: WaitTimeoutError | None = None
try:
    mistake()
    shmem.barrier_all()  # the program's next call
except WaitTimeoutError as exc:
    error = exc
took = time.monotonic() - start
check(n == 1 or error is not None, f"{case}: returned on PE {me} after {took:.1f} s")
if n == 1:
    check(error is None, f"{case} at 1 PE: {error}")
else:
    text = str(error)
    check("VKSHMEM_COLLECTIVE_TIMEOUT" in text and "waiting for" in text, text)
    check(any(w in text for w in ("broadcast", "reduce", "barrier")), text)
    # at most the mistaken call's timeout, then the next barrier's
    check(took < 2 * timeout + 10, f"{case}: the error came after {took:.1f} s")
    print(f"coll_hang error on PE {me}: {type(error).__name__}: {text}", flush=True)
print("routes: " + str(sorted({r.name for r in shmem._state.rt.routing.routes})), flush=True)
print(f"coll_hang ok: {case} on {n} PEs", flush=True)
if error is not None:
    shmem._state.rt.bootstrap.barrier()  # out of band: every PE has its error
    # left uncaught, as by a program that does not handle it: the PE ends with status 1 and
    # finalize skips its barriers (the team's signal counters are out of step)
    raise error
