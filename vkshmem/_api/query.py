"""Library state queries (OpenSHMEM 1.6)."""

from __future__ import annotations

from ..core import runtime

__all__ = ["query_initialized"]


def query_initialized() -> bool:
    """Whether the runtime is initialised now: True between ``init`` and ``finalize``
    (OpenSHMEM 1.6). Not collective; callable before ``init``."""
    rt = runtime.current
    return rt is not None and not rt.closed
