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

The job's secret (:mod:`vkshmem.core.auth`): ``local`` reads the one ``vkshmem run`` passes
(``VKSHMEM_JOB_SECRET_FD``); ``mpi`` has rank 0 make one and broadcasts it; ``env`` reads
``VKSHMEM_JOB_SECRET_FD``, ``VKSHMEM_JOB_SECRET_FILE`` or ``VKSHMEM_JOB_SECRET`` and refuses to
start without one when its store listens beyond loopback; ``single`` makes its own.

The ``env`` bootstrap's store listens on the address ``MASTER_ADDR`` resolves to (on rank 0's
host; ``VKSHMEM_BOOTSTRAP_BIND`` names another, ``0.0.0.0`` for every interface), on port
``VKSHMEM_BOOTSTRAP_PORT`` if set, else ``MASTER_PORT`` (``MASTER_PORT + 1`` under torchrun,
whose agent already serves its own store on ``MASTER_PORT``). Under Slurm without
``MASTER_ADDR``, the address is the first host of ``SLURM_STEP_NODELIST`` (or
``SLURM_JOB_NODELIST``) when that list is simple enough to read (``node07``, ``node[07-09,12]``,
``gpu-a[1-4]-ib``), and the port is derived from ``SLURM_JOB_ID``/``SLURM_STEP_ID`` when
``MASTER_PORT`` is not set; otherwise set ``MASTER_ADDR`` (and ``MASTER_PORT``) yourself, e.g.
``export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)``.

Re-initialisation after the last ``finalize`` (OpenSHMEM 1.6): ``local`` and ``env`` connect to
the same store again (it lets a PE that said goodbye join again, see
:mod:`vkshmem.core.bootstrap.members`); rank 0 of ``env`` keeps its store open from its finalize
until the next init or the end of the process. ``mpi`` duplicates ``COMM_WORLD`` again (MPI is
initialised once, by mpi4py); it refuses clearly once MPI itself has been finalized.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib.util
import os
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any

from ..auth import FD_VAR, FILE_VAR, SECRET_VAR, load_secret, new_secret
from ..errors import BootstrapError, ConfigError
from ..hookspecs import hookimpl
from .base import Bootstrap, BootstrapSpec, flush_stdio, guess_host_address
from .exposure import BIND_VAR, env_bind, env_secret
from .mpi import MpiBootstrap, check_mpi_usable
from .store import StoreClient, StoreServer

__all__ = [
    "MPI_VARS",
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
PORT_VAR = "VKSHMEM_BOOTSTRAP_PORT"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

def _int_var(environ: Mapping[str, str], name: str, minimum: int = 0) -> int:
    text = environ.get(name)
    if text is None or not text.strip():
        raise BootstrapError(f"{name} is not set")
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(name, f"{text!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(name, f"{value} is below {minimum}")
    return value


def parse_host_port(text: str, variable: str) -> tuple[str, int]:
    """``'10.0.0.1:5000'``, ``'node1:5000'`` or ``'[fe80::1]:5000'`` -> (host, port)."""
    text = text.strip()
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\s]+):(\d+)", text)
    if not m:
        raise ConfigError(variable, f"{text!r} is not host:port")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 < port < 65536:
        raise ConfigError(variable, f"port {port} is out of range 1..65535")
    return host, port


def _port(text: str, variable: str) -> int:
    try:
        port = int(text.strip())
    except ValueError:
        raise ConfigError(variable, f"{text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ConfigError(variable, f"port {port} is out of range 1..65535")
    return port


def first_slurm_host(nodelist: str) -> str | None:
    """The first host of a Slurm node list, or None when it is not trivially readable.

    ``node07`` -> ``node07``; ``node[07-09,12],other`` -> ``node07``;
    ``gpu-a[1-4]-ib`` -> ``gpu-a1-ib``; ``rack[1-2]-n[1-4]`` -> None (ask ``scontrol``).
    """
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            end = i
            break
    first = nodelist[:end].strip()
    if re.fullmatch(r"[A-Za-z0-9._-]+", first):
        return first
    m = re.fullmatch(r"([A-Za-z0-9._-]+)\[(\d+)(?:-\d+)?(?:,\d+(?:-\d+)?)*\]([A-Za-z0-9._-]*)",
                     first)
    return m.group(1) + m.group(2) + m.group(3) if m else None


def _slurm_port(environ: Mapping[str, str]) -> int | None:
    try:
        job = int(environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID", "")))
    except ValueError:
        return None
    try:
        step = int(environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID", "0")))
    except ValueError:
        step = 0
    return 15000 + (job * 31 + step) % 17000


# --------------------------------------------------------------------------------------------
# Store-based bootstraps (local, env)
# --------------------------------------------------------------------------------------------

class StoreBootstrap(Bootstrap):
    """A bootstrap that exchanges blobs through a :class:`StoreClient`."""

    def __init__(self, name: str, client: StoreClient, secret: bytes = b"") -> None:
        self.name = name
        self.client = client
        self.rank = client.rank
        self.size = client.size
        self.secret = secret

    def allgather(self, blob: bytes) -> list[bytes]:
        """Collective: every PE contributes ``blob``; all get the list indexed by rank."""
        return self.client.allgather(blob)

    def barrier(self) -> None:
        """Collective: return when every PE has called it."""
        self.client.barrier()

    def host_address(self) -> str:
        """Not collective: the local IP of this PE's connection to the store."""
        return self.client.local_address()

    def report_failure(self, message: str) -> None:
        """Not collective: tell the store (and the launcher, if any) why this PE fails.

        Best effort: never raises, gives up after a few seconds.
        """
        with contextlib.suppress(Exception):
            self.client.report_failure(message)

    def abort(self, status: int) -> None:
        """Not collective: end the whole job with ``status``; does not return."""
        with contextlib.suppress(Exception):
            self.client.abort(status)
        flush_stdio()
        os._exit(status)

    def close(self) -> None:
        """Not collective here: say goodbye to the store. Safe to call twice."""
        self.client.close()


class LocalBootstrap(StoreBootstrap):
    """Under ``vkshmem run``: talks to the launcher's store (``VKSHMEM_LAUNCHER``)."""

    @classmethod
    def open(cls, environ: Mapping[str, str], timeout: float) -> LocalBootstrap:
        """Connect to the launcher's store (not collective; waits up to ``timeout``)."""
        text = environ.get("VKSHMEM_LAUNCHER", "")
        if not text.strip():
            raise BootstrapError("bootstrap 'local' needs VKSHMEM_LAUNCHER (host:port of the "
                                 "launcher's store); start the job with 'vkshmem run -n N "
                                 "script.py', or choose another VKSHMEM_BOOTSTRAP")
        host, port = parse_host_port(text, "VKSHMEM_LAUNCHER")
        rank = _int_var(environ, "VKSHMEM_PE")
        size = _int_var(environ, "VKSHMEM_NPES", minimum=1)
        if rank >= size:
            raise ConfigError("VKSHMEM_PE", f"{rank} is not below VKSHMEM_NPES={size}")
        found = load_secret(environ)
        if found is None:
            raise BootstrapError(f"bootstrap 'local' needs the job's secret: {FD_VAR} (which "
                                 f"'vkshmem run' passes), {FILE_VAR} or {SECRET_VAR}")
        client = StoreClient(host, port, rank, size, timeout=timeout,
                             job_id=environ.get("VKSHMEM_JOB_ID", ""),
                             source="VKSHMEM_LAUNCHER",
                             hint="Is the launcher (vkshmem run) that started this PE "
                                  "still running?", secret=found[0])
        return cls("local", client, found[0])


class EnvBootstrap(StoreBootstrap):
    """torchrun/Slurm style: rank 0 hosts the store in a daemon thread; every rank is a client.

    On rank 0, :meth:`close` waits (up to the bootstrap timeout) for every other PE to close,
    so call it from every PE at finalize. The store itself stays open until the process ends,
    for a later ``init`` (OpenSHMEM 1.6 re-initialisation): every PE then joins it again.
    """

    def __init__(self, client: StoreClient, server: StoreServer | None,
                 timeout: float, secret: bytes = b"") -> None:
        super().__init__("env", client, secret)
        self.server = server
        self.timeout = timeout

    def close(self) -> None:
        """Say goodbye; rank 0 then waits for the others to leave this runtime (its
        generation; one that already joined the next is not waited for). Its store stays open
        for a later init (see :func:`_env_store`)."""
        self.client.close()
        server, self.server = self.server, None
        if server is not None:
            server.wait_members_gone(self.timeout if self.timeout > 0 else None,
                                     generation=self.client.generation)

    @classmethod
    def open(cls, environ: Mapping[str, str], timeout: float) -> EnvBootstrap:
        """Find rank, size and the store's address in the environment; rank 0 starts the
        store; connect to it (waits up to ``timeout`` for rank 0)."""
        rank, size, rank_vars, slurm = _env_rank_size(environ)
        host, host_source = _env_master_addr(environ, slurm)
        port, port_source = _env_master_port(environ, slurm)
        job_id = _env_job_id(environ)
        bind, bind_source = env_bind(environ, host, host_source, port)
        secret = env_secret(environ, bind if rank == 0 else host)
        server = _env_store(port, size, job_id, bind, bind_source, port_source, secret) \
            if rank == 0 else None
        hint = "Rank 0 hosts the store (bootstrap 'env'): is it running, and can this host " \
               "reach that address?"
        if slurm:
            hint += " Under Slurm, start every PE with srun."
        try:
            client = StoreClient(host, port, rank, size, timeout=timeout, job_id=job_id,
                                 source=f"{host_source} and {port_source}, with {rank_vars}",
                                 hint=hint, secret=secret)
        except BaseException:
            if server is not None:
                _close_env_stores()
            raise
        return cls(client, server, timeout, secret)


def _env_rank_size(environ: Mapping[str, str]) -> tuple[int, int, str, bool]:
    if environ.get("RANK") is not None and environ.get("WORLD_SIZE") is not None:
        rank = _int_var(environ, "RANK")
        size = _int_var(environ, "WORLD_SIZE", minimum=1)
        names, slurm = "RANK/WORLD_SIZE", False
    elif environ.get("SLURM_PROCID") is not None and environ.get("SLURM_NTASKS") is not None:
        rank = _int_var(environ, "SLURM_PROCID")
        size_var = "SLURM_STEP_NUM_TASKS" if environ.get("SLURM_STEP_NUM_TASKS") \
            else "SLURM_NTASKS"
        size = _int_var(environ, size_var, minimum=1)
        names, slurm = f"SLURM_PROCID/{size_var}", True
    else:
        raise BootstrapError("bootstrap 'env' needs RANK and WORLD_SIZE (torchrun style) or "
                             "SLURM_PROCID and SLURM_NTASKS (srun); neither pair is set")
    if rank >= size:
        raise ConfigError(names.split("/")[0], f"rank {rank} is not below the job size {size} "
                          f"({names.split('/')[1]})")
    return rank, size, names, slurm


def _env_master_addr(environ: Mapping[str, str], slurm: bool) -> tuple[str, str]:
    addr = environ.get("MASTER_ADDR", "").strip()
    if addr:
        return addr, "MASTER_ADDR"
    if slurm:
        for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            nodelist = environ.get(var, "").strip()
            if nodelist:
                host = first_slurm_host(nodelist)
                if host:
                    return host, f"the first host of {var}"
                raise BootstrapError(
                    f"bootstrap 'env' under Slurm: MASTER_ADDR is not set and {var}="
                    f"{nodelist!r} is too complex to read here; set MASTER_ADDR to the host of "
                    f"rank 0 (and MASTER_PORT to a free port), e.g. export MASTER_ADDR=$("
                    f"scontrol show hostnames \"${var}\" | head -n 1)")
        raise BootstrapError("bootstrap 'env' under Slurm: set MASTER_ADDR (the host of rank 0) "
                             "and MASTER_PORT; neither they nor SLURM_STEP_NODELIST/"
                             "SLURM_JOB_NODELIST are set")
    raise BootstrapError("bootstrap 'env' needs MASTER_ADDR (the host of rank 0) and "
                         "MASTER_PORT (a free port there) besides RANK and WORLD_SIZE")


def _env_master_port(environ: Mapping[str, str], slurm: bool) -> tuple[int, str]:
    text = environ.get(PORT_VAR, "").strip()
    if text:
        return _port(text, PORT_VAR), PORT_VAR
    text = environ.get("MASTER_PORT", "").strip()
    if text:
        port = _port(text, "MASTER_PORT")
        if environ.get("TORCHELASTIC_RUN_ID") is not None and port < 65535:
            # torchrun's agent serves its own TCPStore on MASTER_PORT.
            return port + 1, "MASTER_PORT + 1 (torchrun's agent uses MASTER_PORT)"
        return port, "MASTER_PORT"
    if slurm:
        port = _slurm_port(environ)
        if port is not None:
            return port, "a port derived from SLURM_JOB_ID/SLURM_STEP_ID (MASTER_PORT unset)"
        raise BootstrapError("bootstrap 'env' under Slurm: set MASTER_PORT (a free port on the "
                             "host of rank 0); SLURM_JOB_ID is not set to derive one from")
    raise BootstrapError("bootstrap 'env' needs MASTER_PORT (a free port on MASTER_ADDR's "
                         "host, where rank 0 starts the store)")


def _env_job_id(environ: Mapping[str, str]) -> str:
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if job:
        return f"slurm-{job}.{environ.get('SLURM_STEP_ID', environ.get('SLURM_STEPID', ''))}"
    return environ.get("TORCHELASTIC_RUN_ID", "")


#: Rank 0's 'env' stores by (port, size, job id): kept open from a finalize to the next init.
_env_stores: dict[tuple[int, int, str], StoreServer] = {}


def _env_store(port: int, size: int, job_id: str, host: str, host_source: str,
               port_source: str, secret: bytes) -> StoreServer:
    """Rank 0's store of this job: the one a previous init of this process opened, or a new
    one (after closing one of another job on the same port)."""
    key = (port, size, job_id)
    server = _env_stores.get(key)
    if server is not None and not server.closed:
        return server
    for old in [k for k in _env_stores if k[0] == port]:
        _env_stores.pop(old).close()
    server = _start_env_store(host, port, size, job_id, host_source, port_source, secret)
    if not _env_stores:
        atexit.unregister(_close_env_stores)  # registered once, however often reopened
        atexit.register(_close_env_stores)
    _env_stores[key] = server
    return server


def _close_env_stores() -> None:
    """Close rank 0's 'env' stores (at exit, or when opening the bootstrap failed)."""
    while _env_stores:
        _env_stores.popitem()[1].close()


def _start_env_store(host: str, port: int, size: int, job_id: str, host_source: str,
                     port_source: str, secret: bytes) -> StoreServer:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BootstrapError(f"bootstrap 'env': cannot resolve {host!r} ({host_source}): "
                             f"{exc}") from None
    family = infos[0][0] if infos else socket.AF_INET
    address = str(infos[0][4][0]) if infos else host
    try:
        server = StoreServer(size, address, port, job_id=job_id, fail_fast=True,
                             family=family, secret=secret)
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise BootstrapError(
                f"bootstrap 'env': rank 0 cannot listen on {address} ({host_source}): it is "
                f"not an address of this host. Start rank 0 on that host, or set {BIND_VAR} "
                f"to an address of this host (0.0.0.0: every interface)") from None
        busy = " (the port is in use on this host)" if exc.errno == errno.EADDRINUSE else ""
        raise BootstrapError(
            f"bootstrap 'env': rank 0 cannot start the store on port {port} ({port_source})"
            f"{busy}: {exc.strerror or exc}; choose a free port with MASTER_PORT or "
            f"{PORT_VAR}") from None
    return server.start()


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
