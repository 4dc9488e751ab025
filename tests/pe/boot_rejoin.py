"""Multi-PE helper: re-initialisation (OpenSHMEM 1.6) at the bootstrap the environment selects.

Usage: python boot_rejoin.py EXPECTED_NAME [mpi-finalized]

Opens the bootstrap, exchanges, closes (rank 0 last, half a second after the others, so that
they open again while its first store may still be up), opens it again and exchanges again.
Prints ``REJOINED rank=R size=N name=NAME generation=G`` (G: the store's generation of the
second connection, ``-`` for a bootstrap without a store). With ``mpi-finalized``, MPI is
finalized between the two and the second open must fail naming why; it prints ``REFUSED: ...``.
"""

from __future__ import annotations

import os
import sys
import time

from vkshmem.core.bootstrap.select import open_bootstrap
from vkshmem.core.config import load as load_config
from vkshmem.core.plugins.loader import load_plugins


def open_boot():  # type: ignore[no-untyped-def]
    cfg = load_config()
    return open_bootstrap(cfg, load_plugins(cfg).bootstraps, os.environ)


def main() -> None:
    want_name = sys.argv[1]
    boot = open_boot()
    r, n = boot.rank, boot.size
    assert boot.name == want_name, (boot.name, want_name)
    assert boot.allgather(b"first %d" % r) == [b"first %d" % i for i in range(n)]
    if r == 0:
        time.sleep(0.5)
    boot.close()
    if sys.argv[2:] == ["mpi-finalized"]:
        from mpi4py import MPI

        MPI.Finalize()
        try:
            open_boot()
        except Exception as exc:
            print(f"REFUSED: {type(exc).__name__}: {exc}", flush=True)
            return
        raise AssertionError("the mpi bootstrap opened after MPI_Finalize")
    boot = open_boot()
    assert (boot.rank, boot.size) == (r, n)
    for k in range(3):
        got = boot.allgather(b"again %d %d" % (k, r))
        assert got == [b"again %d %d" % (k, i) for i in range(n)], got
    client = getattr(boot, "client", None)
    generation = "-" if client is None else client.generation
    boot.barrier()
    print(f"REJOINED rank={r} size={n} name={boot.name} generation={generation}", flush=True)
    boot.close()


if __name__ == "__main__":
    main()
