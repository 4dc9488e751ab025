"""Second process of the GPU export/import tests (started by tests/test_gpu_device.py).

Usage: python peer.py SOCKET_FD EXPORT_INFO_HEX SIZE ROUNDS

Layout of the shared allocation: [0, 8) a 64-bit counter both processes add to; [8, SIZE/2)
the exporter's pattern; [SIZE/2, SIZE) this process's pattern. The peer receives the opaque fd
over the Unix socket SOCKET_FD (SCM_RIGHTS), imports it into its own validated VulkanDevice,
checks the exporter's pattern, says so ("r"), writes its own pattern, adds 1 to the counter
ROUNDS times with single AMOs and ROUNDS times in one concurrent batch (amo.comp), says "d"
and prints a JSON report (including its validation errors) on stdout.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import numpy as np

from vkshmem.core.transports.contract import AmoOp
from vkshmem.gpu import ExportInfo, VulkanDevice

COUNTER = 0  # offset of the shared counter word (the exporter keeps it out of its pattern)


def pattern(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def main() -> int:
    sock_fd, info_hex, size, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4])
    info = ExportInfo.unpack(bytes.fromhex(info_hex))
    with socket.socket(fileno=sock_fd) as sock:
        _msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 1)
        fd = fds[0]
        dev = VulkanDevice(validation=True, timeout=20)
        report: dict[str, object] = {"uuid_match": dev.uuid == info.device_uuid}
        mem = dev.import_fd(fd, info.size, memory_type_index=info.memory_type_index,
                            dedicated=info.dedicated)
        os.close(fd)  # import_fd duplicated it
        half = size // 2
        got = np.empty(half - 8, np.uint8)
        dev.read(mem, 8, got)
        report["saw_exporter_data"] = bool(np.array_equal(got, pattern(1, half - 8)))
        sock.sendall(b"r")  # read done: both sides may now hammer the counter
        dev.write(mem, half, pattern(2, size - half))
        olds = [dev.amo(mem, COUNTER, AmoOp.ADD, 8, 1) for _ in range(rounds)]
        batch = dev.kernels.amo_batch(mem, [COUNTER] * rounds, AmoOp.ADD, 8, 1)
        report["olds_increasing"] = olds == sorted(olds) and len(set(olds)) == rounds
        report["batch_distinct"] = len(set(batch.tolist())) == rounds
        mem.free()
        dev.close()
        report["validation_errors"] = dev.validation_errors
        sock.sendall(b"d")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
