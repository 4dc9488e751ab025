"""Library set-up and queries: ``init``/``init_thread``/``finalize`` (OpenSHMEM 1.6: callable
several times, in matching pairs, and ``init`` again after the last ``finalize``, which starts
a new runtime on every bootstrap: ``single``, ``local`` (``vkshmem run``), ``env`` and ``mpi``),
``query_initialized``, ``query_thread``, ``global_exit``, ``my_pe``/``n_pes``/``pe_accessible``,
``info_get_version``/``info_get_name`` and the profiling interface's ``pcontrol``.

Importing :mod:`vkshmem.shmem` calls ``init`` (unless ``VKSHMEM_AUTO_INIT=0``), as shmem4py's
import does, and that call counts: a program that also calls ``init`` itself must call
``finalize`` once more to end the library; the runtime's exit handler ends it in any case.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from .. import __version__
from ..core import runtime as _runtime
from ..core.errors import InvalidTypeError
from . import state
from .ctx import reset_default_session
from .enums import THREAD

__all__ = ["MAJOR_VERSION", "MINOR_VERSION", "VENDOR_STRING", "finalize", "global_exit",
           "info_get_name", "info_get_version", "init", "init_thread", "my_pe", "n_pes",
           "pcontrol", "pe_accessible", "query_initialized", "query_thread"]

#: The OpenSHMEM specification version implemented.
MAJOR_VERSION: int = 1
MINOR_VERSION: int = 6
VENDOR_STRING: str = f"vkshmem {__version__}"

_thread_level = THREAD.MULTIPLE
_inits = 0  # init calls on the running runtime not yet matched by a finalize
_pcontrol_level = 1


def info_get_version() -> tuple[int, int]:
    """The OpenSHMEM specification version implemented: ``(1, 6)``. Not collective."""
    return (MAJOR_VERSION, MINOR_VERSION)


def info_get_name() -> str:
    """The implementation's name, ``VENDOR_STRING`` (e.g. ``'vkshmem 0.2.0'``)."""
    return VENDOR_STRING


def query_initialized() -> bool:
    """Whether the runtime is initialised now: True between the first ``init`` and the
    ``finalize`` that matches the last one (OpenSHMEM 1.6). Not collective; callable before
    ``init``."""
    rt = _runtime.current
    return rt is not None and not rt.closed


def init() -> None:
    """Collective: start the runtime, or, when it is running, count one more initialisation
    that a ``finalize`` must match (OpenSHMEM 1.6). After the last ``finalize`` it starts a new
    runtime: every PE must call it, in the same order as its other collective calls; nothing
    of the previous runtime (symmetric arrays, teams, contexts) may be used in the new one."""
    global _inits
    running = query_initialized()
    state.bind(_runtime.start())
    _inits = _inits + 1 if running else 1


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
    """Collective: match one ``init``. The finalize that matches the last init completes
    every operation, synchronises and releases all resources (teams, contexts, memory); the
    others are a ``barrier_all`` (OpenSHMEM 1.6)."""
    global _inits
    if _inits > 1 and query_initialized():
        _inits -= 1
        state.rt.barrier_all()
        return
    _inits = 0
    state.bind(None)
    reset_default_session()
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
    return state.rt.my_pe


def n_pes() -> int:
    """Number of PEs in the job."""
    return state.rt.n_pes


def pe_accessible(pe: int) -> bool:
    """Whether ``pe`` exists and a route reaches it."""
    rt = state.require()
    return isinstance(pe, (int, np.integer)) and 0 <= pe < rt.n_pes


def pcontrol(level: Any = 1) -> None:
    """The profiling interface's control (OpenSHMEM ``shmem_pcontrol``): ``level`` <= 0
    disables profiling, 1 is the default detail, 2 also flushes buffers, > 2 is a profiling
    library's own. vkshmem has no profiling library, so, as the specification says of
    OpenSHMEM libraries, the call only returns. Not collective."""
    global _pcontrol_level
    try:
        _pcontrol_level = int(level.__index__())
    except AttributeError:
        raise InvalidTypeError(f"pcontrol: the level must be an integer, got {level!r}") \
            from None
