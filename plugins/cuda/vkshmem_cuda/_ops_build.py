"""cffi (API mode) build of ``vkshmem_cuda._ops``: the CUDA domain's per-call path in C.

Through ``cuda-bindings`` a blocking copy is three Python-level driver calls (make the context
current, the async copy, a stream synchronize) at about a microsecond each, with the GIL held.
Here each operation is one C call, GIL released: make the context current if it is not, issue
the copy (or the AMO kernel launch), then spin on ``cuStreamQuery`` for up to ``spin_ns``
before blocking in ``cuStreamSynchronize``. Small copies to or from pageable host memory go
through a pinned bounce buffer (one ``memcpy``), which is what CUDA would do, minus its
bookkeeping.

No CUDA headers are needed: the functions come from ``libcuda.so.1`` by ``dlopen``/``dlsym``
at :func:`vkc_load` (so the helper builds on machines without CUDA, and says so at run time);
handles are pointers and device addresses 64-bit integers, as in ``cuda.h`` on 64-bit Linux.
"""

from pathlib import Path

from cffi import FFI

# vkshmem is a build requirement (pyproject.toml): the plugin compiles against its header
from vkshmem.plugin import get_include, header_cdef, plugin_cdef

#: this plugin's C sources: the CUDA calls both of its users issue (csrc/cudacalls.[ch]: the
#: driver table, copies, stream waits and the AMO launch), the Vulkan domain's links and
#: two-GPU all-reduce round (cudalink.c, cudapair.c) and the service kernel's host side
#: (cudasvc.[ch]); the cuda domain's own functions follow
CSRC = Path(__file__).resolve().parent / "csrc"

SOURCE = "".join((CSRC / name).read_text()
                 for name in ("cudacalls.c", "cudalink.c", "cudapair.c", "cudasvc.c", "cudaops.c"))

#: the cdef: vkshmem's ``vkshmem/plugin.h`` (``struct vk_domain_ops``, which cudacalls.c
#: fills, and the AMO op codes), then this plugin's headers, read by the kit's ``header_cdef``
CDEF = (plugin_cdef() + "\n" + header_cdef(CSRC / "cudacalls.h", constants=("VKC_",)) + "\n"
        + header_cdef(CSRC / "cudasvc.h", constants=("VKC_",)) + """
int vkc_copy_staged(int to_device, uintptr_t ctx, uintptr_t stream, uint64_t dst,
                    uint64_t src, size_t nbytes, uintptr_t bounce, size_t bounce_size,
                    int64_t spin_ns);
int vkc_memset(uintptr_t ctx, uintptr_t stream, uint64_t dst, size_t nbytes, int64_t spin_ns);
int vkc_reduce(uintptr_t ctx, uintptr_t stream, uintptr_t fn, const uint64_t *dsts,
               int ndst, const uint64_t *srcs, int nsrc, uint64_t count, unsigned grid,
               unsigned block, int64_t spin_ns);
""")


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("vkshmem_cuda._ops", SOURCE, libraries=["dl"],
                      include_dirs=[get_include()],  # vkshmem/plugin.h
                      extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
                      py_limited_api=True)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
