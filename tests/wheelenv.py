"""Fresh virtual environments for the tests that install vkshmem from built wheels
(test_plugin_kit_wheel.py, test_dist.py), offline.

A new environment reaches the third-party distributions it needs (numpy, cffi, ...) through
links to this environment's installed copies: only those distributions and what they require,
so that nothing else of this environment, and not the source tree, is visible there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: this process's environment, less what would point a child at this environment or tree
_DROPPED = ("PYTHON", "VIRTUAL_ENV", "PIP_", "VKSHMEM_", "UCX_", "FI_", "LD_", "CC", "CFLAGS",
            "LDFLAGS", "CPPFLAGS")


def run(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``, which must succeed; its completed process."""
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=env)
    line = " ".join(map(str, cmd))
    assert r.returncode == 0, f"{line}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def link_distributions(names: list[str], dest: Path) -> list[str]:
    """Links in ``dest`` to the installed files (packages and ``.dist-info``) of ``names`` and
    of what they require; the distributions linked."""
    from importlib import metadata

    dest.mkdir(exist_ok=True)
    seen: list[str] = []
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.append(name)
        dist = metadata.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        site = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            if top.endswith(".pth") or top == "__pycache__" or (dest / top).exists():
                continue
            if (site / top).exists():
                (dest / top).symlink_to(site / top)
    return seen


def make_venv(path: Path) -> tuple[Path, Path]:
    """A new virtual environment without pip (``pip --python`` installs into it): its python
    and its site-packages."""
    run([sys.executable, "-m", "venv", "--without-pip", str(path)], path.parent, 120)
    python = path / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    path.parent, 60).stdout.strip())
    return python, site


def clean_env(path: str) -> dict[str, str]:
    """This process's environment with ``PATH`` set to ``path``, less the variables that would
    lead a child to this environment, this tree, a compiler's settings or a transport's
    tuning."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env["PATH"] = path
    return env


def pip_install(python: Path) -> list[str]:
    """The command that installs into the environment of ``python`` with this environment's
    pip, offline."""
    return [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
            "--no-index", "--disable-pip-version-check"]
