/* Stream-ordered operations of the cuda domain (vkshmem_cuda/streams.py): one-thread AMOs, a
   bounded wait on a word and a bounded barrier, each launched on the user's stream.

   Waits are bounded by %globaltimer (timeout_ns; 0 never happens: the host always gives one).
   A wait that times out records the first failure in `fail` (mapped pinned host memory, 8
   words: [0] kind (1 wait, 2 barrier; written last), [1] address or member index, [2] cmp,
   [3] value, [4] the value seen, [5] the writers' lock) and returns: the stream goes on. While
   a failure is recorded and not yet raised by the host, later waits return at once. */
typedef unsigned long long u64;

__device__ __forceinline__ u64 vks_now(void) {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 vks_load(const u64 *p) { return *(const volatile u64 *)p; }

__device__ __forceinline__ bool vks_cmp(u64 a, int cmp, u64 b) {
    switch (cmp) {
    case 1: return a == b;
    case 2: return a != b;
    case 3: return a > b;
    case 4: return a <= b;
    case 5: return a < b;
    default: return a >= b; /* 6: GE */
    }
}

__device__ void vks_fail(u64 *fail, u64 kind, u64 what, u64 cmp, u64 value, u64 seen) {
    if (atomicCAS_system(fail + 5, 0ull, 1ull) != 0ull) return; /* the first one is kept */
    fail[1] = what;
    fail[2] = cmp;
    fail[3] = value;
    fail[4] = seen;
    __threadfence_system();
    atomicExch_system(fail, kind);
}

/* Spin until *word cmp value; false (failure recorded) on timeout or an earlier failure. */
__device__ bool vks_spin(const u64 *word, int cmp, u64 value, u64 timeout_ns, u64 *fail,
                         u64 kind, u64 what) {
    u64 seen = vks_load(word);
    if (vks_cmp(seen, cmp, value)) return true;
    u64 start = vks_now();
    for (;;) {
        if (vks_load(fail)) return false;
        seen = vks_load(word);
        if (vks_cmp(seen, cmp, value)) return true;
        if (vks_now() - start > timeout_ns) {
            vks_fail(fail, kind, what, (u64)cmp, value, seen);
            return false;
        }
    }
}

extern "C" __global__ void vkshmem_stream_wait(const u64 *word, int cmp, u64 value,
                                               u64 timeout_ns, u64 *fail) {
    vks_spin(word, cmp, value, timeout_ns, fail, 1, (u64)word);
    __threadfence_system(); /* what the peer wrote before the word is read after it */
}

/* Non-fetching AMOs at system scope (the word may be another GPU's, over NVLink):
   op 1 SET, 4 ADD, 5 AND, 6 OR, 7 XOR (vkshmem's AmoOp numbers). */
extern "C" __global__ void vkshmem_stream_amo(u64 addr, int op, int width, u64 operand) {
    __threadfence_system(); /* earlier writes of this stream's kernels are seen first */
    if (width == 8) {
        u64 *p = (u64 *)addr;
        switch (op) {
        case 1: atomicExch_system(p, operand); break;
        case 4: atomicAdd_system(p, operand); break;
        case 5: atomicAnd_system(p, operand); break;
        case 6: atomicOr_system(p, operand); break;
        case 7: atomicXor_system(p, operand); break;
        }
    } else {
        unsigned *p = (unsigned *)addr;
        unsigned v = (unsigned)operand;
        switch (op) {
        case 1: atomicExch_system(p, v); break;
        case 4: atomicAdd_system(p, v); break;
        case 5: atomicAnd_system(p, v); break;
        case 6: atomicOr_system(p, v); break;
        case 7: atomicXor_system(p, v); break;
        }
    }
}

#define VKS_MAX_MEMBERS 32
struct vks_words { u64 p[VKS_MAX_MEMBERS]; };

/* Thread i: member i. Arrive: raise this PE's word in member i's counters to seq (monotonic:
   atomicMax); then wait until member i's word in this PE's counters reached seq. */
extern "C" __global__ void vkshmem_stream_barrier(vks_words arrive, vks_words mine, int n,
                                                  u64 seq, u64 timeout_ns, u64 *fail) {
    int i = threadIdx.x;
    __threadfence_system(); /* the stream's earlier writes before the arrival */
    if (i < n) {
        atomicMax_system((u64 *)arrive.p[i], seq);
        vks_spin((const u64 *)mine.p[i], 6, seq, timeout_ns, fail, 2, (u64)i);
    }
    __syncthreads();
    __threadfence_system();
}
