"""vkshmem.testing: the transport and memory-domain contracts, for any plugin's repository.

A third party checks its plugin against the same contract as the in-tree ones, from its own
repository, with vkshmem (and pytest) installed. In its ``conftest.py``::

    pytest_plugins = ["vkshmem.testing"]

then ``pytest --vkshmem-transport=NAME`` (or ``--vkshmem-domain=NAME``, or the ini keys
``vkshmem_transport`` / ``vkshmem_domain``, or a ``vkshmem_transport`` / ``vkshmem_domain``
fixture defined in that conftest.py) collects the contract suites next to it:
:class:`TransportContract` (in one process, then PE jobs of 1, 2 and 4 PEs under
``vkshmem run``) and :class:`DomainContract` (PE jobs over the shm path and over transports).
No ``pytest11`` entry point: the plugin loads only where a conftest.py asks for it.

A test module may instead subclass a suite (``class TestMine(TransportContract)``) with its
own ``vkshmem_transport`` fixture, and a plugin's own tests may use the pieces: :class:`Job`
(a few PEs' transports opened in one process), :class:`Segment`, :func:`context`, the checks of
:mod:`vkshmem.testing.transport` (AMOs: :mod:`vkshmem.testing.amo`) and :func:`run_pes`.
"""

from __future__ import annotations

from .domain_suite import DOMAIN_MODES, DomainContract, DomainUnderTest
from .job import Job, context
from .launch import check_pes, pe_script, run_pes
from .pytest_plugin import (
    pytest_addoption,
    pytest_collect_file,
    pytest_sessionstart,
    vkshmem_domain,
    vkshmem_transport,
)
from .segments import Segment
from .transport_suite import TransportContract, TransportUnderTest

__all__ = [
    "DOMAIN_MODES",
    "DomainContract",
    "DomainUnderTest",
    "Job",
    "Segment",
    "TransportContract",
    "TransportUnderTest",
    "check_pes",
    "context",
    "pe_script",
    "pytest_addoption",
    "pytest_collect_file",
    "pytest_sessionstart",
    "run_pes",
    "vkshmem_domain",
    "vkshmem_transport",
]
