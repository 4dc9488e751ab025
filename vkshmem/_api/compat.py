"""The two module attributes of ``shmem4py.shmem`` that are not OpenSHMEM calls: ``ffi`` and
``lib``.

shmem4py's ``ffi`` is its cffi FFI object; programs use it to look at buffers
(``shmem.ffi.from_buffer(mem)``, ``shmem.ffi.cast('uintptr_t', cdata)``). vkshmem's ``ffi`` is
the cffi FFI of its native core, which does the same. shmem4py's ``lib`` is its binding of a
C OpenSHMEM library; vkshmem has none, so its ``lib`` carries only the C library's constants
and predefined handles (``lib.SHMEM_TEAM_NUM_CONTEXTS``, ``lib.SHMEM_CMP_EQ``,
``lib.SHMEM_TEAM_WORLD``, ...); a C function (``lib.shmem_*``) is an AttributeError that says
so.
"""

from __future__ import annotations

from typing import Any

from ..core._native import ffi
from .ctx import CTX_DEFAULT, CTX_INVALID
from .enums import CMP, CTX, CTX_SESSION, MALLOC, THREAD
from .lifecycle import MAJOR_VERSION, MINOR_VERSION
from .signal import SIGNAL
from .team import TEAM_INVALID, TEAM_SHARED, TEAM_WORLD

__all__ = ["ffi", "lib"]


class _Lib:
    """OpenSHMEM's C constants and predefined handles, by their C names (no C functions)."""

    def __init__(self) -> None:
        consts: dict[str, Any] = {
            "SHMEM_MAJOR_VERSION": MAJOR_VERSION, "SHMEM_MINOR_VERSION": MINOR_VERSION,
            "SHMEM_MAX_NAME_LEN": 256, "SHMEM_TEAM_NUM_CONTEXTS": 1,
            "SHMEM_CTX_SESSION_TOTAL_OPS": 1,
            "SHMEM_CTX_DEFAULT": CTX_DEFAULT, "SHMEM_CTX_INVALID": CTX_INVALID,
            "SHMEM_TEAM_WORLD": TEAM_WORLD, "SHMEM_TEAM_SHARED": TEAM_SHARED,
            "SHMEM_TEAM_INVALID": TEAM_INVALID,
        }
        for prefix, enum in (("THREAD", THREAD), ("CTX", CTX), ("CTX_SESSION", CTX_SESSION),
                             ("MALLOC", MALLOC), ("SIGNAL", SIGNAL), ("CMP", CMP)):
            for member in enum:
                consts[f"SHMEM_{prefix}_{member.name}"] = int(member)
        self.__dict__.update(consts)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"lib.{name}: vkshmem has no C OpenSHMEM library (lib holds only "
                             "its SHMEM_* constants); use vkshmem.shmem's Python calls")

    def __repr__(self) -> str:
        return "<vkshmem.shmem.lib: OpenSHMEM constants>"


lib = _Lib()
