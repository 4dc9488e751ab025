// Kernels of benchmarks/device_api.py (compiled at run time with -DMODE=0/1/2):
//   0: nothing (the floor: dispatch to completion of an empty kernel);
//   1: each workgroup puts its chunk of [src, src + chunk * groups) to PE `target`'s GPU heap
//      at dst and adds 1 to the signal at sig there (vks_put_signal_block);
//   2: the same bytes copied inside this PE's own heap (the ceiling: vks_put_block to itself).
#version 460
#include "vkshmem.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Push {
    VKS_PUSH_HEADER
    uint64_t src_off;  // 32
    uint64_t dst_off;  // 40
    uint64_t sig_off;  // 48
    uint64_t chunk;    // 56: bytes per workgroup (a multiple of 4)
    uint target;       // 64
} pc;
VKS_USE_PUSH(pc)

void main() {
#if MODE == 1
    uint64_t off = pc.chunk * uint64_t(gl_WorkGroupID.x);
    vks_put_signal_block(pc.target, pc.dst_off + off, pc.src_off + off, pc.chunk, pc.sig_off,
                         1ul, VKS_SIGNAL_ADD);
#elif MODE == 2
    uint64_t off = pc.chunk * uint64_t(gl_WorkGroupID.x);
    vks_put_block(vks_my_pe(), pc.dst_off + off, pc.src_off + off, pc.chunk);
#endif
}
