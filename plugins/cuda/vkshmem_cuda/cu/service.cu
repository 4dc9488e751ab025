/* The service kernel: one block that stays resident while requests keep coming and serves the
   mailbox (layout in csrc/cudasvc.c): the host stores a request and then its sequence number
   into the request box ``b`` (mapped pinned host memory, or device memory the CPU maps, which
   the block then polls without crossing PCIe); the block copies (device addresses: this
   GPU's heap, peers' heaps mapped here, or the request box's payload for host data) or runs
   the AMO, fences system-wide and stores the sequence number into the reply box ``r``'s
   ``done`` (pinned host memory; ``r`` may be ``b``). No request for ``idle_ns`` (the GPU's
   global timer): it stores ``r->alive = 0`` and ends, so that a device-wide synchronize of
   the application's (cudaDeviceSynchronize) is held up at most that long; the host launches
   it again for its next request. ``last``: the request served before this launch. Loads are
   volatile (the L1 would keep an earlier request's bytes). */
struct box {
    u64 seq; unsigned op, width; u64 dst, src, nbytes, operand, compare, alive;
    u64 done, value, pad[6];
};
enum { OP_STOP = 0, OP_COPY = 1, OP_AMO = 2, INLINE_WORDS = 16 };

__device__ __forceinline__ u64 ld_acquire(const u64 *p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 gtime(void) {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void vkshmem_service(const struct box *b, struct box *r, u64 last,
                                            u64 idle_ns) {
    /* the request header as warp 0 read it: seq, op | width << 32, dst, src, nbytes,
       operand, compare */
    __shared__ u64 h[8];
    /* the first INLINE_WORDS words of the payload, read with the header (host data of a
       small put then costs no second dependent read over PCIe) */
    __shared__ u64 inl[INLINE_WORDS];
    for (;;) {
        if (threadIdx.x < 32) {
            u64 seq = last;
            if (threadIdx.x == 0) {
                const u64 since = gtime();
                while ((seq = ld_acquire(&b->seq)) == last && gtime() - since <= idle_ns) {
                }
            }
            seq = __shfl_sync(0xffffffffu, seq, 0);
            __syncwarp();
            /* one coalesced read of the header (seven dependent loads over PCIe cost ~1 us
               each); ordered after lane 0's acquire by the warp barrier */
            if (seq != last && threadIdx.x > 0 && threadIdx.x < 7)
                h[threadIdx.x] = ((const volatile u64 *)b)[threadIdx.x];
            if (seq != last && threadIdx.x >= 32 - INLINE_WORDS)
                inl[threadIdx.x - (32 - INLINE_WORDS)] =
                    ((const volatile u64 *)(b + 1))[threadIdx.x - (32 - INLINE_WORDS)];
            if (threadIdx.x == 0) h[0] = seq;
            if (seq == last && threadIdx.x == 0) h[1] = OP_STOP;
        }
        __syncthreads();
        const u64 seq = h[0];
        const unsigned op = (unsigned)h[1];
        if (op == OP_STOP) {
            if (threadIdx.x == 0) {
                ((volatile struct box *)r)->alive = 0;
                __threadfence_system();
                if (seq != last) ((volatile struct box *)r)->done = seq;
            }
            return;
        }
        if (op == OP_COPY) {
            const u64 src = h[3], dst = h[2], n = h[4];
            if (src == (u64)(b + 1) && n <= 8 * INLINE_WORDS) {
                /* host data already read with the header */
                if (((dst | n) & 7) == 0) {
                    if (threadIdx.x < n / 8) ((u64 *)dst)[threadIdx.x] = inl[threadIdx.x];
                } else if (threadIdx.x < n) {
                    ((unsigned char *)dst)[threadIdx.x] = ((const unsigned char *)inl)[threadIdx.x];
                }
            } else if (((src | dst | n) & 7) == 0) {
                for (u64 i = threadIdx.x; i < n / 8; i += blockDim.x)
                    ((u64 *)dst)[i] = ((const volatile u64 *)src)[i];
            } else {
                for (u64 i = threadIdx.x; i < n; i += blockDim.x)
                    ((unsigned char *)dst)[i] = ((const volatile unsigned char *)src)[i];
            }
        } else if (op == OP_AMO && threadIdx.x == 0) {
            /* AMO requests: dst the word, src the AmoOp number */
            r->value = amo_apply(h[2], (int)h[3], (int)(h[1] >> 32), h[5], h[6]);
        }
        __threadfence_system();
        __syncthreads();  /* also: h is read by every thread before warp 0 overwrites it */
        if (threadIdx.x == 0) ((volatile struct box *)r)->done = seq;
        last = seq;
    }
}
