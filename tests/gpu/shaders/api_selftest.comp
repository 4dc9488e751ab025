// Test kernel of the device-side API on the push header's ring (tests/test_gpu_launch.py):
// every call of vkshmem.glsl that a user kernel makes, each against the PE itself.
//
// Invocation i < count has a 64-byte area A = area_off + 64 * i of the GPU heap (the host
// puts x = 1000 * i + 1 in its first uint64) and a 16-byte area H = host_off + 16 * i of the
// host segment, and runs kind k = (i / 8) % 13 on PE vks_my_pe() (8 lanes in a row, a SIMD
// group of lavapipe, run the same kind: their loops are shared, see below; a ring of 256
// holds every request of 104 invocations):
//    0 vks_put A+8 <- A (8 bytes)             1 vks_get A+8 <- A (8 bytes)
//    2 vks_atomic_fetch_add A, i + 1           3 vks_atomic_compare_swap A, cond x, 7 * i
//    4 vks_atomic_swap A, 5 * i + 1            5 vks_atomic_fetch A
//    6 vks_atomic_add A, i                     7 vks_atomic_set A, 3 * i
//    8 vks_signal A ADD i                      9 vks_put_signal A+8 <- A (8), A+16 SET i + 100
//   10 vks_atomic_fetch_op A XOR 0xFF, 4 bytes 11 vks_put_seg host H <- gpu A (8 bytes)
//   12 vks_fence, then vks_signal_seg host H+8 SET i
// A fetched value lands in scratch word 4 * i (the result slot) and is copied to word
// 4 * i + 1; word 4 * i + 2 = my_pe << 32 | n_pes; word 4 * i + 3 = status: bit 0 the request
// completed (its wait returned true), bit 1 the final vks_quiet() returned true.
//
// lavapipe: every call site inlines its loops, and llvmpipe's compile time grows faster than
// their size (this kernel: ~15 s with the default 4 delay rounds, ~2 s with 1). With one round
// a pass is ~4x shorter, so more passes keep a wait at a few ms: a SIMD group runs at most
// three enqueues (one pass each: the ring is sized for every request) and two waits, so
// 2 x 30,000 passes stay under the 65,535-pass budget.
#version 460
#define VKS_DELAY_ROUNDS 1
#define VKS_SPIN_ITERATIONS 30000u
#include "vkshmem.glsl"

layout(local_size_x = 32) in;

layout(buffer_reference, std430, buffer_reference_align = 8) coherent buffer U64s {
    uint64_t v[];
};

layout(push_constant) uniform Push {
    VKS_PUSH_HEADER
    uint64_t area_off;  // 32
    uint64_t host_off;  // 40
    uint count;         // 48
} pc;
VKS_USE_PUSH(pc)

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.count) {
        return;
    }
    uint me = vks_my_pe();
    uint64_t j = uint64_t(i);
    uint64_t a = pc.area_off + 64ul * j;
    uint64_t h = pc.host_off + 16ul * j;
    uint64_t x = 1000ul * j + 1ul;
    uint64_t res = vks_scratch_addr(32ul * j);
    uint64_t t = VKS_NO_TICKET;
    uint64_t v = 0ul;
    bool ok = false;
    bool fetched = true;
    uint kind = (i / 8u) % 13u;
    switch (kind) {
        case 2u: v = vks_atomic_fetch_add(me, a, j + 1ul, res, ok); break;
        case 3u: v = vks_atomic_compare_swap(me, a, x, 7ul * j, res, ok); break;
        case 4u: v = vks_atomic_swap(me, a, 5ul * j + 1ul, res, ok); break;
        case 5u: v = vks_atomic_fetch(me, a, res, ok); break;
        case 10u: v = vks_atomic_fetch_op(me, a, VKS_AMO_XOR, 4u, 0xFFul, 0ul, res, ok); break;
        default: fetched = false; break;
    }
    switch (kind) {
        case 0u: t = vks_put(me, a + 8ul, a, 8ul); break;
        case 1u: t = vks_get(me, a + 8ul, a, 8ul); break;
        case 6u: t = vks_atomic_add(me, a, j); break;
        case 7u: t = vks_atomic_set(me, a, 3ul * j); break;
        case 8u: t = vks_signal(me, a, j, VKS_SIGNAL_ADD); break;
        case 9u: t = vks_put_signal(me, a + 8ul, a, 8ul, a + 16ul, j + 100ul, VKS_SIGNAL_SET);
                 break;
        case 11u: t = vks_put_seg(me, VKS_SEG_HOST, h, VKS_SEG_GPU, a, 8ul); break;
        case 12u: vks_fence(); t = vks_signal_seg(me, VKS_SEG_HOST, h + 8ul, j, VKS_SIGNAL_SET);
                  break;
        default: break;
    }
    if (!fetched) {
        ok = vks_wait(t);
    }
    bool q = vks_quiet();
    U64s s = U64s(vks_scratch());
    s.v[4u * i + 1u] = v;
    s.v[4u * i + 2u] = (uint64_t(me) << 32) | uint64_t(vks_n_pes());
    s.v[4u * i + 3u] = (ok ? 1ul : 0ul) | (q ? 2ul : 0ul);
}
