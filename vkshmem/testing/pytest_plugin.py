"""The pytest plugin of :mod:`vkshmem.testing`: options, fixtures, and the collected suites.

A plugin's repository loads it from its ``conftest.py`` (never through a ``pytest11`` entry
point, which would load it into every pytest session of every vkshmem user)::

    pytest_plugins = ["vkshmem.testing"]

and names what to check, on the command line or in its pytest configuration::

    pytest --vkshmem-transport=mynic [--vkshmem-transport-option=key=value ...]
    pytest --vkshmem-domain=mymem
    # pyproject.toml: [tool.pytest.ini_options] vkshmem_transport = "mynic"

or by defining the fixture ``vkshmem_transport`` (a
:class:`~vkshmem.testing.transport_suite.TransportUnderTest`) or ``vkshmem_domain`` (a
:class:`~vkshmem.testing.domain_suite.DomainUnderTest`) in that ``conftest.py``, e.g. to set
where the transport legitimately differs. Where the conftest.py is collected, the suites are
collected next to it as ``vkshmem_contract.py::TestTransportContract`` and
``::TestDomainContract`` (select with ``-k``, deselect with ``--deselect``). A name on the
command line that no installed plugin registers is a usage error.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from vkshmem.core.config import Config
from vkshmem.core.plugins.loader import load_plugins

from .domain_suite import DomainContract, DomainUnderTest
from .transport_suite import TransportContract, TransportUnderTest

__all__ = [
    "pytest_addoption",
    "pytest_collect_file",
    "pytest_sessionstart",
    "vkshmem_domain",
    "vkshmem_transport",
]

#: The name of the (virtual) module the suites are collected in, next to the conftest.py.
SUITE_MODULE = "vkshmem_contract"

_SUITES: dict[str, tuple[str, type]] = {  # what -> (the collected class, its base)
    "transport": ("TestTransportContract", TransportContract),
    "domain": ("TestDomainContract", DomainContract),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--vkshmem-transport``, ``--vkshmem-transport-option``, ``--vkshmem-domain`` and
    their ini keys."""
    group = parser.getgroup("vkshmem", "vkshmem plugin contract (vkshmem.testing)")
    group.addoption("--vkshmem-transport", metavar="NAME", default=None,
                    help="run the transport contract against registered transport NAME")
    group.addoption("--vkshmem-transport-option", metavar="KEY=VALUE", action="append",
                    default=[], help="a rail option of the transport under test (repeatable)")
    group.addoption("--vkshmem-domain", metavar="NAME", default=None,
                    help="run the memory-domain contract against registered domain NAME")
    parser.addini("vkshmem_transport", "the transport the contract checks (as "
                  "--vkshmem-transport)", default="")
    parser.addini("vkshmem_domain", "the memory domain the contract checks (as "
                  "--vkshmem-domain)", default="")


def _named(config: pytest.Config, what: str) -> str | None:
    """The transport or domain named by the option or the ini key (None: neither)."""
    value = config.getoption(f"--vkshmem-{what}") or config.getini(f"vkshmem_{what}")
    return str(value).strip() or None


def _options(config: pytest.Config) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in config.getoption("--vkshmem-transport-option"):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise pytest.UsageError(f"--vkshmem-transport-option {item!r}: expected KEY=VALUE")
        options[key] = value
    return options


def pytest_sessionstart(session: pytest.Session) -> None:
    """A transport or domain named on the command line (or ini) that is not registered is a
    usage error, said once, rather than an error of every contract test."""
    named = {what: _named(session.config, what) for what in _SUITES}
    if not any(named.values()):
        return
    reg = load_plugins(Config({}))
    for what, found in (("transport", reg.transports), ("domain", reg.domains)):
        name = named[what]
        if name and name not in found:
            raise pytest.UsageError(
                f"--vkshmem-{what}={name}: no {what} {name!r} is registered (registered: "
                f"{', '.join(sorted(found)) or 'none'}); is its plugin installed here?")


def _lookup(factory: Any, name: str) -> Any:
    try:
        return factory(name)
    except LookupError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def vkshmem_transport(request: pytest.FixtureRequest) -> TransportUnderTest:
    """The transport under test: ``--vkshmem-transport`` (or ini ``vkshmem_transport``) as
    registered, with the ``--vkshmem-transport-option`` rail options. Override it in a
    conftest.py to set the fields of :class:`TransportUnderTest`."""
    name = _named(request.config, "transport")
    if name is None:
        pytest.skip("no transport under test: pass --vkshmem-transport=NAME or define the "
                    "vkshmem_transport fixture")
    options = _options(request.config)
    return _lookup(lambda n: TransportUnderTest.from_registry(n, options=options), name)


@pytest.fixture
def vkshmem_domain(request: pytest.FixtureRequest) -> DomainUnderTest:
    """The memory domain under test: ``--vkshmem-domain`` (or ini ``vkshmem_domain``) as
    registered. Override it in a conftest.py to set the fields of :class:`DomainUnderTest`."""
    name = _named(request.config, "domain")
    if name is None:
        pytest.skip("no memory domain under test: pass --vkshmem-domain=NAME or define the "
                    "vkshmem_domain fixture")
    return _lookup(DomainUnderTest.from_registry, name)


class ContractModule(pytest.Module):
    """The suites a conftest.py asked for, collected as a module next to it."""

    suites: tuple[str, ...] = ()

    def _getobj(self) -> types.ModuleType:
        mod = types.ModuleType(SUITE_MODULE, "The vkshmem.testing contract suites.")
        for what in self.suites:
            name, base = _SUITES[what]
            setattr(mod, name, type(name, (base,), {"__module__": SUITE_MODULE,
                                                    "__doc__": base.__doc__}))
        return mod

    def istestclass(self, obj: object, name: str) -> bool:
        return isinstance(obj, type) and obj.__module__ == SUITE_MODULE


def _loads_us(config: pytest.Config, path: Path) -> types.ModuleType | None:
    """The conftest module at ``path`` if it names this plugin in ``pytest_plugins``."""
    for plugin in config.pluginmanager.get_plugins():
        if not isinstance(plugin, types.ModuleType) or not getattr(plugin, "__file__", None):
            continue
        if Path(plugin.__file__).resolve() != path.resolve():
            continue
        names = getattr(plugin, "pytest_plugins", ())
        names = [names] if isinstance(names, str) else list(names)
        return plugin if __package__ in names else None
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Next to the conftest.py that loads this plugin: the suites it names (an option, an ini
    key, or its own ``vkshmem_transport`` / ``vkshmem_domain`` fixture)."""
    if file_path.name != "conftest.py":
        return None
    conftest = _loads_us(parent.config, file_path)
    if conftest is None:
        return None
    suites = tuple(what for what in _SUITES
                   if _named(parent.config, what) or hasattr(conftest, f"vkshmem_{what}"))
    if not suites:
        return None
    module = ContractModule.from_parent(parent, path=file_path.with_name(f"{SUITE_MODULE}.py"))
    module.suites = suites
    return module
