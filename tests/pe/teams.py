"""Teams (world, shared, strided and 2-D splits, translate, sync, destroy, slot reuse) and
contexts (team-relative PEs, per-context quiet, CTX_DEFAULT/CTX_INVALID)."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import InvalidArgumentError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
W, S, INVALID = shmem.TEAM_WORLD, shmem.TEAM_SHARED, shmem.TEAM_INVALID
check(W.my_pe() == me and W.n_pes() == n, "world team")
# one node: TEAM_SHARED is every PE on the shm path, only this PE without it (the PEs ptr
# reaches)
if shmem._state.rt.config.shm:
    check(S.n_pes() == n and S.my_pe() == me, "shared team (one node)")
else:
    check(S.n_pes() == 1 and S.my_pe() == 0, "shared team without the shm path")
check(shmem.Team(W) == W and W != S and not INVALID and W and hash(shmem.Team(W)) == hash(W),
      "aliases and equality")
check(W.get_config() == {"num_contexts": 0}, "get_config")

# strided split: the odd PEs (none at 1 PE: an empty selection raises on every PE)
try:
    odd = W.split_strided(1, 2)
except InvalidArgumentError as exc:
    check(n == 1 and "size=0" in str(exc), str(exc))
    odd = INVALID
if me % 2:
    check(odd.n_pes() == n // 2 and odd.my_pe() == me // 2, "odd team shape")
    check(odd.translate_pe() == me and odd.translate_pe(0) == 1, "translate to world")
    check(W.translate_pe(me, odd) == me // 2, "from world")
    try:  # OpenSHMEM's -1 (not a member) is an error, as in shmem4py
        W.translate_pe(0, odd)
    except InvalidArgumentError as exc:
        check("not a member" in str(exc), str(exc))
    else:
        check(False, "translate_pe of a non-member must raise")
    odd.sync()
else:
    check(odd == INVALID and not odd, "non-members get TEAM_INVALID")

# 2-D split
x, y = W.split_2d(2)
check(x.n_pes() == min(2, n - (me // 2) * 2) and x.my_pe() == me % 2, "row team")
check(y.n_pes() == len(range(me % 2, n, 2)) and y.my_pe() == me // 2, "column team")
for _ in range(10):
    x.sync()
    y.sync()

# a context on the row team: team-relative PE numbers, its own quiet
buf = shmem.zeros(8, np.int64)
with x.create_ctx() as ctx:
    check(ctx.get_team() == x, "ctx team")
    right = (x.my_pe() + 1) % x.n_pes()
    shmem.put(buf, np.full(8, me, np.int64), right, ctx=ctx)
    shmem.atomic_add(buf[:1], 100, right, ctx=ctx)
    ctx.quiet()
    x.sync()
    sender = x.translate_pe((x.my_pe() - 1) % x.n_pes(), W)
    check(int(buf[0]) == sender + 100 and (buf[1:] == sender).all(), f"ctx put {buf}")
    try:
        shmem.put(buf, buf, x.n_pes(), ctx=ctx)
    except InvalidArgumentError as exc:
        check("context's team" in str(exc), str(exc))
    else:
        check(False, "a PE outside the context's team must be refused")
check(not ctx, "destroyed context is invalid")
shmem.barrier_all()

# world contexts, default and invalid
c1 = shmem.Ctx.create(shmem.CTX_PRIVATE)
c2 = shmem.Ctx.create()
right = (me + 1) % n
shmem.put_nbi(buf, np.arange(8, dtype=np.int64) * me, right, ctx=c1)
shmem.quiet(c1)  # contexts are not ordered with each other: complete c1's put first
shmem.atomic_inc(buf[:1], right, ctx=c2)
c2.quiet()
shmem.quiet(shmem.CTX_DEFAULT)
shmem.fence(c1)
shmem.barrier_all()
left = (me - 1) % n
check(int(buf[0]) == 1 and (buf[1:] == np.arange(1, 8) * left).all(), f"contexts {buf}")
c1.destroy()
c2.destroy()
try:
    shmem.put(buf, buf, right, ctx=shmem.CTX_INVALID)
except InvalidArgumentError:
    pass
else:
    check(False, "CTX_INVALID must be refused")
check(shmem.Ctx(shmem.CTX_DEFAULT) == shmem.CTX_DEFAULT, "ctx alias")

# destroy frees slots: many create/destroy cycles never run out
for x_, y_ in [(x, y)]:
    x_.destroy()
    y_.destroy()
if odd:
    odd.destroy()
for _ in range(100):
    t = W.split_strided(0, 1)
    with t:
        check(t.n_pes() == n, "split of everything")
        t.sync()
shmem.barrier_all()
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"teams ok: {n} PEs")
