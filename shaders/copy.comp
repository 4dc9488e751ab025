// Device-side copy of `count` elements from `src` to `dst` (device addresses). Built as
// ELEM_BITS=8 (copy_u8.spv: bytes, needs storageBuffer8BitAccess), ELEM_BITS=32 (copy_u32.spv:
// 4-byte words) and ELEM_BITS=128 (copy_u128.spv: 16-byte vectors, what reaches HBM rate).
// Ranges must not overlap. Each invocation copies elements i, i + N, i + 2N, ... (N the
// invocations dispatched), so the host may dispatch fewer workgroups than elements; it keeps
// the stride loop short (lavapipe cuts loops of more than 65,535 iterations).
#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

#if ELEM_BITS == 8
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#define ELEM uint8_t
#define ELEM_ALIGN 1
#elif ELEM_BITS == 128
#define ELEM uvec4
#define ELEM_ALIGN 16
#else
#define ELEM uint
#define ELEM_ALIGN 4
#endif

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = ELEM_ALIGN) buffer Elems {
    ELEM v[];
};

layout(push_constant) uniform Push {
    uint64_t dst;
    uint64_t src;
    uint count;
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    Elems dst = Elems(pc.dst);
    Elems src = Elems(pc.src);
    uint i = gl_GlobalInvocationID.x;
#if ELEM_BITS == 128
    // Four loads in flight before their stores: more memory-level parallelism per thread.
    for (; i + 3u * stride < pc.count; i += 4u * stride) {
        ELEM a = src.v[i];
        ELEM b = src.v[i + stride];
        ELEM c = src.v[i + 2u * stride];
        ELEM d = src.v[i + 3u * stride];
        dst.v[i] = a;
        dst.v[i + stride] = b;
        dst.v[i + 2u * stride] = c;
        dst.v[i + 3u * stride] = d;
    }
#endif
    for (; i < pc.count; i += stride) {
        dst.v[i] = src.v[i];
    }
}
