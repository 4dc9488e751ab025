"""OpenSHMEM for Python, on vkshmem: ``from vkshmem import shmem``.

Names and signatures follow shmem4py, so a shmem4py program runs after changing its import.
Importing this module initialises the runtime (collective over the job), as shmem4py does;
set ``VKSHMEM_AUTO_INIT=0`` to call :func:`init` yourself. ``finalize`` runs at exit.

Collective calls (every PE must make them, in the same order): ``init``, ``init_thread``,
``finalize``, every allocation routine (``alloc``, ``free``, ``realloc``, ``new_array``,
``del_array``, ``array``, ``empty``, ``zeros``, ``ones``, ``full``), ``barrier_all``, ``sync_all``,
``new_signal``/``del_signal``, ``new_lock``/``del_lock``, ``Lock()`` and ``Lock.destroy``,
and the collectives (``sync``, ``broadcast``, ``collect``, ``fcollect``, ``alltoall``,
``alltoalls``, ``reduce`` and the ``*_reduce`` forms, ``sum_inscan``, ``sum_exscan``) on
their team.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from . import __version__
from ._api import state as _state
from ._api.alloc import (
    alloc,
    array,
    del_array,
    empty,
    free,
    fromalloc,
    full,
    new_array,
    ones,
    realloc,
    zeros,
)
from ._api.amo import (
    atomic_add,
    atomic_and,
    atomic_compare_swap,
    atomic_fetch,
    atomic_fetch_add,
    atomic_fetch_and,
    atomic_fetch_inc,
    atomic_fetch_op,
    atomic_fetch_or,
    atomic_fetch_xor,
    atomic_inc,
    atomic_op,
    atomic_or,
    atomic_set,
    atomic_swap,
    atomic_xor,
)
from ._api.amo_nbi import (
    atomic_compare_swap_nbi,
    atomic_fetch_add_nbi,
    atomic_fetch_and_nbi,
    atomic_fetch_inc_nbi,
    atomic_fetch_nbi,
    atomic_fetch_op_nbi,
    atomic_fetch_or_nbi,
    atomic_fetch_xor_nbi,
    atomic_swap_nbi,
)
from ._api.args import heap_of
from ._api.collectives import (
    alltoall,
    alltoalls,
    and_reduce,
    broadcast,
    collect,
    fcollect,
    max_reduce,
    min_reduce,
    or_reduce,
    prod_reduce,
    reduce,
    sum_exscan,
    sum_inscan,
    sum_reduce,
    xor_reduce,
)
from ._api.ctx import CTX_DEFAULT, CTX_INVALID, Ctx
from ._api.enums import AMO, CMP, CTX, MALLOC, OP, THREAD
from ._api.lock import Lock, clear_lock, del_lock, new_lock, set_lock, test_lock
from ._api.query import query_initialized
from ._api.rma import get, get_nbi, iget, iput, put, put_nbi
from ._api.rma16 import ibget, ibput, pe_quiet
from ._api.signal import (
    SIGNAL,
    SIGNAL_ADD,
    SIGNAL_SET,
    del_signal,
    new_signal,
    put_signal,
    put_signal_nbi,
    signal_add,
    signal_fetch,
    signal_set,
    signal_wait_until,
)
from ._api.sync import (
    barrier_all,
    fence,
    quiet,
    sync_all,
    test,
    test_all,
    test_all_vector,
    test_any,
    test_any_vector,
    test_some,
    test_some_vector,
    wait_until,
    wait_until_all,
    wait_until_all_vector,
    wait_until_any,
    wait_until_any_vector,
    wait_until_some,
    wait_until_some_vector,
)
from ._api.team import TEAM_INVALID, TEAM_SHARED, TEAM_WORLD, Team, sync, team_ptr
from .core import runtime as _runtime
from .core.config import load as _load_config
from .core.domain import DomainArray
from .core.errors import InvalidArgumentError
from .gpu.api import gpu_kernel, offset_of, pack_push
from .gpu.array import DeviceArray

__all__ = [
    "AMO",
    "AMO_ADD",
    "AMO_AND",
    "AMO_INC",
    "AMO_OR",
    "AMO_SET",
    "AMO_XOR",
    "CMP",
    "CMP_EQ",
    "CMP_GE",
    "CMP_GT",
    "CMP_LE",
    "CMP_LT",
    "CMP_NE",
    "CTX",
    "CTX_DEFAULT",
    "CTX_INVALID",
    "CTX_NOSTORE",
    "CTX_PRIVATE",
    "CTX_SERIALIZED",
    "MAJOR_VERSION",
    "MALLOC",
    "MALLOC_ATOMICS_REMOTE",
    "MALLOC_SIGNAL_REMOTE",
    "MINOR_VERSION",
    "OP",
    "OP_AND",
    "OP_MAX",
    "OP_MIN",
    "OP_OR",
    "OP_PROD",
    "OP_SUM",
    "OP_XOR",
    "SIGNAL",
    "SIGNAL_ADD",
    "SIGNAL_SET",
    "TEAM_INVALID",
    "TEAM_SHARED",
    "TEAM_WORLD",
    "THREAD",
    "THREAD_FUNNELED",
    "THREAD_MULTIPLE",
    "THREAD_SERIALIZED",
    "THREAD_SINGLE",
    "VENDOR_STRING",
    "Ctx",
    "DeviceArray",
    "DomainArray",
    "Lock",
    "Team",
    "addr_accessible",
    "alloc",
    "alltoall",
    "alltoalls",
    "and_reduce",
    "array",
    "atomic_add",
    "atomic_and",
    "atomic_compare_swap",
    "atomic_compare_swap_nbi",
    "atomic_fetch",
    "atomic_fetch_add",
    "atomic_fetch_add_nbi",
    "atomic_fetch_and",
    "atomic_fetch_and_nbi",
    "atomic_fetch_inc",
    "atomic_fetch_inc_nbi",
    "atomic_fetch_nbi",
    "atomic_fetch_op",
    "atomic_fetch_op_nbi",
    "atomic_fetch_or",
    "atomic_fetch_or_nbi",
    "atomic_fetch_xor",
    "atomic_fetch_xor_nbi",
    "atomic_inc",
    "atomic_op",
    "atomic_or",
    "atomic_set",
    "atomic_swap",
    "atomic_swap_nbi",
    "atomic_xor",
    "barrier_all",
    "broadcast",
    "clear_lock",
    "collect",
    "del_array",
    "del_lock",
    "del_signal",
    "empty",
    "fcollect",
    "fence",
    "finalize",
    "free",
    "fromalloc",
    "full",
    "get",
    "get_nbi",
    "global_exit",
    "gpu_kernel",
    "ibget",
    "ibput",
    "iget",
    "info_get_name",
    "info_get_version",
    "init",
    "init_thread",
    "iput",
    "max_reduce",
    "min_reduce",
    "my_pe",
    "n_pes",
    "new_array",
    "new_lock",
    "new_signal",
    "offset_of",
    "ones",
    "or_reduce",
    "pack_push",
    "pe_accessible",
    "pe_quiet",
    "prod_reduce",
    "ptr",
    "put",
    "put_nbi",
    "put_signal",
    "put_signal_nbi",
    "query_initialized",
    "query_thread",
    "quiet",
    "realloc",
    "reduce",
    "set_lock",
    "signal_add",
    "signal_fetch",
    "signal_set",
    "signal_wait_until",
    "sum_exscan",
    "sum_inscan",
    "sum_reduce",
    "sync",
    "sync_all",
    "team_ptr",
    "test",
    "test_all",
    "test_all_vector",
    "test_any",
    "test_any_vector",
    "test_lock",
    "test_some",
    "test_some_vector",
    "wait_until",
    "wait_until_all",
    "wait_until_all_vector",
    "wait_until_any",
    "wait_until_any_vector",
    "wait_until_some",
    "wait_until_some_vector",
    "xor_reduce",
    "zeros",
]

MAJOR_VERSION: int = 1
MINOR_VERSION: int = 5
VENDOR_STRING: str = f"vkshmem {__version__}"

THREAD_SINGLE, THREAD_FUNNELED = THREAD.SINGLE, THREAD.FUNNELED
THREAD_SERIALIZED, THREAD_MULTIPLE = THREAD.SERIALIZED, THREAD.MULTIPLE
CTX_PRIVATE, CTX_SERIALIZED, CTX_NOSTORE = CTX.PRIVATE, CTX.SERIALIZED, CTX.NOSTORE
MALLOC_ATOMICS_REMOTE, MALLOC_SIGNAL_REMOTE = MALLOC.ATOMICS_REMOTE, MALLOC.SIGNAL_REMOTE
AMO_SET, AMO_INC, AMO_ADD = AMO.SET, AMO.INC, AMO.ADD
AMO_AND, AMO_OR, AMO_XOR = AMO.AND, AMO.OR, AMO.XOR
OP_AND, OP_OR, OP_XOR, OP_MAX = OP.AND, OP.OR, OP.XOR, OP.MAX
OP_MIN, OP_SUM, OP_PROD = OP.MIN, OP.SUM, OP.PROD
CMP_EQ, CMP_NE, CMP_GT, CMP_LE, CMP_LT, CMP_GE = (CMP.EQ, CMP.NE, CMP.GT, CMP.LE, CMP.LT,
                                                  CMP.GE)

_thread_level = THREAD.MULTIPLE


def info_get_version() -> tuple[int, int]:
    """The OpenSHMEM specification version implemented: ``(1, 5)``."""
    return (MAJOR_VERSION, MINOR_VERSION)


def info_get_name() -> str:
    """The implementation's name, e.g. ``'vkshmem 0.1.0'``."""
    return VENDOR_STRING


def init() -> None:
    """Collective: start the runtime (a no-op when it is already running)."""
    _state.rt = _runtime.start()


def init_thread(requested: THREAD = THREAD.MULTIPLE) -> THREAD:
    """Collective: ``init``, returning the thread level provided (every level is)."""
    global _thread_level
    init()
    _thread_level = THREAD(requested)
    return _thread_level


def query_thread() -> THREAD:
    """The thread level provided at initialisation."""
    return _thread_level


def finalize() -> None:
    """Collective: complete every operation, synchronise, and release all resources."""
    _state.rt = _state.NOT_INITIALISED
    _runtime.stop()


def global_exit(status: int = 0) -> NoReturn:
    """End every PE of the job with ``status`` (any PE may call it)."""
    rt = _runtime.current
    if rt is not None:
        rt.failed = True
        rt.bootstrap.abort(int(status))
    raise SystemExit(status)


def my_pe() -> int:
    """This PE's number."""
    return _state.rt.my_pe


def n_pes() -> int:
    """Number of PEs in the job."""
    return _state.rt.n_pes


def pe_accessible(pe: int) -> bool:
    """Whether ``pe`` exists and a route reaches it."""
    rt = _state.rt
    return isinstance(pe, (int, np.integer)) and 0 <= pe < rt.n_pes


def addr_accessible(addr: Any, pe: int) -> bool:
    """Whether ``addr`` is symmetric (usable as a remote address on ``pe``)."""
    if isinstance(addr, DomainArray):
        return pe_accessible(pe) and addr.domain in _state.rt.domain_heaps
    if not pe_accessible(pe) or not isinstance(addr, np.ndarray):
        return False
    try:
        _symmetric_offset(addr)
    except InvalidArgumentError:
        return False
    return True


def _symmetric_offset(a: np.ndarray) -> tuple[int, int]:
    from ._api.args import locate

    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    start = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    seg, off = locate(base, 0, "ptr target")
    return seg, off + start


def ptr(target: np.ndarray, pe: int) -> np.ndarray | None:
    """A numpy view of symmetric ``target`` on ``pe`` for direct loads and stores, or None
    when ``pe``'s memory is not mapped here (another node, or ``VKSHMEM_SHM=0``)."""
    from ._api.args import check_pe

    rt = _state.rt
    pe = check_pe(pe)
    if isinstance(target, DomainArray):  # a CPU view of a peer's device heap, if one exists
        heap = heap_of(target, "ptr target")
        mem = heap.direct[pe]
        view = heap.domain.host_view(mem) if mem is not None else None
        if view is None:
            return None
        return np.frombuffer(view, target.dtype, target.size, target.offset).reshape(
            target.shape)
    seg, off = _symmetric_offset(target)
    buf = rt.peer_buffer(pe, seg)
    if buf is None:
        return None
    view = np.ndarray(target.shape, target.dtype, buffer=buf, offset=off,
                      strides=target.strides)
    view.flags.writeable = target.flags.writeable
    return view


if _load_config().auto_init:
    init()
