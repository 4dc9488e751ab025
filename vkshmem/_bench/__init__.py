"""``vkshmem bench``: OSU-style benchmarks of vkshmem, side by side with mpi4py RMA, shmem4py
on Open MPI's OSHMEM and UCX's ``ucx_perftest`` in one invocation.

Modules: :mod:`.spec` (benchmarks, sizes, the plan every side follows), :mod:`.pattern` (who
measures what, the timing loop), :mod:`.kernels` (the OpenSHMEM side, run on every PE:
vkshmem or shmem4py), :mod:`.mpi_side` (the mpi4py side), :mod:`.perftest`
(``ucx_perftest``), :mod:`.sides` (each side as a subprocess with a deadline),
:mod:`.driver` (the sides in turn under one progress bar), :mod:`.report` (table, CSV, JSON,
plot) and :mod:`.cli` (the subcommand's options).
"""
