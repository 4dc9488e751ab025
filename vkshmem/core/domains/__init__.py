"""Memory domains in the core: the plugin contract (:mod:`.contract`, :mod:`.array`), the
runtime's table of domains (:mod:`.registry`) and each opened domain's symmetric heap
(:mod:`.heap`, with its routes to peers in :mod:`.peers` and its device transfers in
:mod:`.xfer`)."""
