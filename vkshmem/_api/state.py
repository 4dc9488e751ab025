"""The running runtime as the API sees it, with a stand-in that explains a missing init."""

from __future__ import annotations

from typing import Any

from ..core.errors import VkshmemError
from ..core.runtime import Runtime


class _NotInitialised:
    """Stands in for the runtime before init and after finalize: every use says so."""

    def __getattr__(self, name: str) -> Any:
        raise VkshmemError("vkshmem is not initialised: call shmem.init() first (importing "
                           "vkshmem.shmem does it unless VKSHMEM_AUTO_INIT=0), and not after "
                           "shmem.finalize()")


NOT_INITIALISED: Any = _NotInitialised()

#: The running :class:`Runtime` (or the stand-in). Hot paths read ``state.rt`` once per call.
rt: Runtime = NOT_INITIALISED
