"""What is the example transport's own: its rail options, same-node reach, its counters.

Two transports are opened by hand in one process as PE 0 and PE 1 of a two-PE job
(:class:`vkshmem.testing.Job`), each with a memfd-backed segment; PE 1's segment is reached
through ``/proc/<pid>/fd/<fd>`` as a peer process's would be. The transport contract itself is
collected from ``conftest.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vkshmem_example_transport import ExampleTransport

from vkshmem.plugin import AmoOp, ConfigError, PeerInfo
from vkshmem.testing import Job, context


def test_unknown_rail_options_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"VKSHMEM_RAIL0.*unknown option\(s\) nope"):
        ExampleTransport(context(0, 2, options={"nope": "1"}))


def test_reaches_only_peers_of_its_node() -> None:
    tr = ExampleTransport(context(0, 2))
    try:
        assert tr.reaches(PeerInfo(1, "node0", True, b"{}", {}))
        assert not tr.reaches(PeerInfo(1, "node1", False, b"{}", {}))
        assert not tr.reaches(PeerInfo(1, "node0", True, None, {}))
    finally:
        tr.close()


def test_stats_file_counts_operations(tmp_path: Path) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    job = Job.of(ExampleTransport, {"stats": str(tmp_path / "counts")}, {0: 4096})()
    job.t[0][0].put(1, 0, 0, memoryview(b"x"))
    job.t[0][0].put(1, 0, 1, memoryview(b"y"))
    job.t[0][0].get(1, 0, 0, memoryview(bytearray(2)))
    job.t[0][1].amo(0, 0, 0, AmoOp.ADD, 8, 1, 0, True)
    job.close()
    job.t[0][0].close()  # a second close is a no-op
    assert json.loads((tmp_path / "counts.0").read_text()) == {"puts": 2, "gets": 1, "amos": 0}
    assert json.loads((tmp_path / "counts.1").read_text()) == {"puts": 0, "gets": 0, "amos": 1}
    assert len(os.listdir("/proc/self/fd")) == fds
