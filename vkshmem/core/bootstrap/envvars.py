"""Reading a job from environment variables: PE numbers, sizes and the store's address.

The ``local`` bootstrap reads ``VKSHMEM_LAUNCHER`` (:func:`parse_host_port`), ``VKSHMEM_PE``
and ``VKSHMEM_NPES`` (:func:`int_var`). The ``env`` bootstrap finds its rank and size in
torchrun's ``RANK``/``WORLD_SIZE`` or Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``
(:func:`env_rank_size`), and rank 0's store as follows.

The ``env`` bootstrap's store listens on the address ``MASTER_ADDR`` resolves to (on rank 0's
host; ``VKSHMEM_BOOTSTRAP_BIND`` names another, ``0.0.0.0`` for every interface), on port
``VKSHMEM_BOOTSTRAP_PORT`` if set, else ``MASTER_PORT`` (``MASTER_PORT + 1`` under torchrun,
whose agent already serves its own store on ``MASTER_PORT``). Under Slurm without
``MASTER_ADDR``, the address is the first host of ``SLURM_STEP_NODELIST`` (or
``SLURM_JOB_NODELIST``) when that list is simple enough to read (``node07``, ``node[07-09,12]``,
``gpu-a[1-4]-ib``), and the port is derived from ``SLURM_JOB_ID``/``SLURM_STEP_ID`` when
``MASTER_PORT`` is not set; otherwise set ``MASTER_ADDR`` (and ``MASTER_PORT``) yourself, e.g.
``export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)``.
Where the store binds and whether it needs a secret is :mod:`vkshmem.core.bootstrap.exposure`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import BootstrapError, ConfigError

__all__ = [
    "PORT_VAR",
    "env_job_id",
    "env_master_addr",
    "env_master_port",
    "env_rank_size",
    "first_slurm_host",
    "int_var",
    "parse_host_port",
]

PORT_VAR = "VKSHMEM_BOOTSTRAP_PORT"


def int_var(environ: Mapping[str, str], name: str, minimum: int = 0) -> int:
    """The integer in variable ``name``, at least ``minimum`` (BootstrapError if unset)."""
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


def env_rank_size(environ: Mapping[str, str]) -> tuple[int, int, str, bool]:
    """(rank, size, the variables they came from, whether they are Slurm's)."""
    if environ.get("RANK") is not None and environ.get("WORLD_SIZE") is not None:
        rank = int_var(environ, "RANK")
        size = int_var(environ, "WORLD_SIZE", minimum=1)
        names, slurm = "RANK/WORLD_SIZE", False
    elif environ.get("SLURM_PROCID") is not None and environ.get("SLURM_NTASKS") is not None:
        rank = int_var(environ, "SLURM_PROCID")
        size_var = "SLURM_STEP_NUM_TASKS" if environ.get("SLURM_STEP_NUM_TASKS") \
            else "SLURM_NTASKS"
        size = int_var(environ, size_var, minimum=1)
        names, slurm = f"SLURM_PROCID/{size_var}", True
    else:
        raise BootstrapError("bootstrap 'env' needs RANK and WORLD_SIZE (torchrun style) or "
                             "SLURM_PROCID and SLURM_NTASKS (srun); neither pair is set")
    if rank >= size:
        raise ConfigError(names.split("/")[0], f"rank {rank} is not below the job size {size} "
                          f"({names.split('/')[1]})")
    return rank, size, names, slurm


def env_master_addr(environ: Mapping[str, str], slurm: bool) -> tuple[str, str]:
    """(rank 0's host, where that came from): ``MASTER_ADDR``, else Slurm's node list."""
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


def env_master_port(environ: Mapping[str, str], slurm: bool) -> tuple[int, str]:
    """(the store's port, where that came from); see the module's docstring for the order."""
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


def env_job_id(environ: Mapping[str, str]) -> str:
    """The job id the store checks: Slurm's job and step, or torchrun's run id, or ``""``."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if job:
        return f"slurm-{job}.{environ.get('SLURM_STEP_ID', environ.get('SLURM_STEPID', ''))}"
    return environ.get("TORCHELASTIC_RUN_ID", "")
