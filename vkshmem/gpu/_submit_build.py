"""cffi (API mode) build of ``vkshmem.gpu._submit``: the GPU domain's native submission path.

The ``vulkan`` package calls Vulkan through libffi (about a microsecond per call, with the GIL
held), and a blocking GPU operation makes about ten such calls: begin, barriers, the copy, end,
submit, fence polls, reset. This helper makes each of those paths one call into C, with the GIL
released: record and submit a copy, submit a prerecorded command buffer, and wait for a fence
by spinning on ``vkGetFenceStatus`` (``VKSHMEM_GPU_SPIN_US``) before blocking in
``vkWaitForFences`` (bounded by the caller's timeout); and record + submit a batch of compute
dispatches (bind, push constants, dispatch; the shader copies, reductions and AMO batches).

A command buffer starts with a barrier ordering it after the work submitted before it on the
same queue only when the caller says some is still in flight (``lead``): after a fence wait the
queue is idle and that barrier costs ~5 us on an H100 for nothing (host writes before a submit
are visible to it without one).

It needs no Vulkan headers: the functions come from ``vkGetDeviceProcAddr`` (its address is
passed in), the structs it submits are the ones the Python layer prebuilt (passed as
addresses), and the only struct it fills itself is ``VkBufferCopy`` (three ``VkDeviceSize``).
Dispatchable handles (device, queue, command buffer) are pointers; the others (buffer, fence)
64-bit integers, as on every 64-bit platform.
"""

from pathlib import Path

from cffi import FFI

CDEF = """
typedef struct vks_dev vks_dev;
vks_dev *vks_open(uintptr_t get_device_proc_addr, uintptr_t device, uintptr_t begin_info,
                  uintptr_t barrier_in, uintptr_t barrier_out, uintptr_t barrier_mid,
                  uint32_t all_stages, uint32_t host_stage);
void vks_close(vks_dev *d);
int32_t vks_copy(vks_dev *d, uintptr_t cmd, uintptr_t queue, uintptr_t submit_info,
                 uint64_t fence, uint64_t dst, uint64_t dst_offset, uint64_t src,
                 uint64_t src_offset, uint64_t nbytes, int lead);
int32_t vks_dispatch(vks_dev *d, uintptr_t cmd, uintptr_t queue, uintptr_t submit_info,
                     uint64_t fence, uint64_t pipeline, uint64_t layout, uint32_t n,
                     const uint32_t *groups, const uint8_t *push, uint32_t push_size,
                     int lead, int ordered);
int32_t vks_dispatch1(vks_dev *d, uintptr_t cmd, uintptr_t queue, uintptr_t submit_info,
                      uint64_t fence, uint64_t pipeline, uint64_t layout, uint32_t x,
                      const char *push, uint32_t push_size, int lead);
int32_t vks_copy_many(vks_dev *d, uintptr_t cmd, uintptr_t queue, uintptr_t submit_info,
                      uint64_t fence, uint32_t n, const uint64_t *desc, int lead);
int32_t vks_submit(vks_dev *d, uintptr_t queue, uintptr_t submit_info, uint64_t fence);
int32_t vks_wait(vks_dev *d, uint64_t fence, int64_t spin_ns, uint64_t timeout_ns);
"""

#: the C source
SOURCE = (Path(__file__).parent / "csrc" / "submit.c").read_text()

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("vkshmem.gpu._submit", SOURCE, extra_compile_args=["-O2"])

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
