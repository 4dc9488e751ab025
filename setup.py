"""Build hook: compiles the core's small native helper (hardware atomics, copies) with cffi."""

from setuptools import setup

setup(cffi_modules=["vkshmem/core/_native_build.py:ffibuilder"])
