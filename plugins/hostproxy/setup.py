"""Build hook: compiles the hostproxy server thread (C, cffi API mode)."""

from setuptools import setup

setup(cffi_modules=["vkshmem_hostproxy/_server_build.py:ffibuilder"])
