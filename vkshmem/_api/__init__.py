"""Private implementation of :mod:`vkshmem.shmem`; import the public names from there."""
