/* A copy whose stores bypass the caches (x86-64: SSE2 streaming stores; elsewhere memmove),
 * for data another process reads next: a line that process read last time is invalidated, not
 * fetched back from its core, before it is written. Shared by the _fast module (a large
 * broadcast's root) and the _native one (the GPU proxy's pieces into a peer's mailbox). */
#ifndef VKSHMEM_COPY_STREAM_H
#define VKSHMEM_COPY_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
static inline void copy_stream(char *dst, const char *src, size_t n) {
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 64; dst += 64, src += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src),
                b = _mm_loadu_si128((const __m128i *)(src + 16)),
                c = _mm_loadu_si128((const __m128i *)(src + 32)),
                d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    memcpy(dst, src, n);
    _mm_sfence();
}
#else
#define copy_stream(dst, src, n) memmove(dst, src, n)
#endif

#endif
