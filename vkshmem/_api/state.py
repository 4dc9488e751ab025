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


NOT_INITIALISED: Any = _NotInitialised()

#: The running :class:`Runtime` (or the stand-in). Hot paths read ``state.rt`` once per call.
rt: Runtime = NOT_INITIALISED


def require() -> Runtime:
    """The running runtime, or the error saying that vkshmem is not initialised (for calls
    that could otherwise fail with a misleading error, or succeed, without one)."""
    if rt is NOT_INITIALISED:
        raise _not_initialised()
    return rt
