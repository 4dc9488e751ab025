"""DeviceArrays as DLPack tensors (the Vulkan heap imported into CUDA, NVIDIA only): torch and
CuPy view them without a copy, see vkshmem's puts and are seen by them, and shmem.from_dlpack
finds their slices in the heap. Elsewhere (lavapipe) the export is refused with the reason.
Run under ``vkshmem run`` (see tests/test_gpu_multipe.py)."""

from __future__ import annotations

import numpy as np
from _common import check

from vkshmem import shmem

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
x = shmem.array(np.arange(1024, dtype=np.float32) + 1000 * me, domain="gpu")
nvidia = x.domain.spec.name == "vulkan" and x.domain.device.info.vendor == "NVIDIA"
if not nvidia:
    try:
        x.__dlpack__()
        check(False, "a DLPack export off NVIDIA must be refused")
    except BufferError as exc:
        check("NVIDIA" in str(exc), f"the refusal names the reason: {exc}")
    check(not hasattr(x, "__cuda_array_interface__"), "no __cuda_array_interface__")
    print(f"[pe {me}] gpu_cuda_view ok: refused on {x.domain.device.name}", flush=True)
else:
    import torch

    t = torch.from_dlpack(x)
    check(t.device.type == "cuda" and t.dtype == torch.float32 and t.shape == (1024,),
          f"torch tensor {t.device} {t.dtype} {tuple(t.shape)}")
    check(torch.equal(t.cpu(), torch.arange(1024, dtype=torch.float32) + 1000 * me),
          "torch sees the Vulkan heap")
    t += 1  # a CUDA kernel writes the heap
    torch.cuda.synchronize()
    check(np.array_equal(x.to_numpy(), np.arange(1024) + 1000 * me + 1), "vkshmem sees torch")
    shmem.barrier_all()
    # a peer's put (a Vulkan copy into this heap) lands where torch looks
    shmem.put(x[:16], np.full(16, -5 - me, np.float32), right)
    shmem.barrier_all()
    check(torch.equal(t[:16].cpu(), torch.full((16,), -5.0 - left)), "torch sees a peer's put")
    # from_dlpack finds a torch slice of the heap again: a put target
    shmem.barrier_all()
    target = shmem.from_dlpack(t[100:108])
    shmem.put(target, np.full(8, 7 + me, np.float32), right)
    shmem.barrier_all()
    check(np.array_equal(x[100:108].to_numpy(), np.full(8, 7 + left)), "from_dlpack put target")
    try:
        import cupy

        c = cupy.asarray(x)  # __cuda_array_interface__
        check(float(c[100]) == 7 + left and c.data.ptr == t.data_ptr(), "cupy.asarray")
    except ImportError:
        pass
    del t
    print(f"[pe {me}] gpu_cuda_view ok: torch {torch.__version__}", flush=True)
shmem.barrier_all()
shmem.free(x)
