"""Probe (run by hand on a two-GPU NVIDIA machine with cuda-bindings): can the Vulkan domain's
heap *be* a CUDA VMM allocation, so that a peer on another GPU maps it over NVLink?

A VMM allocation (``cuMemCreate`` with a POSIX-fd handle) on GPU 0 is exported and imported into
Vulkan as an opaque fd (device-local type, and the CPU-mapped BAR type), then checked both ways:
Vulkan writes seen by CUDA, CUDA writes seen by Vulkan (and by the CPU mapping where there is
one), whether CUDA re-imports the fd with ``cuImportExternalMemory``, a second Vulkan import of
another exported fd (what a same-GPU peer does), and a Vulkan copy's speed on it against plain
Vulkan memory. Then GPU 1 maps it (``cuMemImportFromShareableHandle`` + ``cuMemMap`` +
``cuMemSetAccess``) and copies into it and out of it across NVLink (16 / 64 / 256 MiB and 8 B),
against a copy into and out of a plain VMM allocation on GPU 0, and the bytes are checked
through Vulkan.

Measured on 2 x H100 (driver 580, 2026-11-27): Vulkan imports it into both types (the BAR
one mapped); Vulkan's, CUDA's and the CPU's writes are seen by the others; CUDA also imports
the fd with ``cuImportExternalMemory``; a 128 MiB Vulkan copy on it 1068 GB/s (1112 on
Vulkan's own memory); GPU 1 puts into / gets from it 389 / 390 GB/s at 256 MiB (the plain VMM
allocation 390 / 390), 356 / 360 at 64 MiB (363 / 366), 8 B in 9.1 / 9.3 us; GPU 1's bytes
arrive. So the Vulkan domain's heap is such an allocation on NVIDIA
(``plugins/cuda/vkshmem_cuda/vmm.py``)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from cuda.bindings import driver as cu
from vkshmem_cuda.vmm import map_handle
from vulkan_cuda_peer_probe import ok

from vkshmem.gpu.vk.device import VulkanDevice

N = 256 << 20
FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def main() -> None:
    ok(cu.cuInit(0))
    vk0 = VulkanDevice(0)
    ordinal = {bytes(ok(cu.cuDeviceGetUuid(ok(cu.cuDeviceGet(i)))).bytes): i
               for i in range(ok(cu.cuDeviceGetCount()))}
    g0 = ordinal[vk0.info.device_uuid]
    g1 = 1 - g0
    ctx = [ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(i)))) for i in (0, 1)]
    ok(cu.cuCtxSetCurrent(ctx[g0]))

    def create(dev: int, size: int) -> tuple[Any, int]:
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = dev
        prop.requestedHandleTypes = FD
        return ok(cu.cuMemCreate(size, prop, 0)), size

    def mapped(handle: Any, size: int, access: tuple[int, ...]) -> int:
        return map_handle(cu, handle, size, access, lambda res, _what: ok(res))

    handle, size = create(g0, N)
    va0 = mapped(handle, size, (g0,))
    results: list[tuple[str, str]] = []

    def export() -> int:
        return int(ok(cu.cuMemExportToShareableHandle(handle, FD, 0)))

    # 1. Vulkan imports: auto type (BAR on NVIDIA) and plain device-local.
    mems = {}
    for label, kw in (("auto (BAR where allowed)", {}), ("device-local", {"memory_type_index":
                      vk0.memory_type(0xFFFFFFFF, False, N)})):
        try:
            m = vk0.import_fd(export(), N, dedicated=False, take_ownership=True, **kw)
            mems[label] = m
            results.append((f"Vulkan import, {label}", f"ok: {m!r}, bar={m.bar}"))
        except Exception as e:
            results.append((f"Vulkan import, {label}", f"FAILED: {e}"))
    if not mems:
        for k, v in results:
            print(f"{k:45s} {v}")
        return
    mem = mems.get("device-local") or next(iter(mems.values()))
    pat = (np.arange(N // 4, dtype=np.uint64) * 2654435761).astype(np.uint32)
    mem.write(0, pat)
    host = np.empty(N // 4, np.uint32)
    ok(cu.cuMemcpyDtoH(host.ctypes.data, va0, N))
    results.append(("Vulkan write -> CUDA read", str(bool(np.array_equal(host, pat)))))
    pat2 = pat ^ 0x5A5A5A5A
    ok(cu.cuMemcpyHtoD(va0, pat2.ctypes.data, N))
    got = np.empty(N // 4, np.uint32)
    mem.read(0, got)
    results.append(("CUDA write -> Vulkan read", str(bool(np.array_equal(got, pat2)))))
    for label, m in mems.items():
        view = m.map()
        if view is not None:
            arr = np.frombuffer(view, np.uint32, 16)
            results.append((f"CPU map of {label}", str(bool(np.array_equal(arr, pat2[:16])))))
            arr[0] = 12345
            one = np.zeros(1, np.uint32)
            ok(cu.cuMemcpyDtoH(one.ctypes.data, va0, 4))
            results.append((f"CPU store via {label} -> CUDA", str(int(one[0]) == 12345)))
            del arr, view
    # 2. cuImportExternalMemory of the VMM fd (what cudainterop does with a Vulkan fd).
    try:
        desc = cu.CUDA_EXTERNAL_MEMORY_HANDLE_DESC()
        desc.type = cu.CUexternalMemoryHandleType.CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD
        desc.handle.fd = export()
        desc.size = N
        ext = ok(cu.cuImportExternalMemory(desc))
        buf = cu.CUDA_EXTERNAL_MEMORY_BUFFER_DESC()
        buf.offset, buf.size = 0, N
        p = int(ok(cu.cuExternalMemoryGetMappedBuffer(ext, buf)))
        ok(cu.cuMemcpyDtoH(host.ctypes.data, p, 64))
        results.append(("cuImportExternalMemory of the VMM fd",
                        f"ok, same bytes {bool(np.array_equal(host[1:16], pat2[1:16]))}"))
    except Exception as e:
        results.append(("cuImportExternalMemory of the VMM fd", f"FAILED: {e}"))
    # 3. Vulkan copy speed on VMM-backed memory against Vulkan's own.
    native = vk0.alloc_exportable(N)
    for label, a, b in (("VMM->VMM", mem, mem), ("Vulkan->Vulkan", native, native)):
        best = 1e9
        for _ in range(4):
            t = time.perf_counter()
            vk0.copy(b, N // 2, a, 0, N // 2)
            best = min(best, time.perf_counter() - t)
        results.append((f"vkCmdCopyBuffer 128 MiB {label}", f"{(N // 2) / best / 1e9:.0f} GB/s"))
    # 4. GPU 1 maps it and copies across NVLink.
    ok(cu.cuCtxSetCurrent(ctx[g1]))
    s1 = ok(cu.cuStreamCreate(1))
    fd = export()
    h1 = ok(cu.cuMemImportFromShareableHandle(fd, FD))
    os.close(fd)
    remote = mapped(h1, N, (g1,))
    lh, _ = create(g1, N)
    local1 = mapped(lh, N, (g1,))
    ok(cu.cuMemsetD8(local1, 7, N))
    ch, _ = create(g0, N)
    ceil0 = mapped(ch, N, (g0, g1))

    def timed(dst: int, src: int, n: int, reps: int = 10) -> float:
        best = 1e9
        for _ in range(reps + 1):
            t = time.perf_counter()
            ok(cu.cuMemcpyDtoDAsync(dst, src, n, s1))
            ok(cu.cuStreamSynchronize(s1))
            best = min(best, time.perf_counter() - t)
        return best

    for n in (16 << 20, 64 << 20, N):
        put = n / timed(remote, local1, n) / 1e9
        get = n / timed(local1, remote, n) / 1e9
        cput = n / timed(ceil0, local1, n) / 1e9
        cget = n / timed(local1, ceil0, n) / 1e9
        results.append((f"GPU1 -> Vulkan heap on GPU0, {n >> 20} MiB put/get",
                        f"{put:.0f} / {get:.0f} GB/s (VMM ceiling {cput:.0f} / {cget:.0f})"))
    results.append(("8 B put / get across",
                     f"{timed(remote, local1, 8, 200) * 1e6:.1f} / "
                     f"{timed(local1, remote, 8, 200) * 1e6:.1f} us"))
    ok(cu.cuMemcpyDtoDAsync(remote, local1, N, s1))
    ok(cu.cuStreamSynchronize(s1))
    ok(cu.cuCtxSetCurrent(ctx[g0]))
    mem.read(0, got)
    results.append(("bytes from GPU1 seen by Vulkan on GPU0", str(bool((got == 0x07070707).all()))))
    for k, v in results:
        print(f"{k:45s} {v}")


if __name__ == "__main__":
    main()
