"""Plugins seen from the core: the pluggy hooks (:mod:`.hookspecs`), discovery and loading
(:mod:`.loader`), the plugin API's version (:mod:`.apiversion`), and what the kit offers
native plugins (:mod:`.build`, :mod:`.nativetransport`). Plugin authors import
:mod:`vkshmem.plugin`, which re-exports what is theirs."""
