// Test kernel of the device API's calls on every scope (tests/pe/gpu_direct.py, run at 1, 2
// and 4 PEs: direct where the peers' heaps are mapped, through the ring where they are not).
// One dispatch per phase (`mode`); the host runs a barrier between phases, so phases 0-1 never
// wait for another PE, phases 2 and 4 do (kernels of different PEs waiting for each other).
//
// Symmetric GPU arrays (offsets in the push constants): buf u32[2048] (this PE's data), dst
// u32[2048] (puts land in [0, 1024), gets in [1024, 2048)), words u64[32], out u64[64]
// (results, read by the host). right = (me + 1) % n, left = (me - 1) % n; f(pe, j) =
// salt + 65536 * pe + j.
//
// mode 0 (1 workgroup): fill buf with f(me, j); invocation 0: put buf[0, 1024) to right's
//   dst, fence, p right's words[0] = salt + me, quiet, signal right's words[1] += 1,
//   atomic_set right's words[12] = salt; out[0] = vks_ptr(right, 0) != 0.
// mode 1 (1 workgroup, invocation 0): checks what left sent in mode 0 (out[1] mismatches,
//   out[2] words[0], out[3] words[1]); get right's buf[0, 256) into dst[1024, 1280) and count
//   mismatches (out[4]); g right's words[12] (out[5]); fetching AMOs on right's words[2..8]
//   (out[6..13], see below); out[14] quiet; out[15] the waits that gave up (ring path only:
//   lavapipe's loop budget bounds a kernel's waiting to ~100 ms in all).
// mode 2 (4 workgroups of 64): each workgroup put_signal_block's buf[256 w, 256 w + 256) to
//   right's dst at the same place with words[13] += 1; workgroup 0 get_block's right's
//   buf[0, 512) into dst[1024, 1536), mismatches in out[24].
// mode 6 (1 workgroup, dispatched right after mode 2, no host barrier between): invocation 0
//   waits for its own words[13] >= 4 * round (left's four blocks; workgroups of one dispatch
//   have no forward-progress guarantee among each other, so the waiting is a kernel of its
//   own) and counts mismatches in them (out[16]); out[20] the wait's result.
// mode 3 (8 workgroups of 64): every invocation fetch_adds 1 to PE 0's words[10] (64 bit) and
//   words[11] low half (32 bit); out[30] the fetches that failed.
// mode 4 (1 workgroup, invocation 0): `rounds` times: p right's words[14] = salt + i, then
//   vks_barrier_all(); then its own words[14] must be salt + i (left stored it before the
//   barrier): out[32] mismatches, out[33] barriers that failed.
// mode 5 (1 workgroup, invocation 0): a wait nobody satisfies returns false: out[40] = 1 when
//   vks_wait_until on words[15] == 12345 gave up, out[41] = vks_failed().
// Built once per phase (-DMODE=0..6: direct_api_0 ... direct_api_6, see
// vkshmem.gpu.shaders.TEST_VARIANTS): every call inlines its ring path too, and lavapipe's
// LLVM takes minutes over one module holding every phase.
#version 460
#ifndef MODE
#error "compile with -DMODE=0..6"
#endif
#define VKS_SPIN_ITERATIONS 30000u
#define VKS_DELAY_ROUNDS 2
#include "vkshmem.glsl"

layout(local_size_x = 64) in;

layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer U32s {
    uint v[];
};

layout(buffer_reference, std430, buffer_reference_align = 8) coherent buffer U64s {
    uint64_t v[];
};

layout(push_constant) uniform Push {
    VKS_PUSH_HEADER
    uint64_t buf_off;    // 32
    uint64_t dst_off;    // 40
    uint64_t words_off;  // 48
    uint64_t out_off;    // 56
    uint mode;           // 64 (MODE: the host passes it too, for its own bookkeeping)
    uint salt;           // 68
    uint rounds;         // 72: the round number (1, 2, ...), or mode 4's barrier count
} pc;
VKS_USE_PUSH(pc)

uint f(uint pe, uint j) {
    return pc.salt + 65536u * pe + j;
}

uint64_t word(uint i) {
    return pc.words_off + 8ul * uint64_t(i);
}

void main() {
    uint me = vks_my_pe();
    uint n = vks_n_pes();
    uint right = (me + 1u) % n;
    uint left = (me + n - 1u) % n;
    U32s buf = U32s(vks_heap_addr(pc.buf_off));
    U32s dst = U32s(vks_heap_addr(pc.dst_off));
    U64s res = U64s(vks_heap_addr(pc.out_off));
    uint lane = gl_LocalInvocationIndex;
    uint wg = gl_WorkGroupID.x;

    if (MODE == 0u) {
        for (uint j = lane; j < 2048u; j += 64u) {
            buf.v[j] = f(me, j);
        }
        memoryBarrierBuffer();
        barrier();
        if (lane == 0u) {
            vks_put(right, pc.dst_off, pc.buf_off, 4096ul);
            vks_fence();
            vks_p(right, word(0u), uint64_t(pc.salt + me));
            vks_quiet();
            vks_signal(right, word(1u), 1ul, VKS_SIGNAL_ADD);
            vks_atomic_set(right, word(12u), uint64_t(pc.salt));
            vks_quiet();
            res.v[0] = vks_ptr(right, 0ul) != 0ul ? 1ul : 0ul;
        }
    } else if (MODE == 1u) {
        if (lane != 0u) {
            return;
        }
        uint bad = 0u;
        for (uint j = 0u; j < 1024u; ++j) {
            bad += dst.v[j] == f(left, j) ? 0u : 1u;
        }
        res.v[1] = uint64_t(bad);
        res.v[2] = U64s(vks_heap_addr(word(0u))).v[0];
        res.v[3] = U64s(vks_heap_addr(word(1u))).v[0];
        uint64_t t = vks_get(right, pc.dst_off + 4096ul, pc.buf_off, 1024ul);
        bool ok = vks_wait(t);
        bad = ok ? 0u : 1000u;
        for (uint j = 0u; j < 256u; ++j) {
            bad += dst.v[1024u + j] == f(right, j) ? 0u : 1u;
        }
        res.v[4] = uint64_t(bad);
        uint failed = bad >= 1000u ? 1u : 0u;
        res.v[5] = vks_g(right, word(12u), vks_scratch_addr(0ul), ok);
        failed += ok ? 0u : 1u;
        // words[2..8] of right start at 0 in every round (the host clears them)
        uint64_t scratch = vks_scratch_addr(8ul);
        res.v[6] = vks_atomic_fetch_add(right, word(2u), 5ul, scratch, ok);         // 0
        failed += ok ? 0u : 1u;
        res.v[7] = vks_atomic_fetch_add(right, word(2u), 1ul, scratch, ok);         // 5
        failed += ok ? 0u : 1u;
        res.v[8] = vks_atomic_compare_swap(right, word(3u), 0ul, 77ul, scratch, ok);  // 0
        failed += ok ? 0u : 1u;
        res.v[9] = vks_atomic_compare_swap(right, word(3u), 0ul, 88ul, scratch, ok);  // 77
        failed += ok ? 0u : 1u;
        res.v[10] = vks_atomic_swap(right, word(4u), 9ul, scratch, ok);             // 0
        failed += ok ? 0u : 1u;
        vks_atomic_or(right, word(5u), 0xF0ul);
        vks_atomic_xor(right, word(5u), 0x3Cul);
        vks_atomic_and(right, word(5u), 0xFFul);
        res.v[11] = vks_atomic_fetch(right, word(5u), scratch, ok);                 // 0xCC
        failed += ok ? 0u : 1u;
        res.v[12] = vks_atomic_fetch_op(right, word(6u), VKS_AMO_ADD, 4u, 3ul, 0ul, scratch,
                                        ok);                                        // 0
        failed += ok ? 0u : 1u;
        res.v[13] = vks_atomic_fetch_op(right, word(6u), VKS_AMO_FETCH, 4u, 0ul, 0ul, scratch,
                                        ok);                                        // 3
        failed += ok ? 0u : 1u;
        res.v[14] = vks_quiet() ? 1ul : 0ul;
        res.v[15] = uint64_t(failed);
    } else if (MODE == 2u) {
        uint64_t off = 1024ul * uint64_t(wg);  // 256 u32 per workgroup
        vks_put_signal_block(right, pc.dst_off + off, pc.buf_off + off, 1024ul, word(13u), 1ul,
                             VKS_SIGNAL_ADD);
        if (wg == 0u) {
            uint64_t t = vks_get_block(right, pc.dst_off + 4096ul, pc.buf_off, 2048ul);
            bool ok = vks_wait(t);
            if (lane == 0u) {
                uint bad = ok ? 0u : 1000u;
                for (uint j = 0u; j < 512u; ++j) {
                    bad += dst.v[1024u + j] == f(right, j) ? 0u : 1u;
                }
                res.v[24] = uint64_t(bad);
            }
        }
    } else if (MODE == 6u) {
        // dispatched right after mode 2 without a host barrier: waits for left's mode 2
        // kernel, which may still be running (a kernel waiting for another PE's kernel)
        if (lane == 0u) {
            bool ok;
            uint64_t sig = vks_signal_wait_until(word(13u), VKS_CMP_GE,
                                                 4ul * uint64_t(pc.rounds), ok);
            res.v[20] = ok && sig >= 4ul * uint64_t(pc.rounds) ? 1ul : 0ul;
            uint bad = 0u;
            for (uint j = 0u; j < 1024u; ++j) {
                bad += dst.v[j] == f(left, j) ? 0u : 1u;
            }
            res.v[16] = uint64_t(bad);
        }
    } else if (MODE == 3u) {
        bool ok;
        vks_atomic_fetch_add(0u, word(10u), 1ul, vks_scratch_addr(64ul + 8ul * uint64_t(lane)),
                             ok);
        bool ok32;
        vks_atomic_fetch_op(0u, word(11u), VKS_AMO_ADD, 4u, 1ul, 0ul,
                            vks_scratch_addr(1024ul + 8ul * uint64_t(lane)), ok32);
        if (!ok || !ok32) {
            atomicAdd(res.v[30], 1ul);
        }
    } else if (MODE == 4u) {
        if (lane != 0u) {
            return;
        }
        uint bad = 0u;
        uint failed = 0u;
        for (uint i = 0u; i < pc.rounds; ++i) {
            vks_p(right, word(14u), uint64_t(pc.salt + i));
            if (!vks_barrier_all()) {
                ++failed;
            }
            uint64_t got = atomicLoad(U64s(vks_heap_addr(word(14u))).v[0], gl_ScopeDevice,
                                      gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
            bad += got == uint64_t(pc.salt + i) ? 0u : 1u;
            if (!vks_barrier_all()) {  // nobody overwrites words[14] before it was read
                ++failed;
            }
        }
        res.v[32] = uint64_t(bad);
        res.v[33] = uint64_t(failed);
    } else if (MODE == 5u) {
        if (lane == 0u) {
            res.v[40] = vks_wait_until(word(15u), VKS_CMP_EQ, 12345ul) ? 0ul : 1ul;
            res.v[41] = vks_failed() ? 1ul : 0ul;
        }
    }
}
