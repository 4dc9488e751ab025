"""The per-call hot path: the CPython extension :mod:`vkshmem.core._fast` and its set-up.

Each public function it serves (``put``/``get`` and their ``_nbi`` forms, ``iput``/``iget``,
the AMOs, the signals, ``quiet``/``fence``, ``wait_until``/``test``,
``barrier_all``/``sync_all``/``sync``, ``broadcast``, ``reduce`` of every size,
``fcollect``/``collect``, ``alltoall``/``alltoalls``, ``sum_inscan``/``sum_exscan``,
``set_lock``/``test_lock``/``clear_lock``) is an :func:`entry`: a callable that, for plain
numpy arrays on the shm route with the default context and team, checks its arguments and
does the work in one call into C (buffer protocol, PE/bounds/route checks, the copy or
atomic, native waits), and otherwise runs the Python implementation it wraps, unchanged:
other array types (memoryviews, subclasses, a domain's arrays), contexts, transport routes,
and every error, whose messages therefore stay those of the Python code. The entry shows the
Python function's name, docstring and signature (``__wrapped__``).

The extension reads the peer table of :mod:`vkshmem.core._native` (:func:`bind` at import);
the runtime :func:`configure` s it at start-up (which PEs the shm path reaches, whether
``quiet`` is only a fence, whether waits may stay native, its list of open memory domains),
gives it TEAM_WORLD's
:class:`NativeTeam` (:func:`set_world`), and :func:`reset` s it at finalize, after which every
entry takes its Python path (which reports that vkshmem is not initialised).
"""

from __future__ import annotations

import array
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from . import _fast
from ._native import lib

if TYPE_CHECKING:
    from .runtime import Runtime
    from .teams import TeamState

__all__ = ["NativeTeam", "configure", "entry", "native_team", "reset", "set_world"]

F = TypeVar("F", bound=Callable[..., Any])
NativeTeam = _fast.NativeTeam
#: index of the phase in a NativeTeam's counters (after one expected count per flag)
PHASE: int = _fast.PHASE
#: length of a team's counters (expected counts, phase, barrier epoch)
N_COUNTERS: int = _fast.N_COUNTERS



def _probes() -> tuple[np.ndarray, ...]:
    """Arrays of each layout the fast paths tell apart (contiguous or not, writable or not):
    the extension reads plain arrays' fields directly only if it reads all of these right."""
    grid = np.arange(12, dtype=np.int64).reshape(3, 4)
    frozen = np.zeros(5, np.float32)
    frozen.flags.writeable = False
    return grid, grid[:, ::2], grid.T, frozen


#: whether plain arrays are read directly (else every array goes through the buffer protocol)
DIRECT_ARRAYS: bool = _fast.bind(int(lib.vk_table_address()), np.ndarray, _probes())


def entry(kind: str, fallback: F, *, op: int = -1, fetch: bool = False,
          ints_only: bool = False, opmap: Mapping[Any, Any] | None = None) -> F:
    """``fallback`` with the fast path of ``kind`` in front of it. ``kind``: ``'put'``,
    ``'get'``, ``'amo'`` (``op``: the AmoOp; ``fetch``: returns the prior value;
    ``ints_only``; or ``opmap``: op argument -> ``op | inc << 4 | ints_only << 5``),
    ``'quiet'``, ``'wait_until'``/``'test'`` (``opmap``: comparison -> CMP code),
    ``'barrier_all'`` (``op=1``; ``op=0``: sync_all), ``'sync'``, ``'broadcast'``,
    ``'reduce'`` (``op``: the reduction code, or ``opmap``), ``'fcollect'``, ``'collect'``,
    ``'alltoall'`` (alltoall and alltoalls), ``'scan'`` (``op``: 1
    inclusive, 0 exclusive), ``'iput'``, ``'iget'``, ``'set_lock'``/``'test_lock'``/
    ``'clear_lock'`` (``opmap``: ``{"held": lock._held, "wait": lock._wait_ticket}``).
    Arguments are matched to roles by the fallback's parameter names (target/ivar, source,
    pe, size, ctx, value, cond, fetch, op, cmp, root, team, signal, sigop, tst, sst, lock)."""
    return cast(F, _fast.entry(kind, fallback, op, fetch, ints_only,
                               None if opmap is None else dict(opmap)))


def configure(rt: Runtime) -> None:
    """Enable the fast paths for runtime ``rt`` (after its routes and waiter exist, before
    its teams: their NativeTeams belong to this configuration). A PE routed through a
    transport that offers its data path in C (``Transport.native_ops``) is served by it,
    unless large transfers to it are striped over several rails; ``quiet``/``fence`` (and
    barrier_all's quiet) stay in C when every open transport offers them there."""
    routing = rt.routing
    routes, shm, transports = routing.route_transport, routing.shm, routing.transports
    ops = array.array("Q", (0 if t is shm or routing.stripes[pe] is not None else t.native_ops()
                            for pe, t in enumerate(routes)))
    # quiet/fence in C when every open transport offers them (as Runtime.quiet/fence do)
    several = len(routing.rails) > 1
    quiet_ops = array.array("Q", (t.native_ops() for t in transports))
    fence_quiet = bytes(several or not t.spec.native_fence for t in transports)
    # the wake board (a long wait sleeps until a transport's progress pokes it): only where
    # every byte arriving here comes through the open transports (no peer on the shm path;
    # the C side also needs every one of them to offer watch)
    shm_peers = any(t is shm for pe, t in enumerate(routes) if pe != rt.my_pe)
    watch_ops = b"" if shm_peers or not transports else quiet_ops.tobytes()
    _fast.configure(my_pe=rt.my_pe, direct=bytes(t is shm for t in routes),
                    ops=ops.tobytes(), transports=tuple(routes), quiet_fence=not transports,
                    native_waits=not rt.waiter.progress,
                    crowded=len(rt.node_pes) > (os.cpu_count() or 1), waiter=rt.waiter,
                    seg_heaps=rt.domains.seg_heaps, failed=rt.waiter.failed_address,
                    quiet_ops=quiet_ops.tobytes(), fence_quiet=fence_quiet,
                    quiet_transports=tuple(transports), watch_ops=watch_ops)


def watch_stats() -> dict[str, int]:
    """The wake board's counters: ``transports`` it watches (0: long waits poll every 50 us),
    ``arms`` (waits that stopped spinning and armed it), ``sleeps`` (futex sleeps) and
    ``woken`` (sleeps a transport's poke ended). For tests and benchmarks."""
    return cast(dict[str, int], _fast.watch_stats())


def set_world(rt: Runtime) -> None:
    """Give the fast paths TEAM_WORLD's native team (barrier_all stays native while quiet is a
    fence and ``rt.domains.seg_heaps`` holds no open memory domain: those check their errors at each
    barrier)."""
    _fast.set_world(rt.world.native)


def reset() -> None:
    """Disable every fast path (finalize): entries take their Python path again."""
    _fast.reset()


def native_team(ts: TeamState, half: int, rd_fast: int) -> Any:
    """A NativeTeam for team ``ts`` when every member takes the shm path or a transport that
    offers its data path in C (``Transport.native_ops``: the barrier's remote adds go through
    it; the collectives run in C only among mapped members) and waits need no transport
    progress (else None). ``half``/``rd_fast``: the collectives' scratch layout."""
    rt = ts.rt
    if ts.me < 0 or rt.waiter.progress or not _fast.enabled():
        return None
    shm = rt.routing.shm
    ops = array.array("Q", (0 if t is shm else t.native_ops() for t in ts.routes))
    if any(not op and t is not shm for op, t in zip(ops, ts.routes, strict=True)):
        return None
    return NativeTeam(ts.pes, ts.me, ts.slot, ts.base, rt.internal.address, ts.scratch_offset,
                      half, rd_fast, ops.tobytes() if any(ops) else b"",
                      rt.waiter.for_collectives(rt.config.collective_timeout))
