"""Build hook: compiles the libfabric binding and its progress thread (C, cffi API mode).

Which libfabric it builds against is chosen by ``VKSHMEM_OFI_PREFIX`` (see ``README.md``):
the system's (``/usr``) by default, or a site installation prefix.
"""

from setuptools import setup

setup(cffi_modules=["vkshmem_ofi/_ofi_build.py:ffibuilder"])
