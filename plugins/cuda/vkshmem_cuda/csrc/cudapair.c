/* The two-GPU all-reduce (the cuda domain's vkshmem_cuda/pairreduce.py, the Vulkan domain's
   vkshmem_cuda/vulkan_accel/pair.py): a round issued and waited for by one C call, GIL
   released (the core's barriers come before and after it). Compiled after cudacalls.c (its
   `cu`, current, now_ns).

   Each PE's heap has, in its control bytes which both GPUs map, a word that each partner
   writes (PUSHED). Both partners number their rounds alike, two numbers a round (seq - 1,
   seq). A round, unsplit (arrays under VKC_PAIR_SPLIT bytes), on this PE's stream:
     copy  my source's part of the peer's share into the peer's target (the copy engine)
     write the peer's PUSHED word = seq (ordered after the copy: the driver's default memory
           barrier)
     wait  my PUSHED word >= seq (the peer's push into my target landed; wrap-around safe,
           CU_STREAM_WAIT_VALUE_GEQ)
     launch the reduce kernel: my share, from my source and what the peer pushed, into both
            targets.
   Split (arrays of VKC_PAIR_SPLIT bytes or more: both partners decide alike, from the sum of
   the two shares), every byte across the link goes by the copy engine, in two halves that
   overlap the fold: stream A pushes the first half of the peer's part, writes seq - 1 into
   the peer's word, pushes the rest, writes seq; stream B waits for seq - 1, folds the first
   half of my share into my target only (local memory, fast), records event 0, waits for
   seq, folds the rest, records event 1; stream A then copies each folded half into the
   peer's target after its event (so stream A's end is stream B's too). The link carries copies
   back to back (the fold's own stores across NVLink move ~10 % slower than the copy engine);
   stream A's end is the round's end. Measured (tests/gpu/pair_pipe_probe.py ce, GPU time for
   256 MiB of float32): 711-716 us against 740-741 unsplit on 2 x H200, 719 against 744 on
   2 x H100; 3, 4 and 8 parts cost a copy's start (~3.5 us) and a flag (~3 us) each and lost
   it again.
   Measured on 2 x H100: signalling the call's entry and end on the GPUs the same way (no
   host barriers) cost 8 us more per call than the core's barriers. */

#define VKC_WAIT_GEQ 0
#ifndef VKC_PAIR_SPLIT
/* arrays of this many bytes or more: the split round (2 x H100: even with the unsplit one at
   32 MiB, 5-14 us ahead at 64, 20-30 at 256; 16 MiB and less lose up to 18 us) */
#define VKC_PAIR_SPLIT (64u << 20)
#endif
#ifndef VKC_MAX_SOURCES
#define VKC_MAX_SOURCES 8  /* the reduce kernel's struct of pointers (vkshmem_cuda/kernels.py) */
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

static CUresult pair_fold(uintptr_t fn, uint64_t d0, uint64_t d1, int ndst, uint64_t s0,
                          uint64_t s1, uint64_t count, unsigned grid, unsigned block,
                          CUstream s) {
    uint64_t d[VKC_MAX_SOURCES] = {d0, d1};
    uint64_t src[VKC_MAX_SOURCES] = {s0, s1};
    int two = 2;
    void *params[] = {d, &ndst, src, &two, &count};
    return cu.launch((CUfunction)fn, grid, 1, 1, block, 1, 1, 0, s, params, 0);
}

/* One round: issue it, then wait for stream A (vkc_stream_wait; VKC_NOT_READY when the
   peer's push did not land within timeout_ns: the caller releases the stream by writing its
   own word = seq, which frees every wait). count elements of isz bytes in my share;
   stream2 and events[0..1] serve a split round (see the top of this file). */
int vkc_pair_round(uintptr_t ctx, uintptr_t stream, uintptr_t stream2, const uintptr_t *events,
                   uintptr_t fn, uint64_t push_dst, uint64_t push_src, size_t push_bytes,
                   uint64_t mine, uint64_t peer, uint32_t seq, const uint64_t *dsts,
                   const uint64_t *srcs, uint64_t count, unsigned isz, unsigned grid,
                   unsigned block, int64_t spin_ns, int64_t timeout_ns) {
    int loaded = pair_load();
    if (loaded) return loaded;
    CUresult r = current(ctx);
    if (r) return r;
    CUstream a = (CUstream)stream;
    /* the halves cut at a multiple of 256 elements, so the second half's fold starts 16-byte
       aligned where the share does (the kernel's wide path); push0 is what the peer folds
       first (its count0, from the same count) */
    uint64_t count0 = count / 2 / 256 * 256;
    size_t push0 = (size_t)(push_bytes / isz / 2 / 256 * 256 * isz);
    if (push_bytes + count * isz < VKC_PAIR_SPLIT || !push0 || !count0) {
        if (push_bytes && (r = cu.d2d(push_dst, push_src, push_bytes, a))) return r;
        if ((r = pair_write(a, peer, seq, 0))) return r;
        if ((r = pair_wait(a, mine, seq, VKC_WAIT_GEQ))) return r;
        if (count && (r = pair_fold(fn, dsts[0], dsts[1], 2, srcs[0], srcs[1], count, grid,
                                    block, a)))
            return r;
        return vkc_stream_wait(ctx, stream, spin_ns, timeout_ns);
    }
    CUstream b = (CUstream)stream2;
    /* the split round's folds on a quarter of the plan's blocks (its grid is two per SM in
       both domains: half a block per SM here): at full width they take the HBM bandwidth the
       copy engine needs (2 x H100: 745-761 us against 719; 2 x H200: the same either way) */
    unsigned fold_grid = grid / 4 ? grid / 4 : 1;
    uint64_t at = count0 * isz;
    size_t rest = (size_t)((count - count0) * isz);
    if ((r = cu.d2d(push_dst, push_src, push0, a))) return r;
    if ((r = pair_write(a, peer, seq - 1, 0))) return r;
    if ((r = cu.d2d(push_dst + push0, push_src + push0, push_bytes - push0, a))) return r;
    if ((r = pair_write(a, peer, seq, 0))) return r;
    if ((r = pair_wait(b, mine, seq - 1, VKC_WAIT_GEQ))) return r;
    if ((r = pair_fold(fn, dsts[0], 0, 1, srcs[0], srcs[1], count0, fold_grid, block, b)))
        return r;
    if ((r = cu.record((CUevent)events[0], b))) return r;
    if ((r = pair_wait(b, mine, seq, VKC_WAIT_GEQ))) return r;
    if ((r = pair_fold(fn, dsts[0] + at, 0, 1, srcs[0] + at, srcs[1] + at, count - count0,
                       fold_grid, block, b)))
        return r;
    if ((r = cu.record((CUevent)events[1], b))) return r;
    if ((r = cu.wait_event(a, (CUevent)events[0], 0))) return r;
    if ((r = cu.d2d(dsts[1], dsts[0], (size_t)at, a))) return r;
    if ((r = cu.wait_event(a, (CUevent)events[1], 0))) return r;
    if ((r = cu.d2d(dsts[1] + at, dsts[0] + at, rest, a))) return r;
    return vkc_stream_wait(ctx, stream, spin_ns, timeout_ns);
}
