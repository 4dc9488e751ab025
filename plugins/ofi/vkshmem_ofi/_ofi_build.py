"""cffi (API mode) build of ``vkshmem_ofi._ofi``, the libfabric binding and its progress thread.

The C source is ``csrc/vko.c`` (which includes ``vko_setup.c``, ``vko_query.c`` and
``vko_data.c``). The data path of libfabric (``fi_writemsg``, ``fi_atomicmsg``, ...) is static
inline in its headers, so the binding must be compiled (API mode); ABI mode could not call it.

``VKSHMEM_OFI_PREFIX`` chooses the libfabric at build time: unset or ``/usr`` for Debian's
``libfabric-dev`` (1.17 on Debian 12), or a site prefix holding ``include/rdma/fabric.h`` and
``libfabric.so`` in ``lib/<multiarch>``, ``lib64`` or ``lib`` (an rpath is added). The dma-buf
registration path is compiled only where the headers define ``FI_MR_DMABUF`` (libfabric 1.20+).
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
PREFIX_VAR = "VKSHMEM_OFI_PREFIX"
_DEFAULT_LIB_DIRS = {"/lib", "/usr/lib", "/lib64", "/usr/lib64"}


def _cdef(header: Path) -> str:
    """The cdef, from the header itself: preprocessor lines dropped, integer ``#define VKO_*``
    constants left for the compiler to fill in."""
    out = []
    for line in header.read_text().splitlines():
        words = line.split()
        if line.startswith("#define VKO_") and len(words) >= 3:
            out.append(f"#define {words[1]} ...")
        elif not line.startswith("#"):
            out.append(line)
    return "\n".join(out)


def locate_libfabric() -> tuple[Path, Path, list[str], str]:
    """(include dir, library dir, rpaths, description) of the libfabric to build against."""
    prefix = Path(os.environ.get(PREFIX_VAR, "").strip() or "/usr").expanduser()
    include = prefix / "include"
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [prefix / "lib" / multiarch] if multiarch else []
    dirs += [prefix / "lib64", prefix / "lib"]
    found = [d for d in dirs if (d / "libfabric.so").exists()]
    if not (include / "rdma" / "fabric.h").is_file() or not found:
        raise RuntimeError(
            f"vkshmem-ofi: {PREFIX_VAR}={prefix} holds no libfabric development files (need "
            f"{include}/rdma/fabric.h and libfabric.so in one of "
            f"{', '.join(map(str, dirs))}); on Debian: apt-get install libfabric-dev")
    lib = found[0]
    default = str(lib) in _DEFAULT_LIB_DIRS or str(lib.parent) in _DEFAULT_LIB_DIRS
    return include, lib, [] if default else [str(lib)], f"the libfabric in {prefix}"


INCLUDE, LIBDIR, RPATHS, BUILT_WITH = locate_libfabric()
CDEF = _cdef(CSRC / "vko.h") + "\nconst char *vko_built_with(void);\n"

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "vkshmem_ofi._ofi",
    (CSRC / "vko.c").read_text()
    + f'\nconst char *vko_built_with(void) {{ return "{BUILT_WITH}"; }}\n',
    include_dirs=[str(CSRC), str(INCLUDE)],
    library_dirs=[str(LIBDIR)],
    libraries=["fabric", "pthread"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-Wl,--disable-new-dtags"] + [f"-Wl,-rpath,{r}" for r in RPATHS],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
