"""The bootstraps that ship with vkshmem (entry point ``builtin`` in ``vkshmem.bootstraps``).

========  ========  ==========================================================================
name      priority  used when (``VKSHMEM_BOOTSTRAP=auto``)
========  ========  ==========================================================================
local     300       under ``vkshmem run``: ``VKSHMEM_LAUNCHER`` (host:port of the launcher's
                    store), ``VKSHMEM_PE``, ``VKSHMEM_NPES``, ``VKSHMEM_JOB_ID`` are set
mpi       200       under ``mpirun``/``mpiexec``/``srun --mpi=...`` (one of :data:`MPI_VARS`
                    is set) and mpi4py is installed; mpi4py.MPI is imported only when chosen
env       100       torchrun style ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, or
                    Slurm's ``SLURM_PROCID``/``SLURM_NTASKS`` (``srun``); rank 0 hosts the store
single    0         always: a job of one PE (``python script.py``)
========  ========  ==========================================================================

The store-based bootstraps (``local``, ``env``) are :mod:`vkshmem.core.bootstrap.storeboot`'s,
which reads the environment through :mod:`vkshmem.core.bootstrap.envvars` (how ``env`` finds
rank 0's store, also under Slurm); ``mpi`` is :mod:`vkshmem.core.bootstrap.mpi`'s. This module
holds ``single``, the detection of which one applies, and their registration.

The job's secret (:mod:`vkshmem.core.auth`): ``local`` reads the one ``vkshmem run`` passes
(``VKSHMEM_JOB_SECRET_FD``); ``mpi`` has rank 0 make one and broadcasts it; ``env`` reads
``VKSHMEM_JOB_SECRET_FD``, ``VKSHMEM_JOB_SECRET_FILE`` or ``VKSHMEM_JOB_SECRET`` and refuses to
start without one when its store listens beyond loopback; ``single`` makes its own.

Re-initialisation after the last ``finalize`` (OpenSHMEM 1.6): ``local`` and ``env`` connect to
the same store again (it lets a PE that said goodbye join again, see
:mod:`vkshmem.core.bootstrap.members`); rank 0 of ``env`` keeps its store open from its finalize
until the next init or the end of the process. ``mpi`` duplicates ``COMM_WORLD`` again (MPI is
initialised once, by mpi4py); it refuses clearly once MPI itself has been finalized.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from typing import Any

from ..auth import new_secret
from ..plugins.hookspecs import hookimpl
from .base import Bootstrap, BootstrapSpec, flush_stdio, guess_host_address
from .envvars import PORT_VAR, first_slurm_host, parse_host_port
from .mpi import MpiBootstrap, check_mpi_usable
from .storeboot import EnvBootstrap, LocalBootstrap, StoreBootstrap

__all__ = [
    "MPI_VARS",
    "PORT_VAR",
    "EnvBootstrap",
    "LocalBootstrap",
    "MpiBootstrap",
    "SingleBootstrap",
    "StoreBootstrap",
    "check_mpi_usable",
    "first_slurm_host",
    "guess_host_address",
    "parse_host_port",
    "register_bootstraps",
]

#: Variables whose presence means "started by an MPI launcher".
MPI_VARS = (
    "OMPI_COMM_WORLD_SIZE",  # Open MPI
    "PMIX_RANK",  # PMIx (Open MPI 5, srun --mpi=pmix)
    "PMI_SIZE",  # MPICH / Intel MPI (Hydra), srun --mpi=pmi2
    "PMI_RANK",
    "MV2_COMM_WORLD_SIZE",  # MVAPICH2
    "MPI_LOCALNRANKS",  # MPICH Hydra
)
LAUNCHER_VARS = ("VKSHMEM_LAUNCHER", "VKSHMEM_PE", "VKSHMEM_NPES", "VKSHMEM_JOB_ID")

# --------------------------------------------------------------------------------------------
# Single PE
# --------------------------------------------------------------------------------------------

class SingleBootstrap(Bootstrap):
    """A job of one PE: every exchange is local."""

    def __init__(self) -> None:
        self.name = "single"
        self.rank = 0
        self.size = 1
        self.secret = new_secret()

    def allgather(self, blob: bytes) -> list[bytes]:
        """Collective (of one): returns ``[blob]``."""
        return [bytes(blob)]

    def barrier(self) -> None:
        """Collective (of one): returns at once."""

    def abort(self, status: int) -> None:
        """End this process (the whole job) with ``status``; does not return."""
        flush_stdio()
        os._exit(status)

    def close(self) -> None:
        """Nothing to release."""

    @classmethod
    def open(cls, environ: Mapping[str, str], timeout: float) -> SingleBootstrap:
        """A one-PE job."""
        return cls()


# --------------------------------------------------------------------------------------------
# Detection and registration
# --------------------------------------------------------------------------------------------

def detect_local(environ: Mapping[str, str]) -> bool:
    """Started by ``vkshmem run``."""
    return bool(environ.get("VKSHMEM_LAUNCHER", "").strip())


def detect_mpi(environ: Mapping[str, str]) -> bool:
    """Started by an MPI launcher, and mpi4py is installed (not imported)."""
    if not any(environ.get(v) for v in MPI_VARS):
        return False
    try:
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


def detect_env(environ: Mapping[str, str]) -> bool:
    """torchrun-style or Slurm variables are set."""
    return (environ.get("RANK") is not None and environ.get("WORLD_SIZE") is not None) or (
        environ.get("SLURM_PROCID") is not None and environ.get("SLURM_NTASKS") is not None)


def _always(environ: Mapping[str, str]) -> bool:
    return True


SPECS: tuple[BootstrapSpec, ...] = (
    BootstrapSpec("local", LocalBootstrap.open, detect_local, 300,
                  "vkshmem run: VKSHMEM_LAUNCHER, VKSHMEM_PE, VKSHMEM_NPES"),
    BootstrapSpec("mpi", MpiBootstrap.open, detect_mpi, 200,
                  "mpi4py under mpirun/mpiexec/srun --mpi"),
    BootstrapSpec("env", EnvBootstrap.open, detect_env, 100,
                  "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun) or "
                  "SLURM_PROCID/SLURM_NTASKS (srun); rank 0 hosts a TCP store"),
    BootstrapSpec("single", SingleBootstrap.open, _always, 0,
                  "a job of one PE (plain 'python script.py')"),
)


@hookimpl
def register_bootstraps(register: Callable[[Any], None]) -> None:
    """Register the built-in bootstraps: local, mpi, env, single."""
    for spec in SPECS:
        register(spec)
