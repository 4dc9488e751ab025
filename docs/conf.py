"""Sphinx configuration of the vkshmem site: ``bash scripts/docs.sh`` builds it (warnings are
errors). Pages are MyST Markdown; docs/_ext/vkshmem_docs.py generates the reference pages that
come from the code (variables, CLI) and the performance tables (benchmarks/results/*.json)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))
# Importing vkshmem.shmem must not start a job while autodoc reads it.
os.environ["VKSHMEM_AUTO_INIT"] = "0"

from vkshmem import __version__  # noqa: E402

project = "vkshmem"
author = "the vkshmem authors"
copyright = "the vkshmem authors; Boost Software License 1.0"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "vkshmem_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_generated", "_ext", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": False}
autodoc_mock_imports: list[str] = []

html_theme = "furo"
html_title = f"vkshmem {release}"
html_static_path: list[str] = []
html_theme_options = {"navigation_with_keys": True}
