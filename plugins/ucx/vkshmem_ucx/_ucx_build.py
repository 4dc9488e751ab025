"""cffi (API mode) build of ``vkshmem_ucx._ucx``, the UCX binding and its progress thread.

The C source lives in ``csrc/vku*.c`` (one translation unit, see ``SOURCES``). Which UCX it
compiles and links against is chosen by the environment variable ``VKSHMEM_UCX_PREFIX`` at
build time:

* unset or ``wheel`` (the default): the UCX of the ``libucx-cu12`` wheel (a build requirement,
  so an isolated ``pip install`` has it). The module gets an rpath to the wheel's ``lib``
  directory where it will be installed (next to this package in site-packages, and the
  environment's own site-packages), so it loads without ``LD_LIBRARY_PATH``; as a last resort
  the package preloads the libraries through ``libucx.load_library()``.
* a directory (``/usr`` for Debian's ``libucx-dev``, ``/opt/ucx`` for a site build with verbs):
  ``<prefix>/include/ucp/api/ucp.h`` and ``libucp.so`` from ``<prefix>/lib/<multiarch>``,
  ``<prefix>/lib64`` or ``<prefix>/lib`` (with an rpath unless it is a default library dir).
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from pathlib import Path

from cffi import FFI

# vkshmem is a build requirement (pyproject.toml): the plugin compiles against its header
from vkshmem.plugin import FoundLibrary, get_include, header_cdef, locate_library, plugin_cdef

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
PREFIX_VAR = "VKSHMEM_UCX_PREFIX"

# vku_built_with is generated below, with the UCX this build found
CDEF = (plugin_cdef() + "\n" + header_cdef(CSRC / "vku.h", constants=("VKU_",))
        + "\nconst char *vku_built_with(void);\n")


def _wheel_root() -> Path:
    spec = importlib.util.find_spec("libucx")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "vkshmem-ucx: the UCX wheel is not installed where the build runs: "
            "`pip install libucx-cu12` (then `pip install --no-build-isolation plugins/ucx`), "
            f"or set {PREFIX_VAR}=/usr to build against Debian's UCX "
            f"(`apt-get install libucx-dev`) or {PREFIX_VAR}=<prefix> for a site build"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def locate_ucx() -> tuple[Path, Path, list[str], str]:
    """(include dir, library dir, link arguments, description) of the UCX to build against."""
    choice = os.environ.get(PREFIX_VAR, "").strip() or "wheel"
    if choice == "wheel":
        root = _wheel_root()
        lib = root / "lib"
        rpaths = ["$ORIGIN/../libucx/lib",  # installed next to this package in site-packages
                  str(Path(sysconfig.get_paths()["purelib"]) / "libucx" / "lib")]
        if "pip-build-env" not in str(lib):  # not a throw-away isolated build environment
            rpaths.append(str(lib))
        found = FoundLibrary(root, root / "include", lib)
        return found.include, found.lib, found.link_args(rpaths), "the libucx-cu12 wheel"
    found = locate_library("vkshmem-ucx", "ucp", "ucp/api/ucp.h", prefix_var=PREFIX_VAR,
                           hint="on Debian: apt-get install libucx-dev")
    return found.include, found.lib, found.link_args(), f"the UCX in {found.prefix}"


INCLUDE, LIBDIR, LINK_ARGS, BUILT_WITH = locate_ucx()
#: the helper's C, one translation unit (statics are shared), in this order
SOURCES = ("vku.c", "vku_ctx.c", "vku_worker.c", "vku_ops.c", "vku_native.c")

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "vkshmem_ucx._ucx",
    "\n".join((CSRC / part).read_text() for part in SOURCES)
    + f'\nconst char *vku_built_with(void) {{ return "{BUILT_WITH}"; }}\n',
    include_dirs=[str(CSRC), get_include(), str(INCLUDE)],
    library_dirs=[str(LIBDIR)],
    libraries=["ucp", "ucs", "pthread"],
    # -Wno-sign-compare: UCX's own headers (UCS_PTR_IS_ERR) trip it.
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-sign-compare"],
    # DT_RPATH (not RUNPATH): the UCX built against wins over a stray LD_LIBRARY_PATH.
    extra_link_args=LINK_ARGS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
