"""GPU-initiated communication: kernels (``launch``), the request ring they write (``ring``),
the host thread that serves it (``ringservice``) and the launch device and service of a domain
(``initiator``: :class:`Initiator <vkshmem.gpu.initiated.initiator.Initiator>`)."""
