"""Collectives in the core: the host algorithms over the transport contract (:mod:`.host`,
:mod:`.reduce`, per-team state in :mod:`.team`) and those whose target or source is a
domain's array (:mod:`.device`, the ring all-reduce in :mod:`.device_ring`)."""
