"""Start-up of a domain heap's same-node routes: imports and links (step 2 of
:mod:`vkshmem.core.domains.heap`).

Same-node peers of one ``group`` (e.g. the same GPU), with the shm path on, pass each other
their fds over Unix sockets and ``import_peer`` each other's segments (route ``direct``).
Same-node peers of one ``link_group`` but different groups (e.g. two GPUs a vendor API copies
between) pass their fds too and get a :class:`~vkshmem.core.domains.contract.DomainLink` from
``link_peer``: puts and gets to them go through the link, AMOs through the domain proxy
(route ``link+proxy``). A peer whose import or link fails is reached another way (logged).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..fdshare import exchange_fds

if TYPE_CHECKING:
    from ..runtime import Runtime
    from .contract import DomainLink, MemoryDomain

__all__ = ["import_peers"]

log = logging.getLogger("vkshmem")


def import_peers(rt: Runtime, domain: MemoryDomain, name: str, seg_id: int,
                 infos: list[dict[str, Any]], fds: list[int]
                 ) -> tuple[dict[int, Any], dict[int, DomainLink]]:
    """Collective: exchange fds with the same-node peers whose all-gathered ``infos`` (every
    PE's ``group``, ``link`` and ``meta``) match this PE's, then import or link each. Returns
    the imported segments and the links, by PE."""
    me = rt.my_pe
    ok = rt.config.shm and rt.config.domain_import

    def key(pe: int, field: str) -> tuple[str, str] | None:
        value = infos[pe].get(field)
        return (rt.node_ids[pe], value) if ok and value is not None else None

    mine, my_link = key(me, "group"), key(me, "link")
    direct = {pe for pe in range(rt.n_pes)
              if pe != me and mine is not None and key(pe, "group") == mine}
    linked = {pe for pe in range(rt.n_pes)
              if pe != me and pe not in direct and my_link is not None
              and key(pe, "link") == my_link}
    got = exchange_fds(me, {pe: rt.pids[pe] for pe in sorted(direct | linked)}, fds,
                       rt.bootstrap.allgather, rt.bootstrap.barrier,
                       rt.config.bootstrap_timeout)
    peers: dict[int, Any] = {}
    links: dict[int, DomainLink] = {}
    for pe in sorted(got):
        meta = bytes.fromhex(infos[pe]["meta"])
        try:
            if pe in direct:
                peers[pe] = domain.import_peer(pe, got[pe], meta)
            else:
                link = domain.link_peer(pe, got[pe], meta, infos[pe]["group"])
                if link is not None:
                    links[pe] = link
        except Exception as exc:  # reach that PE another way
            log.warning("PE %d cannot %s the %s segment of PE %d: %s; it goes through "
                        "another route", me, "import" if pe in direct else "link to", name,
                        pe, exc)
    return peers, links
