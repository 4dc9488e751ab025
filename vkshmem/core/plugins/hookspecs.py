"""The hooks a vkshmem plugin can implement.

A plugin is a module (or object) exposed through an entry point in the group
``vkshmem.transports`` (transports), ``vkshmem.bootstraps`` (bootstraps) or
``vkshmem.domains`` (memory domains, :mod:`vkshmem.core.domains.contract`), with functions
decorated by :data:`hookimpl` (plugin authors import it from :mod:`vkshmem.plugin`)::

    from vkshmem.plugin import TransportSpec, hookimpl

    @hookimpl
    def register_transports(register):
        register(TransportSpec(name="mynic", factory=MyNicTransport, priority=50))

The core loads plugins once, at ``init``. A plugin that fails to import or raises here is
skipped with a warning (``VKSHMEM_PLUGINS_STRICT=1`` makes that an error).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

__all__ = ["PROJECT", "hookimpl", "hookspec", "register_bootstraps", "register_domains",
           "register_transports"]

PROJECT = "vkshmem"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_transports(register: Callable[[Any], None]) -> None:
    """Call ``register(TransportSpec(...))`` once for each transport this plugin offers."""


@hookspec
def register_bootstraps(register: Callable[[Any], None]) -> None:
    """Call ``register(BootstrapSpec(...))`` once for each bootstrap this plugin offers."""


@hookspec
def register_domains(register: Callable[[Any], None]) -> None:
    """Call ``register(DomainSpec(...))`` once for each memory domain this plugin offers."""
