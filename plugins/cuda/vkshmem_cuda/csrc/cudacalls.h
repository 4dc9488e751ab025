/* The functions of cudacalls.c, as cffi's cdef reads them (vkshmem_cuda/_ops_build.py reads
   this file with vkshmem.plugin.header_cdef, after vkshmem/plugin.h's plugin_cdef, and puts
   them ahead of its own). Return values are CUresults (0: success); VKC_NO_DRIVER where
   vkc_load has not succeeded. */
#include <vkshmem/plugin.h>
int vkc_load(void);
const char *vkc_missing(void);
int vkc_copy(int kind, uintptr_t ctx, uintptr_t stream, uint64_t dst, uint64_t src,
             size_t nbytes, int64_t spin_ns);
int vkc_sync(uintptr_t ctx, uintptr_t stream, int64_t spin_ns);
int vkc_amo(uintptr_t ctx, uintptr_t stream, uintptr_t fn, uint64_t addr, int op, int width,
            uint64_t operand, uint64_t compare, uint64_t out_dev, uintptr_t out_host,
            uint64_t seq, uint64_t *result, int64_t spin_ns);
struct vkc_domain {
    uintptr_t ctx, stream, amo_fn, amo_host;
    uint64_t base, amo_dev, seq;
    int64_t spin_ns;
    int issued;
};
/* fills vkshmem/plugin.h's struct vk_domain_ops (self, start, quiet, amo); its users fill
   size, mapped, write_max and read_max from Python */
void vkc_domain_ops(struct vkc_domain *d, struct vk_domain_ops *ops);
/* cudalink.c: a device copy between two GPUs through a bounce buffer mapped on both */
int vkc_link_copy(uintptr_t ctx1, uintptr_t s1, uintptr_t ctx2, uintptr_t s2, uint64_t dst,
                  uint64_t src, size_t nbytes, uint64_t bounce, size_t piece, unsigned slots,
                  const uintptr_t *ev1, const uintptr_t *ev2, int64_t spin_ns);
int vkc_link_host(int kind, uintptr_t ctx, uintptr_t stream, uint64_t dst, uint64_t src,
                  size_t nbytes, int64_t spin_ns);
/* cudalink.c: a CPU copy between BAR mappings, drained (and read back: landed) on return */
void vkc_bar_copy(uint64_t dst, uint64_t src, size_t nbytes, int readback);
/* cudapair.c: one round of the two-GPU all-reduce, issued and waited for (large arrays:
   in two halves on two streams, events[0..1] ordering them) */
int vkc_pair_round(uintptr_t ctx, uintptr_t stream, uintptr_t stream2, const uintptr_t *events,
                   uintptr_t fn, uint64_t push_dst, uint64_t push_src, size_t push_bytes,
                   uint64_t mine, uint64_t peer, uint32_t seq, const uint64_t *dsts,
                   const uint64_t *srcs, uint64_t count, unsigned isz, unsigned grid,
                   unsigned block, int64_t spin_ns, int64_t timeout_ns);
#define VKC_NO_DRIVER 100
