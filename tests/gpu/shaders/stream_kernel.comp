// Test kernel of Vulkan streams (tests/pe/gpu_vkstream.py): a user kernel on both sides of
// stream-ordered communication. Invocation i < count, uint32 words at byte offsets of this
// PE's GPU heap:
//   mode 0 (produce): dst[i] = salt + 65536 * my_pe + i;
//   mode 1 (consume): dst[i] = 3 * src[i] + 1.
// No loops and no vkshmem calls: the header only gives the heap's address.
#version 460
#include "vkshmem.glsl"

layout(local_size_x = 64) in;

layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer U32s {
    uint v[];
};

layout(push_constant) uniform Push {
    VKS_PUSH_HEADER
    uint64_t src_off;  // 32
    uint64_t dst_off;  // 40
    uint count;        // 48
    uint mode;         // 52
    uint salt;         // 56
} pc;
VKS_USE_PUSH(pc)

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.count) {
        return;
    }
    U32s dst = U32s(vks_heap_addr(pc.dst_off));
    if (pc.mode == 0u) {
        dst.v[i] = pc.salt + 65536u * vks_my_pe() + i;
    } else {
        dst.v[i] = 3u * U32s(vks_heap_addr(pc.src_off)).v[i] + 1u;
    }
}
