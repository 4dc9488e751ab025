"""A DeviceArray outlives its runtime: after finalize and a new init, using it must raise (it
named memory of the released GPU heap), never write into whatever the new heap put there."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.errors import InvalidArgumentError

old = shmem.zeros(4, np.int64, domain="gpu")
shmem.finalize()
shmem.init()
new = shmem.zeros(4, np.int64, domain="gpu")
check(new.offset == old.offset, "the new heap reuses the offset (what makes this dangerous)")
for what, bad in (("put", lambda: shmem.put(old, np.arange(4), shmem.my_pe())),
                  ("get", lambda: shmem.get(np.zeros(4, np.int64), old, shmem.my_pe())),
                  ("amo", lambda: shmem.atomic_add(old[:1], 1, shmem.my_pe())),
                  ("free", lambda: shmem.free(old))):
    try:
        bad()
        check(False, f"{what} on a stale DeviceArray must raise")
    except InvalidArgumentError as exc:
        check("released" in str(exc), f"{what}: unclear error {exc}")
check(not new.to_numpy().any(), "the new array was not written")
try:
    new.reshape(2, 2).view(np.int8)[:, :3]
    shmem.zeros((2, 3), np.int16, domain="gpu").view(np.int32)
    check(False, "a view that does not divide the last axis must raise")
except InvalidArgumentError:
    pass
print("gpu_stale ok", flush=True)
