"""Multi-PE helper: open the bootstrap the environment selects and check its collectives.

Usage: python boot_allgather.py EXPECTED_NAME EXPECTED_SIZE
Prints ``OK rank=R size=N name=NAME addr=ADDR`` on success; raises on any mismatch.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import sys
import time

from vkshmem.core.bootstrap.select import open_bootstrap
from vkshmem.core.config import load as load_config
from vkshmem.core.plugins.loader import load_plugins


def main() -> None:
    want_name, want_size = sys.argv[1], int(sys.argv[2])
    cfg = load_config()
    boot = open_bootstrap(cfg, load_plugins(cfg).bootstraps, os.environ)
    r, n = boot.rank, boot.size
    assert boot.name == want_name, (boot.name, want_name)
    assert n == want_size, (n, want_size)
    assert 0 <= r < n

    got = boot.allgather(f"pe{r}".encode())
    assert got == [f"pe{i}".encode() for i in range(n)], got

    # Every PE holds the same job secret (a digest of it is compared, not the secret); the
    # launchers that make one make a long random one.
    digests = boot.allgather(hashlib.sha256(boot.secret).digest())
    assert len(set(digests)) == 1, "the PEs hold different job secrets"
    assert boot.name == "env" or len(boot.secret) >= 32, (boot.name, len(boot.secret))

    # Different sizes per rank, every byte value, and an empty blob on rank 0.
    got = boot.allgather(bytes(range(256)) * r)
    assert got == [bytes(range(256)) * i for i in range(n)]

    # A large blob.
    got = boot.allgather(bytes([r % 251]) * (1 << 20))
    assert [len(b) for b in got] == [1 << 20] * n
    assert all(b == bytes([i % 251]) * (1 << 20) for i, b in enumerate(got))

    # barrier really waits for everyone: nobody leaves before the last one arrived.
    for _ in range(3):
        time.sleep(0.02 * r)
        arrived = time.time()
        boot.barrier()
        left = time.time()
        times = [float(b) for b in boot.allgather(repr(arrived).encode())]
        assert left >= max(times) - 1e-3, (left, times)

    # Many small rounds stay in step.
    for k in range(20):
        got = boot.allgather(bytes([k, r]))
        assert got == [bytes([k, i]) for i in range(n)], (k, got)

    addr = boot.host_address()
    ipaddress.ip_address(addr)
    boot.barrier()
    print(f"OK rank={r} size={n} name={boot.name} addr={addr}", flush=True)
    boot.close()
    boot.close()  # safe twice


if __name__ == "__main__":
    main()
