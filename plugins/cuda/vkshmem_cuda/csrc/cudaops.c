/* Staged copies, memset and reductions on CUDA streams (vkshmem_cuda._ops, after the other
 * csrc files; declarations in _ops_build.py's CDEF). */
int vkc_copy_staged(int to_device, uintptr_t ctx, uintptr_t stream, uint64_t dst,
                    uint64_t src, size_t nbytes, uintptr_t bounce, size_t bounce_size,
                    int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUresult r = current(ctx);
    if (r) return r;
    CUstream s = (CUstream)stream;
    for (size_t lo = 0; lo < nbytes; lo += bounce_size) {
        size_t n = nbytes - lo < bounce_size ? nbytes - lo : bounce_size;
        if (to_device) {
            memcpy((void *)bounce, (const char *)(uintptr_t)src + lo, n);
            r = cu.h2d(dst + lo, (const void *)bounce, n, s);
            if (!r) r = finish(s, spin_ns);
        } else {
            r = cu.d2h((void *)bounce, src + lo, n, s);
            if (!r) r = finish(s, spin_ns);
            if (!r) memcpy((char *)(uintptr_t)dst + lo, (const void *)bounce, n);
        }
        if (r) return r;
    }
    return 0;
}

int vkc_memset(uintptr_t ctx, uintptr_t stream, uint64_t dst, size_t nbytes, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    CUresult r = current(ctx);
    if (r) return r;
    r = cu.memset8(dst, 0, nbytes, (CUstream)stream);
    return r ? r : finish((CUstream)stream, spin_ns);
}

/* The reduce kernel takes its destinations and sources by value, as structs of
   VKC_MAX_SOURCES pointers. */
#define VKC_MAX_SOURCES 8
int vkc_reduce(uintptr_t ctx, uintptr_t stream, uintptr_t fn, const uint64_t *dsts,
               int ndst, const uint64_t *srcs, int nsrc, uint64_t count, unsigned grid,
               unsigned block, int64_t spin_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    if (nsrc < 1 || nsrc > VKC_MAX_SOURCES || ndst < 1 || ndst > VKC_MAX_SOURCES)
        return 1;  /* CUDA_ERROR_INVALID_VALUE */
    CUresult r = current(ctx);
    if (r) return r;
    uint64_t src_by_value[VKC_MAX_SOURCES] = {0}, dst_by_value[VKC_MAX_SOURCES] = {0};
    memcpy(src_by_value, srcs, (size_t)nsrc * sizeof(uint64_t));
    memcpy(dst_by_value, dsts, (size_t)ndst * sizeof(uint64_t));
    void *params[] = {dst_by_value, &ndst, src_by_value, &nsrc, &count};
    r = cu.launch((CUfunction)fn, grid, 1, 1, block, 1, 1, 0, (CUstream)stream, params, 0);
    if (r || spin_ns < 0) return r;  /* spin_ns < 0: issued only (the caller waits) */
    return finish((CUstream)stream, spin_ns);
}
