"""Run by ``vkshmem doctor`` on every PE of a small job: one loop-back check of this machine.

``python _doctor_pe.py host`` moves data through whatever route the job's environment chose
(the shm path, or the one transport ``VKSHMEM_TRANSPORTS`` names): a put, a get, a fetching
AMO, a barrier and a reduction, each checked, and the cost of an 8-byte put + quiet.
``python _doctor_pe.py DOMAIN`` does the same with an array of memory domain ``DOMAIN``
(exported by each PE and imported by its same-node peers when the domain can).

PE 0 prints one line ``doctor-result: {json}``. A part that is not present here (a driver, a
library) ends the PE with status 3 after a line ``doctor-unavailable: <why>``; a wrong result
raises, which the launcher reports.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from vkshmem.core.errors import FeatureNotAvailableError

UNAVAILABLE = 3
_N = 32


def _expect(cond: object, what: str) -> None:
    if not cond:
        raise AssertionError(f"doctor check failed: {what}")


def _host(shmem: Any) -> dict[str, Any]:
    me, n = shmem.my_pe(), shmem.n_pes()
    right, left = (me + 1) % n, (me - 1) % n
    a = shmem.zeros(_N + 2, np.int64)
    shmem.put(a[:_N], np.arange(_N, dtype=np.int64) + 1000 * me, right)
    shmem.barrier_all()
    _expect((a[:_N] == np.arange(_N) + 1000 * left).all(), "a put from the left PE arrived")
    got = np.empty(_N, np.int64)
    shmem.get(got, a[:_N], right)
    _expect((got == np.arange(_N) + 1000 * me).all(), "a get returns what this PE put there")
    shmem.atomic_fetch_add(a[_N:_N + 1], me + 1, right)
    shmem.barrier_all()
    _expect(a[_N] == left + 1, f"fetch_add from the left PE: {a[_N]} != {left + 1}")
    src = shmem.full(1, me + 1, np.int64)
    dst = shmem.zeros(1, np.int64)
    shmem.sum_reduce(dst, src)
    _expect(dst[0] == n * (n + 1) // 2, f"sum_reduce gave {dst[0]}")
    one = np.ones(1, np.int64)
    reps = 200
    shmem.barrier_all()
    t0 = time.perf_counter()
    for _ in range(reps):
        shmem.put(a[_N + 1:_N + 2], one, right)
        shmem.quiet()
    put_us = (time.perf_counter() - t0) / reps * 1e6
    shmem.barrier_all()
    return {"routes": sorted({r.name for r in shmem._state.rt.routing.routes}),
            "put_quiet_us": round(put_us, 2)}


def _domain(shmem: Any, name: str) -> dict[str, Any]:
    me, n = shmem.my_pe(), shmem.n_pes()
    right, left = (me + 1) % n, (me - 1) % n
    d = shmem.zeros(_N, np.int64, domain=name)
    shmem.put(d, np.arange(_N, dtype=np.int64) + 1000 * me, right)
    shmem.barrier_all()
    _expect((d.to_numpy() == np.arange(_N) + 1000 * left).all(),
            f"a host->{name} put from the left PE arrived")
    got = np.empty(_N, np.int64)
    shmem.get(got, d, right)
    _expect((got == np.arange(_N) + 1000 * me).all(), f"a {name}->host get")
    heap = shmem._state.rt.domains.domain(name)
    out: dict[str, Any] = {"routes": list(heap.route_names)}
    device = getattr(heap.domain, "device", None)
    for key, attr in (("device_name", "name"), ("device_type", "device_type")):
        value = getattr(getattr(device, "info", device), attr, None)
        if isinstance(value, str):
            out[key] = value
    out["validation"] = bool(getattr(device, "validation", False))
    check_errors = getattr(heap.domain, "check_errors", None)
    if check_errors is not None:
        check_errors()  # validation-layer errors, when the layer is on
    shmem.barrier_all()
    return out


def main(argv: list[str]) -> int:
    what = argv[1] if len(argv) > 1 else "host"
    try:
        from vkshmem import shmem

        result = _host(shmem) if what == "host" else _domain(shmem, what)
    except FeatureNotAvailableError as exc:
        print(f"doctor-unavailable: {exc}", flush=True)
        return UNAVAILABLE
    if shmem.my_pe() == 0:
        print("doctor-result: " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
