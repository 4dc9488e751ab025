"""cffi (API mode) build of ``vkshmem.gpu._cuda``: CUDA driver calls from C for the Vulkan
domain on NVIDIA (see ``csrc/cudacalls.c``).

Through ``cuda-bindings`` a blocking copy is three Python-level driver calls (make the context
current, the async copy, a stream synchronize) at about a microsecond each with the GIL held;
here it is one C call with the GIL released. The same C file is the first part of the cuda
domain plugin's helper (``plugins/cuda/vkshmem_cuda/_ops_build.py`` reads :data:`CDEF` and
:data:`SOURCE` from here), so both domains issue CUDA work the same way.
"""

from pathlib import Path

from cffi import FFI

_HERE = Path(__file__).resolve().parent / "csrc"
#: the declarations (cffi cdef) and the C source of the CUDA calls
CDEF = (_HERE / "cudacalls.h").read_text() + (_HERE / "cudasvc.h").read_text()
SOURCE = "".join((_HERE / name).read_text()
                 for name in ("cudacalls.c", "cudalink.c", "cudapair.c", "cudasvc.c"))

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
#: the core's _native.h (struct vk_domain_ops), which cudacalls.c includes
INCLUDE = str(Path(__file__).resolve().parent.parent / "core")
ffibuilder.set_source("vkshmem.gpu._cuda", SOURCE, libraries=["dl"], include_dirs=[INCLUDE],
                      extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
                      py_limited_api=True)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
