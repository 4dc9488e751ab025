// Device-side copy of `count` elements from `src` to `dst` (device addresses), one element
// per invocation. Built as ELEM_BITS=8 (copy_u8.spv: bytes, needs storageBuffer8BitAccess)
// and ELEM_BITS=32 (copy_u32.spv: 4-byte words). Ranges must not overlap. The host splits
// large copies into dispatches of at most maxComputeWorkGroupCount[0] workgroups.
#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

#if ELEM_BITS == 8
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#define ELEM uint8_t
#define ELEM_ALIGN 1
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
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.count) {
        Elems(pc.dst).v[i] = Elems(pc.src).v[i];
    }
}
