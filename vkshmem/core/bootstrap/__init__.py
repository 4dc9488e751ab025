"""Bootstrap: how PEs find each other (hook family ``vkshmem.bootstraps``)."""
