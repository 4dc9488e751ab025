// One atomic memory operation per invocation on a word addressed by device address.
//
// Built twice: AMO_WIDTH=32 (amo_u32.spv) and AMO_WIDTH=64 (amo_u64.spv, needs
// shaderBufferInt64Atomics). Invocation i (< count) applies descriptor i of the array at
// `descs` and writes the word's previous value into the descriptor's `old`. Op codes are
// vkshmem.plugin.AmoOp: FETCH 0, SET 1, SWAP 2, CSWAP 3, ADD 4, AND 5, OR 6, XOR 7.
// Because these are the device's own atomics, they are atomic with every other shader atomic
// on the same word (and, where the memory is shared with another process, with its atomics).
#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

#if AMO_WIDTH == 64
#extension GL_EXT_shader_atomic_int64 : require
#define WORD uint64_t
#define WORD_ALIGN 8
#else
#define WORD uint
#define WORD_ALIGN 4
#endif

layout(local_size_x = 64) in;

// 48 bytes; the host fills addr/operand/compare/op/width and reads old.
layout(buffer_reference, std430, buffer_reference_align = 16) buffer AmoDesc {
    uint64_t addr;     // device address of the target word (buffer address + offset)
    uint64_t operand;  // unsigned bit pattern (low 32 bits used at 32-bit width)
    uint64_t compare;  // CSWAP only
    uint64_t old;      // out: the word before the operation
    uint op;
    uint width;        // bytes: 4 or 8, must match AMO_WIDTH
    uint pad0;
    uint pad1;
};

layout(buffer_reference, std430, buffer_reference_align = WORD_ALIGN) coherent buffer Word {
    WORD v;
};

layout(push_constant) uniform Push {
    uint64_t descs;  // device address of AmoDesc[count]
    uint count;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.count) {
        return;
    }
    AmoDesc d = AmoDesc(pc.descs + uint64_t(i) * 48ul);
    Word w = Word(d.addr);
    WORD x = WORD(d.operand);
    WORD c = WORD(d.compare);
    WORD old = WORD(0);
    switch (d.op) {
        case 0u: old = atomicAdd(w.v, WORD(0)); break;      // FETCH
        case 1u: old = atomicExchange(w.v, x); break;       // SET
        case 2u: old = atomicExchange(w.v, x); break;       // SWAP
        case 3u: old = atomicCompSwap(w.v, c, x); break;    // CSWAP
        case 4u: old = atomicAdd(w.v, x); break;            // ADD
        case 5u: old = atomicAnd(w.v, x); break;            // AND
        case 6u: old = atomicOr(w.v, x); break;             // OR
        case 7u: old = atomicXor(w.v, x); break;            // XOR
        default: break;
    }
    d.old = uint64_t(old);
}
