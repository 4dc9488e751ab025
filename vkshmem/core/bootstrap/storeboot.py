"""The bootstraps that exchange through the TCP store (:mod:`vkshmem.core.bootstrap.store`).

``local`` (:class:`LocalBootstrap`) connects to the store of the launcher that started the PE
(``vkshmem run``). ``env`` (:class:`EnvBootstrap`) has rank 0 host the store itself, found
through torchrun's or Slurm's variables (:mod:`vkshmem.core.bootstrap.envvars`).

Re-initialisation after the last ``finalize`` (OpenSHMEM 1.6): both connect to the same store
again (it lets a PE that said goodbye join again, see :mod:`vkshmem.core.bootstrap.members`);
rank 0 of ``env`` keeps its store open from its finalize until the next init or the end of the
process.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import socket
from collections.abc import Mapping

from ..auth import FD_VAR, FILE_VAR, SECRET_VAR, load_secret
from ..errors import BootstrapError, ConfigError
from .base import Bootstrap, flush_stdio
from .envvars import (
    PORT_VAR,
    env_job_id,
    env_master_addr,
    env_master_port,
    env_rank_size,
    int_var,
    parse_host_port,
)
from .exposure import BIND_VAR, env_bind, env_secret
from .store import StoreClient, StoreServer

__all__ = ["EnvBootstrap", "LocalBootstrap", "StoreBootstrap"]


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
        rank = int_var(environ, "VKSHMEM_PE")
        size = int_var(environ, "VKSHMEM_NPES", minimum=1)
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
        rank, size, rank_vars, slurm = env_rank_size(environ)
        host, host_source = env_master_addr(environ, slurm)
        port, port_source = env_master_port(environ, slurm)
        job_id = env_job_id(environ)
        bind, bind_source = env_bind(environ, host, host_source, port)
        # every rank applies rank 0's rule (where it binds), the others also to where they
        # connect: none waits the bootstrap timeout for a rank 0 that refused to start
        secret = env_secret(environ, bind, bind_source, None if rank == 0 else host,
                            host_source)
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
