"""cffi (API mode) build of ``vkshmem_ofi._ofi``, the libfabric binding and its progress thread.

The C source is ``csrc/vko.c`` (which includes ``vko_setup.c``, ``vko_query.c`` and
``vko_data.c``). The data path of libfabric (``fi_writemsg``, ``fi_atomicmsg``, ...) is static
inline in its headers, so the binding must be compiled (API mode); ABI mode could not call it.

The cdef is read from ``csrc/vko.h`` and vkshmem's ``vkshmem/plugin.h`` (the plugin kit's
``header_cdef``/``plugin_cdef``); the libfabric is found by the kit's ``locate_library``.
``VKSHMEM_OFI_PREFIX`` chooses the libfabric at build time: unset or ``/usr`` for Debian's
``libfabric-dev`` (1.17 on Debian 12), or a site prefix holding ``include/rdma/fabric.h`` and
``libfabric.so`` in ``lib/<multiarch>``, ``lib64`` or ``lib`` (an rpath is added). The dma-buf
registration path is compiled only where the headers define ``FI_MR_DMABUF`` (libfabric 1.20+).
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

# vkshmem is a build requirement (pyproject.toml): the plugin compiles against its header
from vkshmem.plugin import get_include, header_cdef, locate_library, plugin_cdef

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
PREFIX_VAR = "VKSHMEM_OFI_PREFIX"


FOUND = locate_library("vkshmem-ofi", "fabric", "rdma/fabric.h", prefix_var=PREFIX_VAR,
                       hint="on Debian: apt-get install libfabric-dev")
BUILT_WITH = f"the libfabric in {FOUND.prefix}"
CDEF = (plugin_cdef() + "\n" + header_cdef(CSRC / "vko.h", constants=("VKO_",))
        + "\nconst char *vko_built_with(void);\n")

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "vkshmem_ofi._ofi",
    (CSRC / "vko.c").read_text()
    + f'\nconst char *vko_built_with(void) {{ return "{BUILT_WITH}"; }}\n',
    include_dirs=[str(CSRC), get_include(), str(FOUND.include)],
    library_dirs=[str(FOUND.lib)],
    libraries=["fabric", "pthread"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=FOUND.link_args(),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
