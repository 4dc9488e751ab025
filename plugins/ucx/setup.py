"""Build hook: compiles the UCX binding and its progress thread (C, cffi API mode).

Which UCX it builds against is chosen by ``VKSHMEM_UCX_PREFIX`` (see ``README.md``): the
``libucx-cu12`` wheel by default, or a system/site UCX installation prefix.
"""

from setuptools import setup

setup(cffi_modules=["vkshmem_ucx/_ucx_build.py:ffibuilder"])
