"""Multi-PE runs for the contract suites: a script under the project's launcher.

``vkshmem run -n N script.py`` (``python -m vkshmem run``) starts ``N`` PEs of one job on this
node; :func:`run_pes` runs it with an outer timeout and returns what it printed, and
:func:`check_pes` asserts every PE said ``<name> ok``. The suites' own PE scripts are in
``vkshmem/testing/pe`` (:func:`pe_script`); a plugin's tests may run their own scripts too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["PE_DIR", "check_pes", "pe_script", "run_pes"]

#: The PE scripts of the contract suites.
PE_DIR = Path(__file__).resolve().parent / "pe"

#: What every run gets unless ``env`` says otherwise: a small heap, bounded waits.
BASE_ENV = {"VKSHMEM_SYMMETRIC_SIZE": "64M", "VKSHMEM_WAIT_TIMEOUT": "60"}


def pe_script(name: str) -> Path:
    """The path of the suites' PE script ``name`` (``transport_job``, ``domain_job``)."""
    path = PE_DIR / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no PE script {name!r} in {PE_DIR}")
    return path


def run_pes(script: str | os.PathLike[str], npes: int, env: Mapping[str, str] | None = None,
            timeout: int = 120, args: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``npes`` PEs with ``vkshmem run`` (this interpreter), with ``env``
    on top of this process's environment; the launcher's ``--timeout`` is ``timeout`` and the
    whole run is killed ``timeout + 30`` seconds after it started."""
    full_env = {**os.environ, **BASE_ENV, **(env or {})}
    cmd = [sys.executable, "-m", "vkshmem", "run", "-n", str(npes), "--timeout", str(timeout),
           str(script), *args]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True,
                          timeout=timeout + 30)


def check_pes(r: subprocess.CompletedProcess[str], name: str, npes: int) -> None:
    """The run exited 0 and each of its ``npes`` PEs printed ``<name> ok``."""
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count(f"{name} ok") == npes, f"{r.stdout}\n{r.stderr}"
