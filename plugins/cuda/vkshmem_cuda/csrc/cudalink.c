/* A device copy between two GPUs of this process's contexts through a bounce buffer (a CUDA
   VMM allocation mapped on both): the Vulkan domain's link to a peer's heap on another GPU
   (vkshmem_cuda/vulkan_accel/link.py). Compiled after cudacalls.c (its `cu`, current and
   finish).

   Piece k of `piece` bytes uses bounce slot j = k % slots. Stage 1 on (ctx1, s1) copies the
   piece from src into the slot and records ev1[j]; stage 2 on (ctx2, s2) waits for ev1[j],
   copies the slot into dst and records ev2[j]; stage 1 of piece k + slots waits for ev2[j]
   before it overwrites the slot. For a put, stage 1 runs on this PE's GPU (its heap into the
   slot on the peer's GPU, across the link) and stage 2 on the peer's (local to it); a get
   runs the other way (the peer's heap across into a slot on this PE's GPU, then local). ev1
   are events of ctx1, ev2 of ctx2. Returns once stage 2 of the last
   piece is done (spin, then block); on a failure, after both streams drained. */
static int link_copy(uintptr_t ctx1, uintptr_t s1, uintptr_t ctx2, uintptr_t s2,
                     uint64_t dst, uint64_t src, size_t nbytes, uint64_t bounce, size_t piece,
                     unsigned slots, const uintptr_t *ev1, const uintptr_t *ev2,
                     int64_t spin_ns) {
    if (nbytes == 0) return 0;
    if (piece == 0 || slots == 0) return 1;  /* CUDA_ERROR_INVALID_VALUE */
    CUresult r = 0;
    unsigned k = 0;
    for (size_t lo = 0; lo < nbytes && !r; lo += piece, ++k) {
        size_t n = nbytes - lo < piece ? nbytes - lo : piece;
        unsigned j = k % slots;
        uint64_t slot = bounce + (uint64_t)j * piece;
        if ((r = current(ctx1))) break;
        if (k >= slots && (r = cu.wait_event((CUstream)s1, (CUevent)ev2[j], 0))) break;
        if ((r = cu.d2d(slot, src + lo, n, (CUstream)s1))) break;
        if ((r = cu.record((CUevent)ev1[j], (CUstream)s1))) break;
        if ((r = current(ctx2))) break;
        if ((r = cu.wait_event((CUstream)s2, (CUevent)ev1[j], 0))) break;
        if ((r = cu.d2d(dst + lo, slot, n, (CUstream)s2))) break;
        r = cu.record((CUevent)ev2[j], (CUstream)s2);
    }
    if (r) {  /* leave no copy of this call running */
        if (!current(ctx1)) cu.sync((CUstream)s1);
        if (!current(ctx2)) cu.sync((CUstream)s2);
        return r;
    }
    return finish((CUstream)s2, spin_ns);
}

/* Both calls leave the caller's current context as they found it: the link's contexts are on
   other GPUs, and the application's CUDA libraries (torch, CuPy) take the current context
   for their device. */
int vkc_link_copy(uintptr_t ctx1, uintptr_t s1, uintptr_t ctx2, uintptr_t s2, uint64_t dst,
                  uint64_t src, size_t nbytes, uint64_t bounce, size_t piece, unsigned slots,
                  const uintptr_t *ev1, const uintptr_t *ev2, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUcontext prev = 0;
    CUresult r = cu.ctx_get(&prev);
    if (r) return r;
    r = link_copy(ctx1, s1, ctx2, s2, dst, src, nbytes, bounce, piece, slots, ev1, ev2,
                  spin_ns);
    CUresult back = cu.ctx_set(prev);
    return r ? r : back;
}

/* vkc_copy (device to device: kind 0, host to device: 1, device to host: 2) in context ctx:
   a direct link's copies in this PE's GPU's context, a bounce link's host copies in the peer
   GPU's. */
int vkc_link_host(int kind, uintptr_t ctx, uintptr_t stream, uint64_t dst, uint64_t src,
                  size_t nbytes, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUcontext prev = 0;
    CUresult r = cu.ctx_get(&prev);
    if (r) return r;
    r = vkc_copy(kind, ctx, stream, dst, src, nbytes, spin_ns);
    CUresult back = cu.ctx_set(prev);
    return r ? r : back;
}

/* A copy by the CPU between BAR mappings of GPU memory (write-combined: stores are fast,
   loads cross PCIe one by one): a direct link's small operations on a peer's heap that this
   process also maps (vkshmem/gpu/domain/peermap.py). The stores are drained (a full fence empties
   the write-combining buffers); with `readback`, a load of the last byte written follows:
   PCIe lets no read pass an earlier posted write to the same device, so when it returns the
   bytes have landed in that GPU's memory, not just left this CPU. (x86: the full fence is an
   mfence, which drains write combining; arm64 needs a dsb for device memory.) */
static inline void bar_fence(void) {
#if defined(__aarch64__)
    __asm__ volatile("dsb sy" ::: "memory");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

void vkc_bar_copy(uint64_t dst, uint64_t src, size_t nbytes, int readback) {
    if (nbytes == 0) return;
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, nbytes);
    bar_fence();
    if (readback) {
        volatile const uint8_t *last = (volatile const uint8_t *)(uintptr_t)(dst + nbytes - 1);
        (void)*last;
        bar_fence();
    }
}
