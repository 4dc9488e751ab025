"""shmem4py 1.0 / OpenSHMEM 1.6 conformance, handle side (docs/conformance.md): Ctx and Team
handles before and after ``destroy`` (aliases included), ``CTX_INVALID``, a team's destroy
ending its contexts, errors where C returns -1 or nonzero, 1.6 sessions, ``pcontrol``, the
version and constants, and 1.6's init/finalize pairs.
"""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import InvalidArgumentError, shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
W, S, INV = shmem.TEAM_WORLD, shmem.TEAM_SHARED, shmem.TEAM_INVALID
D, CI = shmem.CTX_DEFAULT, shmem.CTX_INVALID
buf = shmem.zeros(4, np.int64)
src = np.arange(4, dtype=np.int64) + 10 * me


def raises(kinds: type | tuple[type, ...], fn, *args, match: str = "", **kw) -> None:
    """``fn(*args)`` raises one of ``kinds`` whose message contains ``match``."""
    try:
        fn(*args, **kw)
    except kinds as exc:
        check(match in str(exc), f"{getattr(fn, '__name__', fn)}: {exc!s} lacks {match!r}")
        return
    check(False, f"{getattr(fn, '__name__', fn)}{args} did not raise {kinds}")


def delivered(ctx: shmem.Ctx | None, team_right: int, world_left: int) -> None:
    """A put on ``ctx`` reaches the right neighbour once ``ctx`` is quiet."""
    shmem.barrier_all()
    shmem.put(buf, src, team_right, ctx=ctx)
    shmem.quiet(ctx)
    shmem.barrier_all()
    check((buf == np.arange(4) + 10 * world_left).all(), f"put on {ctx}: {buf}")
    shmem.barrier_all()


# -- CTX_INVALID and CTX_DEFAULT ----------------------------------------------------------------
check(shmem.Ctx() == CI and shmem.Ctx(None) == CI and not CI and D, "Ctx() is CTX_INVALID")
check(not (CI == 0) and D != 1, "handles do not equal numbers")
raises(TypeError, shmem.Ctx, 123)
for fn in (CI.fence, CI.quiet, CI.destroy, CI.session_stop):
    fn()  # no operation on CTX_INVALID (OpenSHMEM 1.6)
shmem.fence(CI)
shmem.quiet(CI)
raises(RuntimeError, CI.get_team, match="CTX_INVALID")
raises(InvalidArgumentError, shmem.put, buf, src, right, ctx=CI, match="CTX_INVALID")
D.destroy()
check(D and D == shmem.Ctx(D), "CTX_DEFAULT is never released")
alias = shmem.Ctx(D)
alias.destroy()
check(not alias and alias == CI and D, "destroying an alias of CTX_DEFAULT invalidates it only")
team = D.get_team()
check(team == W and team is not W, "get_team gives a new handle of the world")
team.destroy()
check(W and W.n_pes() == n and not team, "destroying that handle leaves the world alone")
delivered(D, right, left)

# -- a created context, destroyed through an alias --------------------------------------------
c = shmem.Ctx.create()
a2 = shmem.Ctx(c)
check(c and c != D and c == a2 and a2 is not c, "a created context and its alias")
delivered(a2, right, left)
a2.destroy()
check(not a2 and a2 == CI, "the destroyed handle is CTX_INVALID")
check(c and c != CI, "another alias keeps its stale handle (truthy, as in shmem4py)")
raises(InvalidArgumentError, shmem.put, buf, src, right, ctx=c, match="destroyed")
raises(InvalidArgumentError, c.get_team, match="destroyed")
c.destroy()
check(not c and c == CI, "destroying the stale alias makes it CTX_INVALID")
with shmem.Ctx.create(shmem.CTX_PRIVATE | shmem.CTX_NOSTORE) as c3:
    check(bool(c3) and c3.get_team() == W, "with Ctx.create()")
check(not c3 and c3 == CI, "leaving the with block destroys it")

# -- predefined and invalid teams -------------------------------------------------------------
check(shmem.Team() == INV and shmem.Team(None) == INV and not INV and W and S, "Team()")
raises(TypeError, shmem.Team, 123)
for t in (W, S, INV):
    t.destroy()  # the predefined handles are never released
check(W and S and not INV and W.n_pes() == n, "predefined teams survive destroy")
alias = shmem.Team(S)
alias.destroy()
check(not alias and alias == INV and S, "destroying an alias of TEAM_SHARED invalidates it only")
for fn in (INV.my_pe, INV.n_pes, INV.sync, INV.create_ctx, INV.split_strided,
           lambda: shmem.sync(INV), lambda: shmem.Ctx.create(0, INV),
           lambda: W.translate_pe(0, INV)):
    raises(RuntimeError, fn, match="TEAM_INVALID")
check(INV.get_config() == {"num_contexts": 0}, "TEAM_INVALID's config")
raises(RuntimeError, W.translate_pe, n, match="not a member")  # C returns -1
raises(RuntimeError, W.split_strided, n, match="size=0")  # selects no PE: C's nonzero
raises(RuntimeError, W.split_strided, 0, 1, n + 1)
raises(ValueError, W.split_strided, 0, 1, n, foo=1, match="num_contexts")

# team_ptr: ptr with team PE numbers (None where the peer's memory is not mapped here)
shmem.barrier_all()
view = shmem.team_ptr(W, buf, right)
check((view is None) == (shmem.ptr(buf, right) is None), "team_ptr agrees with ptr")
if view is not None:
    view[:] = 100 + me
shmem.barrier_all()
check(view is None or (buf == 100 + left).all(), f"a store through team_ptr: {buf}")
raises(RuntimeError, shmem.team_ptr, INV, buf, 0, match="TEAM_INVALID")
raises(ValueError, shmem.team_ptr, W, buf, n)

# -- a split team, contexts made from it, destroyed through an alias ---------------------------
t = W.split_strided(0, 1, n, config={"NUM_CONTEXTS": 2})
check(t and t != W and t.get_config() == {"num_contexts": 2}, "split with a config")
check(t.translate_pe() == me and t.translate_pe(right, W) == right, "translate_pe")
ctx = t.create_ctx()
ctx2 = shmem.Ctx.create(0, t)
check(ctx.get_team() == t and ctx.get_team() is not t, "the context's team")
delivered(ctx, right, left)
alias = shmem.Team(t)
alias.destroy()  # collective; destroys the contexts made from the team (1.6)
check(not alias and alias == INV, "the destroyed team handle is TEAM_INVALID")
check(t and t != INV, "another alias keeps its stale handle (truthy, as in shmem4py)")
raises(RuntimeError, t.n_pes, match="destroyed")
for cx in (ctx, ctx2):
    raises(InvalidArgumentError, shmem.put, buf, src, right, ctx=cx, match="destroyed")
t.destroy()  # the team is gone already: nothing is released twice
ctx.destroy()
ctx2.destroy()
check(not t and not ctx and not ctx2, "stale handles destroyed")
if n > 1:
    evens = W.split_strided(0, 2)
    if me % 2 == 0:
        check(evens.n_pes() == (n + 1) // 2 and evens.my_pe() == me // 2, "even team")
        raises(RuntimeError, W.translate_pe, 1, evens, match="not a member")
        evens.destroy()
    else:
        check(evens == INV and not evens, "non-members get TEAM_INVALID")

# -- OpenSHMEM 1.6 sessions: hints that change neither completion nor ordering -----------------
check(shmem.CTX_SESSION_BATCH == shmem.CTX_SESSION.BATCH == shmem.lib.SHMEM_CTX_SESSION_BATCH,
      "CTX_SESSION_BATCH")
created = shmem.Ctx.create()
many = shmem.zeros(64, np.int64)
for cx in (None, D, created):
    handle = D if cx is None else cx
    shmem.ctx_session_start(cx)
    check(handle.session == {"options": 0, "total_ops": 2**64 - 1}, f"defaults {handle.session}")
    shmem.ctx_session_start(cx, shmem.CTX_SESSION_BATCH, {"total_ops": 100})
    check(handle.session == {"options": shmem.CTX_SESSION.BATCH, "total_ops": 100}, "config")
    shmem.ctx_session_start(cx, 0, TOTAL_OPS=5)  # options are OR-ed, config values replaced
    check(handle.session == {"options": shmem.CTX_SESSION.BATCH, "total_ops": 5}, "again")
    shmem.barrier_all()
    for i in range(64):  # a batch of small puts: quiet still completes every one
        shmem.put(many[i:i + 1], np.array([i * n + me + 1]), right, ctx=cx)
    shmem.quiet(cx)
    shmem.ctx_session_stop(cx)
    shmem.ctx_session_stop(cx)  # stopped already: no effect
    check(handle.session is None, "session_stop")
    shmem.barrier_all()
    check((many == np.arange(64) * n + left + 1).all(), f"puts in a session: {many}")
    many[:] = 0
    shmem.barrier_all()
shmem.ctx_session_start(CI, shmem.CTX_SESSION_BATCH)  # no operation on CTX_INVALID
check(CI.session is None, "CTX_INVALID has no session")
raises(ValueError, shmem.ctx_session_start, D, 8, match="unknown session options")
raises(ValueError, shmem.ctx_session_start, D, 0, foo=1, match="total_ops")
raises(ValueError, shmem.ctx_session_start, D, 0, total_ops=-1)
raises(TypeError, shmem.ctx_session_start, D, 0, total_ops=1.5)
check(D.session is None, "a refused start changes nothing")
created.session_start(shmem.CTX_SESSION_BATCH)
stale = shmem.Ctx(created)
created.destroy()  # ends its session
raises(InvalidArgumentError, stale.session_start, 0, match="destroyed")

# -- profiling, version, constants, ffi and lib ------------------------------------------------
for level in (1, 2, 0, 2, 1, -1, 3):
    check(shmem.pcontrol(level) is None, "pcontrol")
raises(TypeError, shmem.pcontrol, "verbose")
check(shmem.info_get_version() == (1, 6) == (shmem.MAJOR_VERSION, shmem.MINOR_VERSION),
      "OpenSHMEM 1.6")
check(shmem.info_get_name() == shmem.VENDOR_STRING, "info_get_name")
lib = shmem.lib
check(lib.SHMEM_TEAM_NUM_CONTEXTS == 1 and lib.SHMEM_CMP_GE == shmem.CMP_GE
      and lib.SHMEM_THREAD_MULTIPLE == shmem.THREAD_MULTIPLE
      and lib.SHMEM_SIGNAL_ADD == shmem.SIGNAL_ADD and lib.SHMEM_MINOR_VERSION == 6, "lib")
check(shmem.Team(lib.SHMEM_TEAM_WORLD) == W and shmem.Ctx(lib.SHMEM_CTX_INVALID) == CI,
      "lib's predefined handles")
raises(AttributeError, getattr, lib, "shmem_put", match="no C OpenSHMEM library")
mem = shmem.alloc(16, align=128)
check(int(shmem.ffi.cast("uintptr_t", shmem.ffi.from_buffer(mem))) % 128 == 0, "ffi")
check(isinstance(shmem.ffi.cast("int", 0), shmem.ffi.CData), "ffi.CData")
shmem.free(mem)

# -- init/finalize in pairs (1.6); the import's init is matched at exit -----------------------
shmem.init()
shmem.init_thread(shmem.THREAD_SERIALIZED)
check(shmem.query_thread() == shmem.THREAD_SERIALIZED, "init_thread's level")
shmem.finalize()
check(shmem.query_initialized(), "a finalize that is not the last keeps the library")
x = shmem.zeros(1, np.int64)
shmem.atomic_add(x, 1 + me, right)
shmem.finalize()  # a barrier_all: the add is complete everywhere
check(shmem.query_initialized() and int(x[0]) == 1 + left, f"finalize as barrier: {x}")
print(f"routes: {sorted({r.name for r in shmem._state.rt.routing.routes})}")
print(f"conform_handles ok: {n} PEs")
