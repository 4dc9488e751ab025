"""Text for the generated Markdown pages (used by :mod:`vkshmem_docs` and :mod:`vkshmem_perf`)."""

from __future__ import annotations


def md(text: str) -> str:
    """Plain text (a docstring of the registry, a benchmark's setting) made safe for Markdown."""
    return (text.replace("\\", "\\\\").replace("*", "\\*").replace("<", "\\<")
            .replace("|", "\\|").replace("_", "\\_"))
