"""Transports in the core: the plugin contract (:mod:`.contract`), the built-in shared-memory
path (:mod:`.shm`), rails and routes to each PE (:mod:`.rails`) and background threads'
endpoints (:mod:`.endpoints`)."""
