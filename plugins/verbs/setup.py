"""Build hook: compiles the plugin's libibverbs binding (C, cffi API mode).

Which libibverbs it builds against is chosen by ``VKSHMEM_VERBS_PREFIX`` (see ``README.md``):
the system's (``/usr``, Debian's ``libibverbs-dev``) by default, or a site prefix.
"""

from setuptools import setup

setup(cffi_modules=["vkshmem_verbs/_verbs_build.py:ffibuilder"])
