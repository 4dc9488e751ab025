"""Endpoints of a background thread (GPU proxy, ring service) on the runtime's transports.

A thread other than the application's gets its own communication context on every transport
that routes to some PE (``Transport.create_context``), made up front on the application's
thread, so it never shares the application's default endpoint where a transport offers
contexts. ``Endpoints(rt)[pe]`` is the endpoint that reaches ``pe``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from vkshmem.core.transports.contract import Transport

if TYPE_CHECKING:
    from vkshmem.core.runtime import Runtime

__all__ = ["Endpoints"]

log = logging.getLogger("vkshmem")


class Endpoints:
    """One context per transport in ``rt``'s routes, indexed by PE."""

    def __init__(self, rt: Runtime) -> None:
        made: dict[int, Transport] = {}
        self._own: list[Transport] = []  # contexts this object created (closed by close())
        for t in rt.routing.route_transport:
            if id(t) not in made:
                ep = t.create_context()
                made[id(t)] = ep
                if ep is not t:
                    self._own.append(ep)
        self._by_pe = [made[id(t)] for t in rt.routing.route_transport]
        #: every distinct endpoint (for quiet/fence over all of them)
        self.all = list(made.values())

    def __getitem__(self, pe: int) -> Transport:
        return self._by_pe[pe]

    def close(self) -> None:
        """Close the contexts made here (transports that returned themselves stay open)."""
        for ep in self._own:
            try:
                ep.close()
            except Exception as exc:
                log.warning("closing a background endpoint: %s", exc)
        self._own.clear()
