"""``VKSHMEM_CHECK_COLLECTIVES=1``: a debugging check that every PE called the same
TEAM_WORLD collective with the same arguments.

Without it, a collective whose root, count, dtype or op differs across PEs is not detected
(docs/errors.md): checking costs an exchange per call. With it, each collective first
all-gathers a description of its call through the bootstrap and every PE raises the same
InvalidArgumentError naming the PEs that differ; the runtime leaves its compiled fast paths
off, so that every collective comes through here. Teams other than TEAM_WORLD are not
checked (the bootstrap's all-gather spans every PE).
"""

from __future__ import annotations

from typing import Any

from ..core.errors import InvalidArgumentError

__all__ = ["agree"]


def agree(ct: Any, what: str, **fields: Any) -> None:
    """Collective over TEAM_WORLD when the check is on: compare ``what(fields)`` across PEs."""
    rt = ct.rt
    if not rt.config.check_collectives or ct.ts is not rt.world:
        return
    mine = f"{what}({', '.join(f'{k}={v}' for k, v in fields.items())})"
    calls = [b.decode() for b in rt.bootstrap.allgather(mine.encode())]
    if len(set(calls)) == 1:
        return
    first = calls[0]
    others = [f"PE {pe} called {c}" for pe, c in enumerate(calls) if c != first]
    raise InvalidArgumentError(
        f"collective mismatch (VKSHMEM_CHECK_COLLECTIVES=1): PE 0 called {first} but "
        f"{'; '.join(others)}; every PE must make the same collective call with the same "
        "root, count, dtype and op")
