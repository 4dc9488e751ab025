// In-place elementwise reduction dst[i] = op(dst[i], src[i]) for i < count, one element per
// invocation; the building block of GPU-domain collectives. Built once per element type:
// -DDTYPE=1..6 for int32, int64, uint32, uint64, float32, float64 (reduce_i32.spv ...
// reduce_f64.spv). Ops: SUM 0, PROD 1, MIN 2, MAX 3, AND 4, OR 5, XOR 6 (bitwise ops only on
// integers; integer sums and products wrap as numpy's do; min/max of NaN are undefined).
// `src` may equal `dst` but must not partially overlap it.
#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

#if DTYPE == 1
#define T int
#define T_ALIGN 4
#elif DTYPE == 2
#define T int64_t
#define T_ALIGN 8
#elif DTYPE == 3
#define T uint
#define T_ALIGN 4
#elif DTYPE == 4
#define T uint64_t
#define T_ALIGN 8
#elif DTYPE == 5
#define T float
#define T_ALIGN 4
#define T_FLOAT 1
#elif DTYPE == 6
#define T double
#define T_ALIGN 8
#define T_FLOAT 1
#else
#error "DTYPE must be 1..6"
#endif

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = T_ALIGN) buffer Elems {
    T v[];
};

layout(push_constant) uniform Push {
    uint64_t dst;
    uint64_t src;
    uint count;
    uint op;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.count) {
        return;
    }
    Elems d = Elems(pc.dst);
    T a = d.v[i];
    T b = Elems(pc.src).v[i];
    T r = a;
    switch (pc.op) {
        case 0u: r = a + b; break;
        case 1u: r = a * b; break;
        case 2u: r = min(a, b); break;
        case 3u: r = max(a, b); break;
#ifndef T_FLOAT
        case 4u: r = a & b; break;
        case 5u: r = a | b; break;
        case 6u: r = a ^ b; break;
#endif
        default: break;
    }
    d.v[i] = r;
}
