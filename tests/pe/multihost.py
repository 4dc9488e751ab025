"""Run on PEs spread over several test hosts (tests/test_multihost.py): checks that each PE
reaches the PEs of its own host through the shm path and every other PE through the one
transport ``VKSHMEM_TRANSPORTS`` names, that the hosts are told apart (hostname and network
namespace), then runs the multi-PE scripts named on the command line in this process, one
after another (each prints "<script> ok")."""

from __future__ import annotations

import os
import runpy
import socket
import sys
from pathlib import Path

from _common import check

from vkshmem import shmem

rt = shmem._state.rt
me, n = shmem.my_pe(), shmem.n_pes()
transport = os.environ["VKSHMEM_TRANSPORTS"]
hosts = int(os.environ["MULTIHOST_HOSTS"])
nodes = rt.node_ids  # hostname:boot id:network namespace, per PE
check(len(set(nodes)) == hosts, f"{len(set(nodes))} nodes seen, not {hosts}: {nodes}")
names = {node.split(":")[0] for node in nodes}
check(len(names) == hosts and socket.gethostname() in names, f"hostnames {names}")
for r in rt.routing.routes:
    want = "shm" if nodes[r.pe] == nodes[me] else transport
    check(r.name == want, f"PE {me} reaches PE {r.pe} through {r.name}, not {want}")
mates = [pe for pe in range(n) if nodes[pe] == nodes[me]]
print(f"host {socket.gethostname()}: PEs {mates}")
shmem.barrier_all()
here = Path(__file__).parent
for script in sys.argv[1:]:
    runpy.run_path(str(here / f"{script}.py"), run_name="__main__")
    shmem.barrier_all()
print(f"multihost ok: {n} PEs on {hosts} hosts over {transport}")
