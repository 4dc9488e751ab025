"""Plugin discovery and load policy.

Plugins come only from entry points (groups :data:`GROUPS`), exactly as a third party's would.
``VKSHMEM_PLUGINS_ALLOW``/``VKSHMEM_PLUGINS_DENY`` filter them by entry point or distribution
name; a plugin that breaks is skipped with a warning unless ``VKSHMEM_PLUGINS_STRICT=1``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata

import pluggy

from ..bootstrap.base import BootstrapSpec
from ..config import Config
from ..domains.contract import DomainSpec
from ..errors import PluginError
from ..transports.contract import TransportSpec
from . import hookspecs
from .apiversion import check_api_version

__all__ = ["GROUPS", "RESERVED_DOMAINS", "LoadedPlugin", "PluginPolicy", "Registry",
           "entry_points_for", "fail", "load_plugins"]

GROUPS = ("vkshmem.bootstraps", "vkshmem.domains", "vkshmem.transports")
log = logging.getLogger("vkshmem")
#: domain names that are not plugins: the built-in host heap and the families users ask for
RESERVED_DOMAINS = frozenset({"host", "gpu", "auto"})


@dataclass
class LoadedPlugin:
    """One entry point and what became of it."""

    group: str
    name: str
    distribution: str
    version: str
    status: str  # "loaded", "denied", "not allowed", "failed: ..."
    provides: list[str] = field(default_factory=list)


@dataclass
class Registry:
    """Everything the plugins registered."""

    transports: dict[str, TransportSpec]
    bootstraps: dict[str, BootstrapSpec]
    plugins: list[LoadedPlugin]
    origin: dict[str, str]  # spec name -> distribution
    domains: dict[str, DomainSpec] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginPolicy:
    """``VKSHMEM_PLUGINS_ALLOW``/``_DENY``/``_STRICT`` as parsed (hashable: a cache key)."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    strict: bool = False

    @classmethod
    def of(cls, config: Config) -> PluginPolicy:
        return cls(tuple(config.plugins_allow), tuple(config.plugins_deny),
                   bool(config.plugins_strict))

    def refuses(self, names: set[str]) -> str | None:
        """Why an entry point known by ``names`` (its and its distribution's) is filtered out,
        or None when it may load."""
        if names & set(self.deny):
            return "denied (VKSHMEM_PLUGINS_DENY)"
        if self.allow and not names & set(self.allow):
            return "not allowed (VKSHMEM_PLUGINS_ALLOW)"
        return None


def entry_points_for(group: str, policy: PluginPolicy | Config, records: list[LoadedPlugin],
                     *, by_name: bool = False) -> Iterator[tuple[metadata.EntryPoint,
                                                                 LoadedPlugin]]:
    """The entry points of ``group`` that ``policy`` lets load (in discovery order, or sorted
    by entry-point name with ``by_name``), each with its record (status ``"loaded"``: the
    caller sets another when loading fails). Every entry point gets a record appended to
    ``records``; a filtered-out one only that, with the status saying why."""
    if not isinstance(policy, PluginPolicy):
        policy = PluginPolicy.of(policy)
    found = metadata.entry_points(group=group)
    for ep in sorted(found, key=lambda e: e.name) if by_name else found:
        dist = ep.dist.name if ep.dist is not None else "?"
        version = ep.dist.version if ep.dist is not None else "?"
        rec = LoadedPlugin(group, ep.name, dist, version, "loaded")
        records.append(rec)
        refused = policy.refuses({ep.name, dist})
        if refused:
            rec.status = refused
            continue
        yield ep, rec


def fail(strict: bool, message: str, *, stacklevel: int = 3) -> None:
    """A plugin broke (``message`` says how): PluginError under ``VKSHMEM_PLUGINS_STRICT=1``
    (raised from within an ``except`` block, it chains the cause), else a RuntimeWarning and
    the caller skips it (a third party's bug must not take the job down)."""
    if strict:
        raise PluginError(message + " (VKSHMEM_PLUGINS_STRICT=1 makes this an error)")
    warnings.warn(message + "; skipped (set VKSHMEM_PLUGINS_STRICT=1 to fail instead)",
                  RuntimeWarning, stacklevel=stacklevel)



def load_plugins(config: Config) -> Registry:
    """Discover, filter and load every plugin; collect the specs they register."""
    reg = Registry({}, {}, [], {}, {})
    policy = PluginPolicy.of(config)
    for group in GROUPS:
        for ep, rec in entry_points_for(group, policy, reg.plugins):
            _load_one(config, ep, rec, reg)
    return reg


def _load_one(config: Config, ep: metadata.EntryPoint, rec: LoadedPlugin, reg: Registry) -> None:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    found: list[object] = []
    try:
        module = ep.load()
        pm.register(module, name=f"{rec.distribution}:{ep.name}")
        pm.hook.register_transports(register=found.append)
        pm.hook.register_bootstraps(register=found.append)
        pm.hook.register_domains(register=found.append)
    except Exception as exc:  # a third party's bug must not take the job down
        rec.status = f"failed: {type(exc).__name__}: {exc}"
        fail(config.plugins_strict, f"plugin {ep.name!r} from {rec.distribution} failed to load: "
              f"{type(exc).__name__}: {exc}")
        return
    tables = {TransportSpec: ("transport", reg.transports),
              DomainSpec: ("memory domain", reg.domains)}
    for spec in found:
        if type(spec) in tables:
            what, table = tables[type(spec)]
            refused = check_api_version(spec.api_version)
            if refused:
                fail(config.plugins_strict,
                      f"{what} {spec.name!r} from {rec.distribution} {rec.version} is refused: "
                      f"{refused}")
                continue
        elif isinstance(spec, BootstrapSpec):
            table = reg.bootstraps
        else:
            fail(config.plugins_strict, f"plugin {ep.name!r} from {rec.distribution} registered "
                  f"{spec!r}, which is not a TransportSpec, DomainSpec or BootstrapSpec")
            continue
        if isinstance(spec, DomainSpec) and spec.name in RESERVED_DOMAINS:
            fail(config.plugins_strict, f"memory domain {spec.name!r} from "
                  f"{rec.distribution}: {', '.join(sorted(RESERVED_DOMAINS))} are reserved "
                  "names (the core's host heap and what users ask for)")
            continue
        if spec.name in table:
            fail(config.plugins_strict, f"{spec.name!r} from {rec.distribution} is already "
                  f"provided by {reg.origin[spec.name]}")
            continue
        table[spec.name] = spec
        reg.origin[spec.name] = rec.distribution
        rec.provides.append(spec.name)
        log.debug("plugin %s (%s) provides %s", ep.name, rec.distribution, spec.name)
