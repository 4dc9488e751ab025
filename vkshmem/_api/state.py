"""The running runtime as the API sees it, with a stand-in that explains a missing init."""

from __future__ import annotations

from typing import Any

from ..core.errors import VkshmemError
from ..core.runtime import Runtime


def _not_initialised() -> VkshmemError:
    return VkshmemError("vkshmem is not initialised: call shmem.init() first (importing "
                        "vkshmem.shmem does it unless VKSHMEM_AUTO_INIT=0), and not after "
                        "shmem.finalize()")


class _NotInitialised:
    """Stands in for the runtime before init and after finalize: every use says so."""

    def __getattr__(self, name: str) -> Any:
        raise _not_initialised()

    def __getitem__(self, key: Any) -> Any:
        raise _not_initialised()


NOT_INITIALISED: Any = _NotInitialised()

#: The running :class:`Runtime` (or the stand-in). Hot paths read ``state.rt`` once per call.
rt: Runtime = NOT_INITIALISED
#: Its parts' objects that per-call paths read, bound once at init (no attribute hops per
#: call): each PE's transport (``rt.routing.route_transport``), the shm path
#: (``rt.routing.shm``), each segment's domain heap or None (``rt.domains.seg_heaps``) and the
#: open heaps by domain (``rt.domains.domain_heaps``). The lists and dicts are filled in place.
route_transport: list[Any] = NOT_INITIALISED
shm: Any = NOT_INITIALISED
seg_heaps: list[Any] = NOT_INITIALISED
domain_heaps: dict[Any, Any] = NOT_INITIALISED


def bind(runtime: Runtime | None) -> None:
    """Make ``runtime`` the running one (None: the stand-in), with its bound parts."""
    global rt, route_transport, shm, seg_heaps, domain_heaps
    if runtime is None:
        rt = route_transport = shm = seg_heaps = domain_heaps = NOT_INITIALISED
    else:
        rt, route_transport = runtime, runtime.routing.route_transport
        shm = runtime.routing.shm
        seg_heaps, domain_heaps = runtime.domains.seg_heaps, runtime.domains.domain_heaps


def require() -> Runtime:
    """The running runtime, or the error saying that vkshmem is not initialised (for calls
    that could otherwise fail with a misleading error, or succeed, without one)."""
    if rt is NOT_INITIALISED:
        raise _not_initialised()
    return rt
