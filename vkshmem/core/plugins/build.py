"""Helpers for the build scripts of native plugins (re-exported by :mod:`vkshmem.plugin`).

A plugin's cffi build script (API mode) reads its declarations from its own C header and
finds the library it binds under an installation prefix::

    from vkshmem.plugin import get_include, header_cdef, locate_library, plugin_cdef

    found = locate_library("libfabric", "fabric", "rdma/fabric.h", prefix_var="MY_PREFIX",
                           hint="apt-get install libfabric-dev")
    ffibuilder.cdef(plugin_cdef() + header_cdef(CSRC / "mine.h", constants=("MINE_",)))
    ffibuilder.set_source("mine._mine", source,
                          include_dirs=[str(CSRC), get_include(), str(found.include)],
                          library_dirs=[str(found.lib)], libraries=["fabric"],
                          extra_link_args=found.link_args())

Nothing here imports cffi or the rest of vkshmem (only the standard library). A plugin builds
against an installed vkshmem: vkshmem is among its build requirements, and the in-tree plugins
are installed with ``--no-build-isolation`` after vkshmem (they compile against its header and
import these helpers from :mod:`vkshmem.plugin`).
"""

from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FoundLibrary", "header_cdef", "include_dir", "locate_library", "plugin_cdef",
           "plugin_header"]

#: library directories the dynamic linker searches anyway (no rpath needed for them)
DEFAULT_LIB_DIRS = frozenset({"/lib", "/usr/lib", "/lib64", "/usr/lib64"})


def include_dir() -> str:
    """The folder to put on a native plugin's include path: it holds ``vkshmem/plugin.h``
    (``vkshmem.plugin.get_include`` is this function)."""
    return str(Path(__file__).resolve().parents[2] / "include")


def plugin_header() -> Path:
    """The path of the shipped ``vkshmem/plugin.h``."""
    return Path(include_dir()) / "vkshmem" / "plugin.h"


def header_cdef(path: str | Path, constants: tuple[str, ...] | None = None) -> str:
    """The declarations of C header ``path`` as cffi's ``cdef`` takes them.

    Comments, ``#include`` lines, include guards and other preprocessor lines are dropped; an
    integer ``#define NAME value`` becomes ``#define NAME ...`` (the compiler fills in the
    value) when ``NAME`` starts with one of ``constants`` (every one when ``None``); a struct
    forward declaration ``struct s;`` becomes a struct of unknown layout (cffi learns it when
    compiling). Function-like macros and defines of other names are left out."""
    text = re.sub(r"/\*.*?\*/", "", Path(path).read_text(), flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            m = re.match(r"#\s*define\s+(\w+)\s+\S", stripped)
            if m and not m[1].endswith("_H") and (
                    constants is None or m[1].startswith(tuple(constants))):
                out.append(f"#define {m[1]} ...")
            continue
        if m := re.fullmatch(r"struct (\w+);", stripped):
            out.append(f"struct {m[1]} {{ ...; }};")
            continue
        out.append(line)
    return "\n".join(out)


def plugin_cdef() -> str:
    """The cdef of ``vkshmem/plugin.h`` (its structs, ``vk_amo_fn``, the AMO op codes and every
    ``VK_ST_*``/``VK_NATIVE_*`` constant): with it in its cdef, a plugin's cffi module has
    ``ffi.new("struct vk_native_ops *")`` and the codes as ``lib.VK_ST_*``. The plugin's own
    header includes ``<vkshmem/plugin.h>`` (which :func:`header_cdef` of it drops)."""
    return header_cdef(plugin_header())


@dataclass(frozen=True)
class FoundLibrary:
    """Where :func:`locate_library` found a library's development files."""

    prefix: Path
    include: Path
    lib: Path
    #: the library directory when the dynamic linker does not search it by default
    rpaths: list[str] = field(default_factory=list)

    def link_args(self, extra_rpaths: list[str] | tuple[str, ...] = ()) -> list[str]:
        """Linker arguments: an rpath for each of ``extra_rpaths`` and :attr:`rpaths` (as
        DT_RPATH, not RUNPATH: the library built against wins over LD_LIBRARY_PATH)."""
        seen: list[str] = []
        for r in [*extra_rpaths, *self.rpaths]:
            if r not in seen:
                seen.append(r)
        return ["-Wl,--disable-new-dtags"] + [f"-Wl,-rpath,{r}" for r in seen]


def library_dirs(prefix: Path) -> list[Path]:
    """Where a library lives under ``prefix``: ``lib/<multiarch>``, ``lib64``, ``lib``."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [prefix / "lib" / multiarch] if multiarch else []
    return [*dirs, prefix / "lib64", prefix / "lib"]


def locate_library(what: str, library: str, header: str, *, prefix: str | Path | None = None,
                   prefix_var: str | None = None, default_prefix: str = "/usr",
                   hint: str = "") -> FoundLibrary:
    """Find library ``lib<library>.so`` and ``<prefix>/include/<header>`` under one prefix.

    The prefix is ``prefix``, else the environment variable ``prefix_var`` (when set and not
    empty), else ``default_prefix``. The library is looked for in ``lib/<multiarch>``,
    ``lib64`` and ``lib`` of it; an rpath is given (:attr:`FoundLibrary.rpaths`) unless it is
    a directory the dynamic linker searches anyway. Raises :class:`RuntimeError` naming
    ``what``, what was looked for, and ``hint`` (how to install it) when either is missing."""
    if prefix is None:
        prefix = (os.environ.get(prefix_var, "").strip() if prefix_var else "") or default_prefix
    root = Path(prefix).expanduser()
    include = root / "include"
    dirs = library_dirs(root)
    found = [d for d in dirs if (d / f"lib{library}.so").exists()]
    if not (include / header).is_file() or not found:
        source = f"{prefix_var}={prefix}" if prefix_var and os.environ.get(prefix_var) else \
            str(root)
        raise RuntimeError(
            f"{what}: {source} holds no development files of lib{library} (need "
            f"{include / header} and lib{library}.so in one of "
            f"{', '.join(map(str, dirs))})" + (f"; {hint}" if hint else ""))
    lib = found[0]
    default = str(lib) in DEFAULT_LIB_DIRS or str(lib.parent) in DEFAULT_LIB_DIRS
    return FoundLibrary(root, include, lib, [] if default else [str(lib)])
