/* The two-GPU all-reduce (the cuda domain's vkshmem_cuda/pairreduce.py, the Vulkan domain's
   vkshmem/gpu/cudapair.py): a round issued and waited for by one C call, GIL released (the
   core's barriers come before and after it). Compiled after cudacalls.c (its `cu`, current,
   now_ns).

   Each PE's heap has, in its control bytes which both GPUs map, a word that each partner
   writes (PUSHED). A round numbered seq, on this PE's stream:
     copy  my source's part of the peer's share into the peer's target (the copy engine)
     write the peer's PUSHED word = seq (ordered after the copy: the driver's default memory
           barrier)
     wait  my PUSHED word >= seq (the peer's push into my target landed; wrap-around safe,
           CU_STREAM_WAIT_VALUE_GEQ)
     launch the reduce kernel: my share, from my source and what the peer pushed, into both
            targets.
   Measured on 2 x H100: signalling the call's entry and end on the GPUs the same way (no
   host barriers) cost 8 us more per call than the core's barriers. */

#define VKC_WAIT_GEQ 0
#ifndef VKC_MAX_SOURCES
#define VKC_MAX_SOURCES 8  /* the reduce kernel's struct of pointers (cudakernels.py) */
#endif

static CUresult (*pair_write)(CUstream, CUdeviceptr, uint32_t, unsigned);
static CUresult (*pair_wait)(CUstream, CUdeviceptr, uint32_t, unsigned);

static int pair_load(void) {
    if (pair_write && pair_wait) return 0;
    if (!cu.loaded) return VKC_NO_DRIVER;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return VKC_NO_DRIVER;
    void *w = dlsym(lib, "cuStreamWriteValue32_v2");
    void *v = dlsym(lib, "cuStreamWaitValue32_v2");
    if (!w) w = dlsym(lib, "cuStreamWriteValue32");
    if (!v) v = dlsym(lib, "cuStreamWaitValue32");
    if (!w || !v) return VKC_NO_DRIVER;
    pair_write = (CUresult (*)(CUstream, CUdeviceptr, uint32_t, unsigned))w;
    pair_wait = (CUresult (*)(CUstream, CUdeviceptr, uint32_t, unsigned))v;
    return 0;
}

/* Wait for the stream: spin for spin_ns, then sleep a fiftieth of the time waited so far
   (at most 200 us) between looks, until timeout_ns; VKC_NOT_READY when it ran out. */
static int vkc_stream_wait(uintptr_t ctx, uintptr_t stream, int64_t spin_ns,
                           int64_t timeout_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUresult r = current(ctx);
    if (r) return r;
    int64_t start = now_ns();
    for (;;) {
        r = cu.query((CUstream)stream);
        if (r != VKC_NOT_READY) return r;
        int64_t waited = now_ns() - start;
        if (waited >= timeout_ns) return VKC_NOT_READY;
        if (waited > spin_ns) {
            int64_t nap = waited / 50 < 200000 ? waited / 50 : 200000;
            struct timespec t = {0, (long)nap};
            nanosleep(&t, 0);
        }
    }
}

/* One round: issue it, then wait for the stream (vkc_stream_wait; VKC_NOT_READY when the
   peer's push did not land within timeout_ns: the caller releases the stream). */
int vkc_pair_round(uintptr_t ctx, uintptr_t stream, uintptr_t fn, uint64_t push_dst,
                   uint64_t push_src, size_t push_bytes, uint64_t mine, uint64_t peer,
                   uint32_t seq, const uint64_t *dsts, const uint64_t *srcs, uint64_t count,
                   unsigned grid, unsigned block, int64_t spin_ns, int64_t timeout_ns) {
    int loaded = pair_load();
    if (loaded) return loaded;
    CUresult r = current(ctx);
    if (r) return r;
    CUstream s = (CUstream)stream;
    if (push_bytes && (r = cu.d2d(push_dst, push_src, push_bytes, s))) return r;
    if ((r = pair_write(s, peer, seq, 0))) return r;
    if ((r = pair_wait(s, mine, seq, VKC_WAIT_GEQ))) return r;
    if (count) {
        uint64_t d[VKC_MAX_SOURCES] = {dsts[0], dsts[1]};
        uint64_t src[VKC_MAX_SOURCES] = {srcs[0], srcs[1]};
        int two = 2;
        void *params[] = {d, &two, src, &two, &count};
        if ((r = cu.launch((CUfunction)fn, grid, 1, 1, block, 1, 1, 0, s, params, 0)))
            return r;
    }
    return vkc_stream_wait(ctx, stream, spin_ns, timeout_ns);
}
