"""Choosing and opening the bootstrap of a job (``VKSHMEM_BOOTSTRAP``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ..config import Config
from ..errors import BootstrapError, ConfigError, VkshmemError
from .base import Bootstrap, BootstrapSpec

__all__ = ["choose_bootstrap", "open_bootstrap"]

log = logging.getLogger("vkshmem")


def _by_priority(specs: Mapping[str, BootstrapSpec]) -> list[BootstrapSpec]:
    return sorted(specs.values(), key=lambda s: (-s.priority, s.name))


def choose_bootstrap(config: Config, specs: Mapping[str, BootstrapSpec],
                     environ: Mapping[str, str]) -> tuple[BootstrapSpec, str]:
    """The spec ``config.bootstrap`` selects, and why (for logs and ``vkshmem info``).

    ``auto``: the highest-priority spec whose ``detect(environ)`` is true. A name: that spec;
    an unknown name is a :class:`ConfigError` on ``VKSHMEM_BOOTSTRAP`` listing the known ones.
    """
    wanted = (config.bootstrap or "auto").strip().lower()
    known = ", ".join(s.name for s in _by_priority(specs)) or "none installed"
    if wanted != "auto":
        for spec in specs.values():
            if spec.name.lower() == wanted:
                return spec, "VKSHMEM_BOOTSTRAP=" + spec.name
        raise ConfigError("VKSHMEM_BOOTSTRAP",
                          f"unknown bootstrap {wanted!r}; known: auto, {known}")
    for spec in _by_priority(specs):
        try:
            found = bool(spec.detect(environ))
        except Exception as exc:  # a third party's detect() must not break start-up
            log.warning("bootstrap %r: detect() raised %s: %s; skipped", spec.name,
                        type(exc).__name__, exc)
            continue
        if found:
            return spec, f"auto: detected (priority {spec.priority})"
    raise BootstrapError(f"VKSHMEM_BOOTSTRAP=auto: no bootstrap detected this environment "
                         f"(known: {known}); set VKSHMEM_BOOTSTRAP to one of them")


def open_bootstrap(config: Config, specs: Mapping[str, BootstrapSpec],
                   environ: Mapping[str, str] | None = None) -> Bootstrap:
    """Choose the bootstrap (see :func:`choose_bootstrap`) and open it.

    Collective: every PE of the job calls it at start-up; it returns once this PE is connected
    (the first exchange waits for the others). Waits use ``config.bootstrap_timeout``
    (``VKSHMEM_BOOTSTRAP_TIMEOUT``).
    """
    env = os.environ if environ is None else environ
    spec, why = choose_bootstrap(config, specs, env)
    log.info("bootstrap %s (%s)", spec.name, why)
    try:
        boot = spec.factory(env, config.bootstrap_timeout)
    except VkshmemError:
        raise
    except Exception as exc:
        raise BootstrapError(f"bootstrap {spec.name!r} failed to start: "
                             f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(boot, Bootstrap):
        raise BootstrapError(f"bootstrap {spec.name!r}: its factory returned {boot!r}, "
                             f"not a Bootstrap")
    if not (isinstance(boot.size, int) and boot.size >= 1 and 0 <= boot.rank < boot.size):
        boot.close()
        raise BootstrapError(f"bootstrap {spec.name!r} gave rank {boot.rank!r} of size "
                             f"{boot.size!r}")
    log.debug("bootstrap %s: PE %d of %d", spec.name, boot.rank, boot.size)
    return boot
