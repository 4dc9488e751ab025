// Test kernel of GPU-initiated communication (tests/test_gpu_launch.py; the multi-PE tests of
// the runtime): a put-with-signal to the next PE, then a quiet.
//
// Invocation i < count writes f(my_pe, i) = salt + 65536 * my_pe + i (uint32, wrapping) at
// offset src_off + 4 * i of this PE's GPU heap. Then invocation 0 of each workgroup (after a
// barrier) requests, for its workgroup's elements [first, first + n):
//   put_signal to PE (my_pe + 1) % n_pes: bytes [src_off + 4 * first, + 4 * n) -> dst_off +
//   4 * first of that PE's GPU heap, then the uint64 signal at sig_off of its GPU heap gets
//   sig_op (0 SET, 1 ADD) sig_value;
// then waits for a vks_quiet(), and writes its workgroup's status (uint32) at status_off +
// 4 * workgroup of this PE's GPU heap: 1 the quiet returned, 2 the ring stayed full (nothing
// was enqueued), 3 the quiet's wait gave up or the ring failed.
// With sig_op ADD and sig_value 1, the target's signal ends at the number of workgroups,
// ceil(count / 64). Requests in flight: 2 per workgroup (size the ring for them).
#version 460
// One lane per workgroup runs at most three bounded loops (two enqueues, one wait): 3 x 20,000
// passes stay under lavapipe's 65,535 per SIMD group, and a wait gives up after ~10-20 ms
// there (the default 8,192 passes: ~5 ms, tight for a host under load).
#define VKS_SPIN_ITERATIONS 20000u
#include "vkshmem.glsl"

layout(local_size_x = 64) in;

layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer U32s {
    uint v[];
};

layout(push_constant) uniform Push {
    VKS_PUSH_HEADER
    uint64_t src_off;     // 32
    uint64_t dst_off;     // 40
    uint64_t sig_off;     // 48
    uint64_t status_off;  // 56
    uint count;           // 64
    uint salt;            // 68
    uint sig_op;          // 72
    uint sig_value;       // 76
} pc;
VKS_USE_PUSH(pc)

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.count) {
        U32s(vks_heap_addr(pc.src_off)).v[i] = pc.salt + 65536u * vks_my_pe() + i;
    }
    // Every lane's write is visible to lane 0 (and, through its release in the enqueue, to
    // the host) before the request is published. In uniform control flow, outside any loop.
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x != 0u) {
        return;
    }
    uint first = gl_WorkGroupID.x * gl_WorkGroupSize.x;
    if (first >= pc.count) {
        return;
    }
    uint n = min(pc.count - first, gl_WorkGroupSize.x);
    uint target = (vks_my_pe() + 1u) % vks_n_pes();
    uint64_t off = 4ul * uint64_t(first);
    uint64_t t = vks_put_signal(target, pc.dst_off + off, pc.src_off + off, 4ul * uint64_t(n),
                                pc.sig_off, uint64_t(pc.sig_value), pc.sig_op);
    uint status = 2u;
    if (t != VKS_NO_TICKET) {
        status = vks_quiet() ? 1u : 3u;
    }
    U32s(vks_heap_addr(pc.status_off)).v[gl_WorkGroupID.x] = status;
}
