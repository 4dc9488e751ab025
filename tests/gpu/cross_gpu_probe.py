"""Probe (run by hand on a two-GPU NVIDIA machine): can a process reach a Vulkan heap of
another process on *another* GPU through CUDA? Process B exports Vulkan memory on GPU 1 as an
opaque fd and sends it over a Unix socket; process A imports it into CUDA on GPU 1 (its own
context there), copies into it from a buffer on GPU 0 with peer access (NVLink), and B checks
the bytes through Vulkan. Prints the copy bandwidth next to a plain cudaMalloc peer copy."""

from __future__ import annotations

import os
import socket
import sys
import time

import numpy as np

N = 256 << 20


def proc_b(sock: socket.socket) -> None:
    from vkshmem.gpu import VulkanDevice

    dev = VulkanDevice(1)
    mem = dev.alloc_exportable(N)
    fd = mem.export_fd()
    info = f"{mem.allocation_size} {int(mem.dedicated)} {dev.info.device_uuid.hex()}".encode()
    socket.send_fds(sock, [info], [fd])
    os.close(fd)
    sock.recv(16)  # A copied
    out = np.empty(4096, np.uint8)
    dev.read(mem, N - 4096, out)
    want = (np.arange(N - 4096, N) % 251).astype(np.uint8)
    print(f"B: bytes seen through Vulkan {'match' if np.array_equal(out, want) else 'DIFFER'}",
          flush=True)
    sock.send(b"done")
    mem.free()
    dev.close()


def ck(res, what):  # type: ignore[no-untyped-def]
    from cuda.bindings import driver as cu
    err, *v = res if isinstance(res, tuple) else (res,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err}")
    return v[0] if len(v) == 1 else v


def proc_a(sock: socket.socket) -> None:
    from cuda.bindings import driver as cu

    msg, fds, _f, _a = socket.recv_fds(sock, 256, 1)
    size, dedicated, uuid = msg.decode().split()
    ck(cu.cuInit(0), "cuInit")
    d0, d1 = ck(cu.cuDeviceGet(0), "dev0"), ck(cu.cuDeviceGet(1), "dev1")
    print("A: uuid of CUDA device 1", bytes(ck(cu.cuDeviceGetUuid(d1), "uuid").bytes).hex(),
          "vulkan", uuid, flush=True)
    c0 = ck(cu.cuDevicePrimaryCtxRetain(d0), "ctx0")
    c1 = ck(cu.cuDevicePrimaryCtxRetain(d1), "ctx1")
    ck(cu.cuCtxSetCurrent(c1), "set1")
    desc = cu.CUDA_EXTERNAL_MEMORY_HANDLE_DESC()
    desc.type = cu.CUexternalMemoryHandleType.CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD
    desc.handle.fd = fds[0]
    desc.size = int(size)
    desc.flags = cu.CUDA_EXTERNAL_MEMORY_DEDICATED if int(dedicated) else 0
    ext = ck(cu.cuImportExternalMemory(desc), "cuImportExternalMemory on GPU 1")
    bd = cu.CUDA_EXTERNAL_MEMORY_BUFFER_DESC()
    bd.offset, bd.size, bd.flags = 0, N, 0
    remote = int(ck(cu.cuExternalMemoryGetMappedBuffer(ext, bd), "mapped buffer"))
    plain1 = int(ck(cu.cuMemAlloc(N), "cuMemAlloc on GPU 1"))
    ck(cu.cuCtxSetCurrent(c0), "set0")
    r = cu.cuCtxEnablePeerAccess(c1, 0)
    print("A: peer access GPU0->GPU1:", r, flush=True)
    local = int(ck(cu.cuMemAlloc(N), "cuMemAlloc on GPU 0"))
    host = (np.arange(N) % 251).astype(np.uint8)
    ck(cu.cuMemcpyHtoD(local, host.ctypes.data, N), "fill")
    stream = ck(cu.cuStreamCreate(1), "stream")
    for name, dst in (("Vulkan heap of process B on GPU 1 (imported)", remote),
                      ("cudaMalloc on GPU 1", plain1)):
        for size in (1 << 20, 16 << 20, 256 << 20):
            ck(cu.cuMemcpyDtoDAsync(dst, local, size, stream), "copy")
            ck(cu.cuStreamSynchronize(stream), "sync")
            t0 = time.perf_counter()
            k = 20
            for _ in range(k):
                ck(cu.cuMemcpyDtoDAsync(dst, local, size, stream), "copy")
                ck(cu.cuStreamSynchronize(stream), "sync")
            dt = (time.perf_counter() - t0) / k
            print(f"A: GPU0 -> {name}: {size >> 20} MiB {dt * 1e6:.1f} us "
                  f"{size / dt / 1e9:.1f} GB/s", flush=True)
    sock.send(b"copied")
    sock.recv(16)


if __name__ == "__main__":
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        try:
            proc_b(b)
        finally:
            os._exit(0)
    b.close()
    try:
        proc_a(a)
    except Exception as exc:
        print("A failed:", exc, flush=True)
        sys.exit(1)
    finally:
        os.waitpid(pid, 0)
