"""Element counts and local sources of the API's calls, shared by the API layer and the
collectives of the core (host and device)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .domains.contract import DomainArray
from .errors import InvalidArgumentError, InvalidTypeError

__all__ = ["count_of", "element_count", "host_copy"]


def host_copy(a: Any) -> Any:
    """``a`` itself, or for a domain's array a numpy copy of its contents (a local source)."""
    return a.to_numpy() if isinstance(a, DomainArray) else a


def count_of(target: np.ndarray, source: np.ndarray, size: int | None) -> int:
    """Elements to move: ``size`` checked against both arrays, or the smaller length."""
    if size is None:
        t, s = target.size, source.size
        return t if t < s else s
    return element_count(size, target.size, source.size)


def element_count(size: Any, *limits: int) -> int:
    """Validate an explicit element count against the lengths it must fit in."""
    try:
        n = int(size.__index__())
    except AttributeError:
        raise InvalidTypeError(f"size must be an integer, got {size!r}") from None
    if n < 0:
        raise InvalidArgumentError(f"size must be >= 0, got {n}")
    for limit in limits:
        if n > limit:
            raise InvalidArgumentError(f"size {n} is larger than a buffer of {limit} elements")
    return n
