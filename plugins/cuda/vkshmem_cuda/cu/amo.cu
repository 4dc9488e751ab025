/* out[0] = the old value, then out[1] = seq: the host (out is mapped pinned memory) returns
   once it sees seq, without waiting for the kernel's completion to reach the stream. */
extern "C" __global__ void vkshmem_amo(u64 addr, int op, int width, u64 operand, u64 compare,
                                       u64 *out, u64 seq) {
    u64 old = amo_apply(addr, op, width, operand, compare);
    out[0] = old;
    __threadfence_system();
    ((volatile u64 *)out)[1] = seq;
}
