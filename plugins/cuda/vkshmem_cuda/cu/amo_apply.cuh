typedef unsigned long long u64;
/* The OpenSHMEM AMO ``op`` (vkshmem's AmoOp numbers) on the word at addr; the old value. */
__device__ __forceinline__ u64 amo_apply(u64 addr, int op, int width, u64 operand,
                                         u64 compare) {
    u64 old = 0;
    if (width == 8) {
        u64 *p = (u64 *)addr;
        switch (op) {
        case 0: old = atomicAdd(p, 0ull); break;                 /* FETCH */
        case 1: case 2: old = atomicExch(p, operand); break;    /* SET, SWAP */
        case 3: old = atomicCAS(p, compare, operand); break;    /* CSWAP */
        case 4: old = atomicAdd(p, operand); break;
        case 5: old = atomicAnd(p, operand); break;
        case 6: old = atomicOr(p, operand); break;
        case 7: old = atomicXor(p, operand); break;
        }
    } else {
        unsigned *p = (unsigned *)addr;
        unsigned v = (unsigned)operand, c = (unsigned)compare;
        switch (op) {
        case 0: old = atomicAdd(p, 0u); break;
        case 1: case 2: old = atomicExch(p, v); break;
        case 3: old = atomicCAS(p, c, v); break;
        case 4: old = atomicAdd(p, v); break;
        case 5: old = atomicAnd(p, v); break;
        case 6: old = atomicOr(p, v); break;
        case 7: old = atomicXor(p, v); break;
        }
    }
    return old;
}
