"""Build hook: compiles ``vkshmem_cuda._ops`` (cffi, no CUDA headers needed; see
``vkshmem_cuda/_ops_build.py``)."""

from setuptools import setup

setup(cffi_modules=["vkshmem_cuda/_ops_build.py:ffibuilder"])
