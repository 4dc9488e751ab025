"""OpenSHMEM for Python, on vkshmem: ``from vkshmem import shmem``.

Names and signatures follow shmem4py, so a shmem4py program runs after changing its import.
Importing this module initialises the runtime (collective over the job), as shmem4py does;
set ``VKSHMEM_AUTO_INIT=0`` to call :func:`init` yourself. ``finalize`` runs at exit.

Collective calls (every PE must make them, in the same order): ``init``, ``init_thread``,
``finalize`` (OpenSHMEM 1.6: in matching pairs, the import's ``init`` included), every
allocation routine (``alloc``, ``free``, ``realloc``, ``new_array``, ``del_array``, ``array``,
``empty``, ``zeros``, ``ones``, ``full``), ``barrier_all``, ``sync_all``,
``new_signal``/``del_signal``, ``new_lock``/``del_lock``, ``Lock()`` and ``Lock.destroy``,
``Team.split_strided``/``split_2d`` (over the parent team) and ``Team.destroy`` (over the
team), and the collectives (``sync``, ``broadcast``, ``collect``, ``fcollect``, ``alltoall``,
``alltoalls``, ``reduce`` and the ``*_reduce`` forms, ``sum_inscan``, ``sum_exscan``) on
their team. Everything else, contexts and sessions included, is local to the calling PE.

``docs/conformance.md`` compares every name with shmem4py 1.0 and OpenSHMEM 1.6.
"""

from __future__ import annotations

import numpy as np  # noqa: F401  (shmem4py's module exposes ``np`` too)

from ._api import state as _state  # noqa: F401  (tools and tests read shmem._state.rt)
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
from ._api.collectives import alltoall, alltoalls, broadcast, collect, fcollect
from ._api.compat import ffi, lib
from ._api.ctx import CTX_DEFAULT, CTX_INVALID, Ctx, ctx_session_start, ctx_session_stop
from ._api.enums import AMO, CMP, CTX, CTX_SESSION, MALLOC, OP, THREAD
from ._api.interop import from_dlpack
from ._api.kernels import device_context, gpu_kernel, offset_of, pack_push
from ._api.lifecycle import (
    MAJOR_VERSION,
    MINOR_VERSION,
    VENDOR_STRING,
    finalize,
    global_exit,
    info_get_name,
    info_get_version,
    init,
    init_thread,
    my_pe,
    n_pes,
    pcontrol,
    pe_accessible,
    query_initialized,
    query_thread,
)
from ._api.lock import Lock, clear_lock, del_lock, new_lock, set_lock, test_lock
from ._api.ptr import addr_accessible, ptr
from ._api.reductions import (
    and_reduce,
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
from ._api.streams import gpu_stream
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
from .core.config import load as _load_config
from .core.domains.contract import DomainArray
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
    "CTX_SESSION",
    "CTX_SESSION_BATCH",
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
    "ctx_session_start",
    "ctx_session_stop",
    "del_array",
    "del_lock",
    "del_signal",
    "device_context",
    "empty",
    "fcollect",
    "fence",
    "ffi",
    "finalize",
    "free",
    "from_dlpack",
    "fromalloc",
    "full",
    "get",
    "get_nbi",
    "global_exit",
    "gpu_kernel",
    "gpu_stream",
    "ibget",
    "ibput",
    "iget",
    "info_get_name",
    "info_get_version",
    "init",
    "init_thread",
    "iput",
    "lib",
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
    "pcontrol",
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

THREAD_SINGLE, THREAD_FUNNELED = THREAD.SINGLE, THREAD.FUNNELED
THREAD_SERIALIZED, THREAD_MULTIPLE = THREAD.SERIALIZED, THREAD.MULTIPLE
CTX_PRIVATE, CTX_SERIALIZED, CTX_NOSTORE = CTX.PRIVATE, CTX.SERIALIZED, CTX.NOSTORE
CTX_SESSION_BATCH = CTX_SESSION.BATCH
MALLOC_ATOMICS_REMOTE, MALLOC_SIGNAL_REMOTE = MALLOC.ATOMICS_REMOTE, MALLOC.SIGNAL_REMOTE
AMO_SET, AMO_INC, AMO_ADD = AMO.SET, AMO.INC, AMO.ADD
AMO_AND, AMO_OR, AMO_XOR = AMO.AND, AMO.OR, AMO.XOR
OP_AND, OP_OR, OP_XOR, OP_MAX = OP.AND, OP.OR, OP.XOR, OP.MAX
OP_MIN, OP_SUM, OP_PROD = OP.MIN, OP.SUM, OP.PROD
CMP_EQ, CMP_NE, CMP_GT, CMP_LE, CMP_LT, CMP_GE = (CMP.EQ, CMP.NE, CMP.GT, CMP.LE, CMP.LT,
                                                  CMP.GE)




if _load_config().auto_init:
    init()
