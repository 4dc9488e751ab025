// In-place elementwise reduction dst[i] = op(dst[i], src[i]) for i < count, one element per
// invocation; the building block of GPU-domain collectives. Built once per element type
// (-DDTYPE=...):
//   1 int32 (reduce_i32)   2 int64 (reduce_i64)   3 uint32 (reduce_u32)  4 uint64 (reduce_u64)
//   5 float32 (reduce_f32) 6 float64 (reduce_f64)
//   7 int8 (reduce_i8)     8 uint8 (reduce_u8)    9 int16 (reduce_i16)  10 uint16 (reduce_u16)
//  11 float16 (reduce_f16)
//  12 complex64 (reduce_c64)  13 complex128 (reduce_c128): one complex per invocation,
//     stored as (re, im) pairs of float/double; SUM and PROD only (the host sends complex
//     sums to reduce_f32/f64 over 2 * count scalars, so only PROD comes here).
// Ops: SUM 0, PROD 1, MIN 2, MAX 3, AND 4, OR 5, XOR 6 (bitwise ops only on integers; integer
// sums and products wrap as numpy's do; min/max of NaN are undefined).
// The 8-bit variants need shaderInt8 + storageBuffer8BitAccess, the 16-bit integer ones
// shaderInt16 + storageBuffer16BitAccess, float16 shaderFloat16 + storageBuffer16BitAccess
// (buffer_reference memory is the PhysicalStorageBuffer storage class: the storageBuffer*
// features cover it). The host checks them before using a variant.
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
#elif DTYPE == 7 || DTYPE == 8
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#if DTYPE == 7
#define T int8_t
#else
#define T uint8_t
#endif
#define T_ALIGN 1
#elif DTYPE == 9 || DTYPE == 10
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#if DTYPE == 9
#define T int16_t
#else
#define T uint16_t
#endif
#define T_ALIGN 2
#elif DTYPE == 11
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define T float16_t
#define T_ALIGN 2
#define T_FLOAT 1
#elif DTYPE == 12
#define T float
#define T_ALIGN 4
#define T_COMPLEX 1
#elif DTYPE == 13
#define T double
#define T_ALIGN 8
#define T_COMPLEX 1
#else
#error "DTYPE must be 1..13"
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
    Elems s = Elems(pc.src);
#ifdef T_COMPLEX
    // (a + bi)(c + di) = (ac - bd) + (ad + bc)i, as numpy computes it; `precise` forbids
    // fusing into FMAs, which would round differently.
    T a = d.v[2u * i];
    T b = d.v[2u * i + 1u];
    T c = s.v[2u * i];
    T e = s.v[2u * i + 1u];
    precise T re = a;
    precise T im = b;
    switch (pc.op) {
        case 0u: re = a + c; im = b + e; break;
        case 1u: re = a * c - b * e; im = a * e + b * c; break;
        default: break;
    }
    d.v[2u * i] = re;
    d.v[2u * i + 1u] = im;
#else
    T a = d.v[i];
    T b = s.v[i];
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
#endif
}
