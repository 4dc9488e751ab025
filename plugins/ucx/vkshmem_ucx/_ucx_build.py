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

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
PREFIX_VAR = "VKSHMEM_UCX_PREFIX"
_DEFAULT_LIB_DIRS = {"/lib", "/usr/lib", "/lib64", "/usr/lib64"}

def _cdef(header: Path) -> str:
    """The cdef, from the header itself (one place for the interface): preprocessor lines
    dropped, integer ``#define VKU_*`` constants left for the compiler to fill in."""
    out = []
    for line in header.read_text().splitlines():
        words = line.split()
        if line.startswith("#define VKU_") and len(words) >= 3:
            out.append(f"#define {words[1]} ...")
        elif not line.startswith("#"):
            out.append(line)
    return "\n".join(out)


# vku_built_with is generated below, with the UCX this build found
CDEF = _cdef(CSRC / "vku.h") + "\nconst char *vku_built_with(void);\n"


def _wheel_root() -> Path:
    spec = importlib.util.find_spec("libucx")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "vkshmem-ucx: the UCX wheel is not installed where the build runs: "
            "`pip install libucx-cu12` (an isolated `pip install plugins/ucx` installs it by "
            f"itself), or set {PREFIX_VAR}=/usr to build against Debian's UCX "
            "(`apt-get install libucx-dev`) or {PREFIX_VAR}=<prefix> for a site build"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def locate_ucx() -> tuple[Path, Path, list[str], str]:
    """(include dir, library dir, rpaths, description) of the UCX to build against."""
    choice = os.environ.get(PREFIX_VAR, "").strip() or "wheel"
    if choice == "wheel":
        root = _wheel_root()
        include, lib = root / "include", root / "lib"
        rpaths = ["$ORIGIN/../libucx/lib",  # installed next to this package in site-packages
                  str(Path(sysconfig.get_paths()["purelib"]) / "libucx" / "lib")]
        if "pip-build-env" not in str(lib):  # not a throw-away isolated build environment
            rpaths.append(str(lib))
        what = "the libucx-cu12 wheel"
    else:
        prefix = Path(choice).expanduser()
        include = prefix / "include"
        multiarch = sysconfig.get_config_var("MULTIARCH") or ""
        dirs = [prefix / "lib" / multiarch] if multiarch else []
        dirs += [prefix / "lib64", prefix / "lib"]
        found = [d for d in dirs if (d / "libucp.so").exists()]
        if not (include / "ucp" / "api" / "ucp.h").is_file() or not found:
            raise RuntimeError(
                f"vkshmem-ucx: {PREFIX_VAR}={choice} holds no UCX development files "
                f"(need {include}/ucp/api/ucp.h and libucp.so in one of "
                f"{', '.join(map(str, dirs))}); on Debian: apt-get install libucx-dev"
            )
        lib = found[0]
        default = str(lib) in _DEFAULT_LIB_DIRS or (multiarch and lib.name == multiarch
                                                    and str(lib.parent) in _DEFAULT_LIB_DIRS)
        rpaths = [] if default else [str(lib)]
        what = f"the UCX in {prefix}"
    seen: list[str] = []
    for r in rpaths:
        if r not in seen:
            seen.append(r)
    return include, lib, seen, what


INCLUDE, LIBDIR, RPATHS, BUILT_WITH = locate_ucx()
#: the helper's C, one translation unit (statics are shared), in this order
SOURCES = ("vku.c", "vku_ctx.c", "vku_worker.c", "vku_ops.c", "vku_native.c")

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "vkshmem_ucx._ucx",
    "\n".join((CSRC / part).read_text() for part in SOURCES)
    + f'\nconst char *vku_built_with(void) {{ return "{BUILT_WITH}"; }}\n',
    include_dirs=[str(CSRC), str(INCLUDE)],
    library_dirs=[str(LIBDIR)],
    libraries=["ucp", "ucs", "pthread"],
    # -Wno-sign-compare: UCX's own headers (UCS_PTR_IS_ERR) trip it.
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-sign-compare"],
    # DT_RPATH (not RUNPATH): the UCX built against wins over a stray LD_LIBRARY_PATH.
    extra_link_args=["-Wl,--disable-new-dtags"] + [f"-Wl,-rpath,{r}" for r in RPATHS],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
