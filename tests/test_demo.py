"""The README's main job (examples/demo.py) runs and checks itself at 1 and 4 PEs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).parent.parent / "examples" / "demo.py"


@pytest.mark.parametrize("npes", [1, 4])
def test_demo(npes: int) -> None:
    env = {**os.environ, "VKSHMEM_SYMMETRIC_SIZE": "64M", "VKSHMEM_GPU_SYMMETRIC_SIZE": "64M",
           "VKSHMEM_GPU_VALIDATION": "1", "VKSHMEM_WAIT_TIMEOUT": "60"}
    r = subprocess.run([sys.executable, "-m", "vkshmem", "run", "-n", str(npes), "--timeout",
                        "120", str(DEMO)], env=env, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("tickets distinct across PEs: True") == npes, r.stdout
    assert r.stdout.count("GPU inbox") == npes, r.stdout
    assert f"GPU counter = {3 * npes} (expected {3 * npes})" in r.stdout, r.stdout
