"""Start-up of a domain heap's routes through transports (step 3 of
:mod:`vkshmem.core.domains.heap`): peers not imported and not linked, whose route's transport
carries puts and gets on the domain's memory kind, are reached through that transport, and
their AMOs too where it carries those."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from ..errors import TransportError
from ..transports.contract import AMO, RMA, SegmentInfo, Transport

if TYPE_CHECKING:
    from ..runtime import Runtime
    from .contract import DomainLink

__all__ = ["carriers"]

log = logging.getLogger("vkshmem")


def carriers(rt: Runtime, name: str, seg_id: int, info: SegmentInfo, direct: list[Any],
             links: list[DomainLink | None]
             ) -> tuple[list[Transport | None], list[Transport | None]]:
    """Collective (every PE registers segment ``seg_id`` of domain ``name`` with each transport
    able to carry it, and all-gathers the keys): per PE, the transport carrying puts and gets
    to it and the one carrying AMOs (None: imported, linked, or through the domain proxy)."""
    kind = info.kind
    dmabuf = info.dmabuf_fd >= 0
    ops = {t: t.carries(kind, dmabuf) for t in rt.routing.transports}
    able = [t for t in rt.routing.transports if RMA in ops[t]]
    keys = {}
    for t in able:
        try:
            keys[f"{t.spec.name}@{rt.routing.rail_of(t)}"] = t.register(info).hex()
        except TransportError as exc:
            if kind == "host":
                raise
            # a transport refusing GPU memory (e.g. a provider without dma-buf
            # registration): the peers reach this segment another way (the GPU proxy)
            log.warning("PE %d: %s; the %s segment goes through another route",
                        rt.my_pe, exc, name)
    tables = [json.loads(b) for b in rt.bootstrap.allgather(json.dumps(keys).encode())]
    carrier: list[Transport | None] = [None] * rt.n_pes
    amo_carrier: list[Transport | None] = [None] * rt.n_pes
    for t in able:
        key = f"{t.spec.name}@{rt.routing.rail_of(t)}"
        peers = {}
        for pe in range(rt.n_pes):
            if key in tables[pe]:
                rkeys = {seg_id: bytes.fromhex(tables[pe][key])}
                peers[pe] = rt.routing.peer_info(pe, t, rkeys)
        t.connect(peers)
        for pe in peers:
            if direct[pe] is None and links[pe] is None and carrier[pe] is None \
                    and rt.routing.route_transport[pe] is t:
                carrier[pe] = t
                if AMO in ops[t]:
                    amo_carrier[pe] = t
    return carrier, amo_carrier
