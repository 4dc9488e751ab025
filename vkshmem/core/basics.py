"""What the parts of a :class:`~vkshmem.core.runtime.Runtime` read of the runtime that owns
them, as small protocols: the runtime is composed of parts (its transports and routes, its
memory domains, its host heap), each a plain class given its owner typed by one of these
rather than a sibling's attributes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .bootstrap.base import Bootstrap
    from .config import Config
    from .plugins.loader import Registry

__all__ = ["RuntimeBasics"]


class RuntimeBasics(Protocol):
    """Who this PE is in the job, and how it reaches the others before any transport: set by
    the runtime at start-up, before it builds its parts."""

    config: Config
    registry: Registry
    bootstrap: Bootstrap
    my_pe: int
    n_pes: int
    #: each PE's node identity, process id; the PEs of this node
    node_ids: list[str]
    pids: list[int]
    node_pes: list[int]
