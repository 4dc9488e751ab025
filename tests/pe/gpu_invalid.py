"""Leaks a Vulkan fence on purpose: with VKSHMEM_GPU_VALIDATION=1 the validation layer reports
it when the device is destroyed, and finalize must fail (tests/test_gpu_multipe.py)."""

from __future__ import annotations

import numpy as np

from vkshmem import shmem

g = shmem.zeros(4, np.int32, domain="gpu")
dev = g.domain.device
vk = dev._vk
info = vk.ffi.new("VkFenceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO})
fence = vk.ffi.new("VkFence*")
assert vk.lib.vkCreateFence(dev.handle, info, vk.ffi.NULL, fence) == 0
print("leaked a fence", flush=True)
shmem.finalize()
print("finalize did not fail", flush=True)
