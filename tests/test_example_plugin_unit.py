"""The out-of-tree example transport (examples/example-transport) in one process, in-tree.

Its own tests (``examples/example-transport/tests``, as its repository would run them against
an installed vkshmem: ``tests/test_plugin_kit_wheel.py`` does) are collected here too, and the
transport contract of :mod:`vkshmem.testing` runs on it through a subclass that hands it the
spec imported from the folder. The example is not installed here, so the contract's PE jobs
(which find transports through entry points) are skipped; ``tests/test_plugins.py`` installs
it and runs PE jobs over it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from vkshmem.testing import TransportContract, TransportUnderTest

# Pure Python: imported from its folder, with its own tests.
EXAMPLE = Path(__file__).parent.parent / "examples" / "example-transport"
sys.path[:0] = [str(EXAMPLE), str(EXAMPLE / "tests")]
from test_example_transport import (  # noqa: E402, F401 - its own tests, collected here
    test_reaches_only_peers_of_its_node,
    test_stats_file_counts_operations,
    test_unknown_rail_options_are_a_config_error,
)
from vkshmem_example_transport import SPEC  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class TestExampleTransportContract(TransportContract):
    """The transport contract on the example transport (no progress thread)."""

    @pytest.fixture
    def vkshmem_transport(self) -> TransportUnderTest:
        return TransportUnderTest(SPEC, progress_threads=0)


def test_the_examples_import_only_the_plugin_kit_and_the_api() -> None:
    """Both examples, code and tests, reach vkshmem only through ``vkshmem.plugin``,
    ``vkshmem.testing`` and the public API (``vkshmem.shmem``), as a third party's would."""
    allowed = {"vkshmem.plugin", "vkshmem.testing", "vkshmem.shmem"}
    files = [path for name in ("example-transport", "example-domain")
             for path in (EXAMPLE.parent / name).rglob("*.py")
             if not {"build", ".eggs"} & set(path.parts)]
    assert len(files) >= 6, files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = ([f"vkshmem.{alias.name}" for alias in node.names]
                         if node.module == "vkshmem" else [node.module])
            else:
                continue
            for name in names:
                if name.split(".")[0] == "vkshmem":
                    assert ".".join(name.split(".")[:2]) in allowed, \
                        f"{path}:{node.lineno} imports {name}"
