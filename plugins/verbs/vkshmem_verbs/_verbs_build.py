"""cffi (API mode) build of ``vkshmem_verbs._verbs``, the plugin's own libibverbs binding.

The C source is ``csrc/vkv.c`` (which includes ``vkv_pure.c``, ``vkv_dev.c``, ``vkv_data.c``).
``ibv_post_send``, ``ibv_poll_cq`` and the other data-path calls of libibverbs are static
inline in ``infiniband/verbs.h`` (they jump through the provider's ops table), so the binding
must be compiled (API mode). It builds against ``/usr/include/infiniband/verbs.h``
(Debian: ``apt-get install libibverbs-dev``) and links ``libibverbs.so.1`` (``libibverbs1``);
``VKSHMEM_VERBS_PREFIX`` picks another rdma-core installation prefix.
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

# vkshmem is a build requirement (pyproject.toml): the plugin compiles against its header
from vkshmem.plugin import get_include, header_cdef, locate_library, plugin_cdef

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
PREFIX_VAR = "VKSHMEM_VERBS_PREFIX"


#: libibverbs constants the Python side and the tests use (values from the header)
CONSTANTS = (
    "IBV_WR_RDMA_WRITE IBV_WR_RDMA_READ IBV_WR_ATOMIC_FETCH_AND_ADD IBV_WR_ATOMIC_CMP_AND_SWP "
    "IBV_SEND_SIGNALED IBV_SEND_FENCE IBV_SEND_INLINE IBV_QPS_INIT IBV_QPS_RTR IBV_QPS_RTS "
    "IBV_MTU_256 IBV_MTU_512 IBV_MTU_1024 IBV_MTU_2048 IBV_MTU_4096 IBV_ACCESS_LOCAL_WRITE "
    "IBV_ACCESS_REMOTE_WRITE IBV_ACCESS_REMOTE_READ IBV_ACCESS_REMOTE_ATOMIC IBV_QP_STATE "
    "IBV_QP_AV IBV_QP_PATH_MTU IBV_QP_DEST_QPN IBV_QP_RQ_PSN IBV_QP_MAX_DEST_RD_ATOMIC "
    "IBV_QP_MIN_RNR_TIMER IBV_QP_PKEY_INDEX IBV_QP_PORT IBV_QP_ACCESS_FLAGS IBV_QP_TIMEOUT "
    "IBV_QP_RETRY_CNT IBV_QP_RNR_RETRY IBV_QP_SQ_PSN IBV_QP_MAX_QP_RD_ATOMIC "
    "IBV_LINK_LAYER_INFINIBAND IBV_LINK_LAYER_ETHERNET IBV_PORT_ACTIVE IBV_ATOMIC_NONE "
    "IBV_ATOMIC_HCA IBV_ATOMIC_GLOB"
).split()


FOUND = locate_library("vkshmem-verbs", "ibverbs", "infiniband/verbs.h",
                       prefix_var=PREFIX_VAR, hint="on Debian: apt-get install libibverbs-dev")
CDEF = ((CSRC / "vkv_cdef.h").read_text() + "\n" + plugin_cdef() + "\n"
        + header_cdef(CSRC / "vkv.h", constants=("VKV_",)) + "\n"
        + "\n".join(f"static const int {name};" for name in CONSTANTS) + "\n")

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "vkshmem_verbs._verbs",
    (CSRC / "vkv.c").read_text(),
    include_dirs=[str(CSRC), get_include(), str(FOUND.include)],
    library_dirs=[str(FOUND.lib)],
    libraries=["ibverbs", "pthread"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=FOUND.link_args(),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
