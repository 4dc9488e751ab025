"""Build hook: compiles the small native helpers with cffi — the core's (hardware atomics,
copies) and the GPU domain's submission path (no Vulkan headers needed)."""

from setuptools import setup

setup(cffi_modules=["vkshmem/core/_native_build.py:ffibuilder",
                    "vkshmem/gpu/_submit_build.py:ffibuilder"])
