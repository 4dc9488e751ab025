"""Build hook: compiles the native parts. With cffi, the core's helper (hardware atomics,
copies, the peer table) and the GPU domain's submission path (no Vulkan headers needed; its
CUDA calls on NVIDIA are vkshmem-cuda's, plugins/cuda); as
a CPython extension, the core's per-call hot path ``vkshmem.core._fast`` (see
``vkshmem/core/csrc/fast.h``)."""

from glob import glob

from setuptools import Extension, setup

fast = Extension(
    "vkshmem.core._fast",
    sources=sorted(glob("vkshmem/core/csrc/fast_*.c")),
    depends=["vkshmem/core/csrc/fast.h", "vkshmem/core/csrc/fast_int.h",
             "vkshmem/core/csrc/copy_stream.h",
             "vkshmem/core/_native.h", "vkshmem/include/vkshmem/plugin.h"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
)

setup(ext_modules=[fast],
      cffi_modules=["vkshmem/core/_native_build.py:ffibuilder",
                    "vkshmem/gpu/_submit_build.py:ffibuilder"])
