"""Enumerations of the OpenSHMEM API (names and members as in shmem4py)."""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable
from typing import Any

from ..core.errors import InvalidArgumentError

__all__ = ["AMO", "CMP", "CTX", "CTX_SESSION", "MALLOC", "THREAD", "cmp_codes",
           "cmp_function"]


class THREAD(enum.IntEnum):
    """Thread support levels."""

    SINGLE = 0
    FUNNELED = 1
    SERIALIZED = 2
    MULTIPLE = 3


class CTX(enum.IntFlag):
    """Context creation options."""

    PRIVATE = 1
    SERIALIZED = 2
    NOSTORE = 4


class CTX_SESSION(enum.IntFlag):
    """Session options (OpenSHMEM 1.6 ``SHMEM_CTX_SESSION_*``) for ``ctx_session_start``."""

    BATCH = 1
    """The context will issue a batch: many small RMA/AMO calls that may be combined."""


class MALLOC(enum.IntFlag):
    """Allocation hints (accepted; the host heap needs none of them)."""

    ATOMICS_REMOTE = 1
    SIGNAL_REMOTE = 2


class AMO(str, enum.Enum):
    """Operations for ``atomic_op``/``atomic_fetch_op``."""

    SET = "set"
    INC = "inc"
    ADD = "add"
    AND = "and"
    OR = "or"
    XOR = "xor"

    def __str__(self) -> str:
        return self.value


class CMP(enum.IntEnum):
    """Comparison operators for wait/test: also accepted as strings or ``operator`` functions."""

    EQ = 1
    NE = 2
    GT = 3
    LE = 4
    LT = 5
    GE = 6


_CMP_FUNCS: dict[CMP, Callable[[Any, Any], Any]] = {
    CMP.EQ: operator.eq, CMP.NE: operator.ne, CMP.GT: operator.gt,
    CMP.LE: operator.le, CMP.LT: operator.lt, CMP.GE: operator.ge,
}
_CMP_LOOKUP: dict[Any, Callable[[Any, Any], Any]] = {}
for _member, _func in _CMP_FUNCS.items():
    _CMP_LOOKUP[_member] = _func
    _CMP_LOOKUP[int(_member)] = _func
    _CMP_LOOKUP[_member.name.lower()] = _func
    _CMP_LOOKUP[_func] = _func
for _sym, _member in (("==", CMP.EQ), ("!=", CMP.NE), (">", CMP.GT), ("<=", CMP.LE),
                      ("<", CMP.LT), (">=", CMP.GE)):
    _CMP_LOOKUP[_sym] = _CMP_FUNCS[_member]


def cmp_function(cmp: Any) -> Callable[[Any, Any], Any]:
    """The comparison for ``cmp`` given as CMP, int, 'eq'/'EQ'/'==', or ``operator.eq``."""
    key = cmp.lower() if isinstance(cmp, str) else cmp
    try:
        return _CMP_LOOKUP[key]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"unknown comparison {cmp!r}: use shmem.CMP.EQ/NE/GT/LE/LT/GE, a string such as "
            "'eq' or '>=', or a function from the operator module") from None


def cmp_codes() -> dict[Any, int]:
    """Every comparison :func:`cmp_function` takes as is -> its CMP code (for the native
    waits of :mod:`vkshmem.core.fast`)."""
    member_of = {func: int(m) for m, func in _CMP_FUNCS.items()}
    return {key: member_of[func] for key, func in _CMP_LOOKUP.items()}


class OP(str, enum.Enum):
    """Reduction operations for ``reduce`` (also accepted as their lower-case names)."""

    AND = "and"
    OR = "or"
    XOR = "xor"
    MAX = "max"
    MIN = "min"
    SUM = "sum"
    PROD = "prod"

    def __str__(self) -> str:
        return self.value


__all__ += ["OP"]
