/* The GPU domain's native submission path, vkshmem.gpu._submit (built by
 * vkshmem/gpu/_submit_build.py with cffi; its declarations are CDEF there). */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef int32_t VkResult;
typedef struct vks_dev vks_dev;
typedef void (*vks_fn)(void);
typedef vks_fn (*PFN_gdpa)(void *device, const char *name);
typedef struct { uint64_t src_offset, dst_offset, size; } vks_region;  /* VkBufferCopy */
typedef VkResult (*PFN_begin)(void *cmd, const void *info);
typedef void (*PFN_barrier)(void *cmd, uint32_t src_stages, uint32_t dst_stages,
                            uint32_t dependency_flags, uint32_t n_memory, const void *memory,
                            uint32_t n_buffer, const void *buffer, uint32_t n_image,
                            const void *image);
typedef void (*PFN_copy)(void *cmd, uint64_t src, uint64_t dst, uint32_t n,
                         const vks_region *regions);
typedef VkResult (*PFN_end)(void *cmd);
typedef void (*PFN_bind)(void *cmd, uint32_t bind_point, uint64_t pipeline);
typedef void (*PFN_push)(void *cmd, uint64_t layout, uint32_t stages, uint32_t offset,
                         uint32_t size, const void *values);
typedef void (*PFN_dispatch)(void *cmd, uint32_t x, uint32_t y, uint32_t z);
typedef VkResult (*PFN_submit)(void *queue, uint32_t n, const void *submits, uint64_t fence);
typedef VkResult (*PFN_status)(void *device, uint64_t fence);
typedef VkResult (*PFN_wait)(void *device, uint32_t n, const uint64_t *fences, uint32_t all,
                             uint64_t timeout_ns);
typedef VkResult (*PFN_reset)(void *device, uint32_t n, const uint64_t *fences);

struct vks_dev {
    void *device;
    PFN_begin begin;
    PFN_barrier barrier;
    PFN_copy copy;
    PFN_end end;
    PFN_bind bind;
    PFN_push push;
    PFN_dispatch dispatch;
    PFN_submit submit;
    PFN_status status;
    PFN_wait wait;
    PFN_reset reset;
    const void *begin_info, *barrier_in, *barrier_out, *barrier_mid;
    uint32_t all_stages, host_stage;
};

#define VK_NOT_READY 1
#define VK_TIMEOUT 2
#define VK_PIPELINE_BIND_POINT_COMPUTE 1
#define VK_SHADER_STAGE_COMPUTE_BIT 0x20

vks_dev *vks_open(uintptr_t get_device_proc_addr, uintptr_t device, uintptr_t begin_info,
                  uintptr_t barrier_in, uintptr_t barrier_out, uintptr_t barrier_mid,
                  uint32_t all_stages, uint32_t host_stage) {
    PFN_gdpa gdpa = (PFN_gdpa)get_device_proc_addr;
    vks_dev *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->device = (void *)device;
    d->begin = (PFN_begin)gdpa(d->device, "vkBeginCommandBuffer");
    d->barrier = (PFN_barrier)gdpa(d->device, "vkCmdPipelineBarrier");
    d->copy = (PFN_copy)gdpa(d->device, "vkCmdCopyBuffer");
    d->end = (PFN_end)gdpa(d->device, "vkEndCommandBuffer");
    d->bind = (PFN_bind)gdpa(d->device, "vkCmdBindPipeline");
    d->push = (PFN_push)gdpa(d->device, "vkCmdPushConstants");
    d->dispatch = (PFN_dispatch)gdpa(d->device, "vkCmdDispatch");
    d->submit = (PFN_submit)gdpa(d->device, "vkQueueSubmit");
    d->status = (PFN_status)gdpa(d->device, "vkGetFenceStatus");
    d->wait = (PFN_wait)gdpa(d->device, "vkWaitForFences");
    d->reset = (PFN_reset)gdpa(d->device, "vkResetFences");
    d->begin_info = (const void *)begin_info;
    d->barrier_in = (const void *)barrier_in;
    d->barrier_out = (const void *)barrier_out;
    d->barrier_mid = (const void *)barrier_mid;
    d->all_stages = all_stages;
    d->host_stage = host_stage;
    if (!d->begin || !d->barrier || !d->copy || !d->end || !d->bind || !d->push ||
        !d->dispatch || !d->submit || !d->status || !d->wait || !d->reset) {
        free(d);
        return NULL;
    }
    return d;
}

void vks_close(vks_dev *d) { free(d); }

int32_t vks_copy(vks_dev *d, uintptr_t cmd, uintptr_t queue, uintptr_t submit_info,
                 uint64_t fence, uint64_t dst, uint64_t dst_offset, uint64_t src,
                 uint64_t src_offset, uint64_t nbytes, int lead) {
    void *c = (void *)cmd;
    vks_region r = {src_offset, dst_offset, nbytes};
    VkResult res = d->begin(c, d->begin_info);
    if (res) return res;
    if (lead) d->barrier(c, d->all_stages, d->all_stages, 0, 1, d->barrier_in, 0, 0, 0, 0);
    d->copy(c, src, dst, 1, &r);
    d->barrier(c, d->all_stages, d->host_stage, 0, 1, d->barrier_out, 0, 0, 0, 0);
    res = d->end(c);
    if (res) return res;
    return d->submit((void *)queue, 1, (const void *)submit_info, fence);
}

/* n dispatches of one pipeline: groups[3k..3k+2] workgroups with push[k*push_size ...] as
   push constants; `ordered` puts a barrier between consecutive dispatches. */
int32_t vks_dispatch(vks_dev *d, uintptr_t cmd, uintptr_t queue, uintptr_t submit_info,
                     uint64_t fence, uint64_t pipeline, uint64_t layout, uint32_t n,
                     const uint32_t *groups, const uint8_t *push, uint32_t push_size,
                     int lead, int ordered) {
    void *c = (void *)cmd;
    VkResult res = d->begin(c, d->begin_info);
    if (res) return res;
    if (lead) d->barrier(c, d->all_stages, d->all_stages, 0, 1, d->barrier_in, 0, 0, 0, 0);
    d->bind(c, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    for (uint32_t k = 0; k < n; k++) {
        if (k && ordered)
            d->barrier(c, d->all_stages, d->all_stages, 0, 1, d->barrier_mid, 0, 0, 0, 0);
        if (push_size)
            d->push(c, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_size,
                    push + (size_t)k * push_size);
        d->dispatch(c, groups[3 * k], groups[3 * k + 1], groups[3 * k + 2]);
    }
    d->barrier(c, d->all_stages, d->host_stage, 0, 1, d->barrier_out, 0, 0, 0, 0);
    res = d->end(c);
    if (res) return res;
    return d->submit((void *)queue, 1, (const void *)submit_info, fence);
}

/* One dispatch of x workgroups (the hot path of shader copies): no arrays to build. */
int32_t vks_dispatch1(vks_dev *d, uintptr_t cmd, uintptr_t queue, uintptr_t submit_info,
                      uint64_t fence, uint64_t pipeline, uint64_t layout, uint32_t x,
                      const char *push, uint32_t push_size, int lead) {
    uint32_t groups[3] = {x, 1, 1};
    return vks_dispatch(d, cmd, queue, submit_info, fence, pipeline, layout, 1, groups,
                        (const uint8_t *)push, push_size, lead, 0);
}

/* n buffer copies in one command buffer (the batched non-blocking operations): desc[5k ..]
   = dst buffer, dst offset, src buffer, src offset, size. They may run concurrently. */
int32_t vks_copy_many(vks_dev *d, uintptr_t cmd, uintptr_t queue, uintptr_t submit_info,
                      uint64_t fence, uint32_t n, const uint64_t *desc, int lead) {
    void *c = (void *)cmd;
    VkResult res = d->begin(c, d->begin_info);
    if (res) return res;
    if (lead) d->barrier(c, d->all_stages, d->all_stages, 0, 1, d->barrier_in, 0, 0, 0, 0);
    for (uint32_t k = 0; k < n; k++) {
        const uint64_t *e = desc + 5 * (size_t)k;
        vks_region r = {e[3], e[1], e[4]};
        d->copy(c, e[2], e[0], 1, &r);
    }
    d->barrier(c, d->all_stages, d->host_stage, 0, 1, d->barrier_out, 0, 0, 0, 0);
    res = d->end(c);
    if (res) return res;
    return d->submit((void *)queue, 1, (const void *)submit_info, fence);
}

int32_t vks_submit(vks_dev *d, uintptr_t queue, uintptr_t submit_info, uint64_t fence) {
    return d->submit((void *)queue, 1, (const void *)submit_info, fence);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int32_t vks_wait(vks_dev *d, uint64_t fence, int64_t spin_ns, uint64_t timeout_ns) {
    VkResult res = d->status(d->device, fence);
    if (res == VK_NOT_READY && spin_ns > 0) {
        int64_t end = now_ns() + spin_ns;
        do {
            res = d->status(d->device, fence);
        } while (res == VK_NOT_READY && now_ns() < end);
    }
    if (res == VK_NOT_READY)
        res = d->wait(d->device, 1, &fence, 1, timeout_ns);
    if (res) return res;
    return d->reset(d->device, 1, &fence);
}
