// vkshmem device-side API, part 1: the request ring's layout and the calls that take the ring
// explicitly. Included by vkshmem.glsl (include that, not this file); see its header comment.
#ifndef VKSHMEM_RING_GLSL
#define VKSHMEM_RING_GLSL

#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require
#extension GL_KHR_memory_scope_semantics : require

// -- layout (keep in sync with vkshmem/gpu/ring.py and shaders/README.md) -----------------
#define VKS_RING_MAGIC 0x474E5256u  // "VRNG"
#define VKS_RING_VERSION 2u
#define VKS_RING_HEADER 256ul
#define VKS_DESC_SIZE 64ul

#define VKS_OP_NOP 0u
#define VKS_OP_PUT 1u
#define VKS_OP_GET 2u
#define VKS_OP_AMO 3u
#define VKS_OP_SIGNAL 4u
#define VKS_OP_PUT_SIGNAL 5u
#define VKS_OP_FENCE 6u
#define VKS_OP_QUIET 7u

#define VKS_SEG_HOST 0u
#define VKS_SEG_GPU 1u

// AmoOp codes (vkshmem.plugin.AmoOp)
#define VKS_AMO_FETCH 0u
#define VKS_AMO_SET 1u
#define VKS_AMO_SWAP 2u
#define VKS_AMO_CSWAP 3u
#define VKS_AMO_ADD 4u
#define VKS_AMO_AND 5u
#define VKS_AMO_OR 6u
#define VKS_AMO_XOR 7u

#define VKS_SIGNAL_SET 0u
#define VKS_SIGNAL_ADD 1u

#define VKS_NO_TICKET 0xFFFFFFFFFFFFFFFFul
// The "ticket" of an operation done by direct loads and stores: complete on return (a wait on
// it returns true at once).
#define VKS_DIRECT 0xFFFFFFFFFFFFFFFEul
#define VKS_DIRECT_ALL 1u
#define VKS_DIRECT_SHARED 2u
// kernel_error bits (vkshmem.gpu.ring.KERNEL_ERRORS says them on the host)
#define VKS_KERR_SHARED_BARRIER 1u  // vks_barrier_all on a GPU other PEs' kernels share
#define VKS_KERR_SHARED_WAIT 2u     // a wait gave up on such a GPU

// Comparisons of vks_wait_until / vks_signal_wait_until (vkshmem.shmem.CMP).
#define VKS_CMP_EQ 1u
#define VKS_CMP_NE 2u
#define VKS_CMP_GT 3u
#define VKS_CMP_LE 4u
#define VKS_CMP_LT 5u
#define VKS_CMP_GE 6u
// Bit 63 of `done`: the host failed a request; the ring is dead (every wait returns false).
#define VKS_DONE_FAILED 0x8000000000000000ul

// Passes of a wait loop, and the delay per pass. The defaults suit lavapipe (a pass there
// costs ~5 us, so a wait gives up after ~40 ms; at most ~7 waits per shader); on a GPU,
// where host-visible atomics are slow and there is no loop budget, define a larger
// VKS_SPIN_ITERATIONS and VKS_DELAY_ROUNDS 1 before including this file.
#ifndef VKS_SPIN_ITERATIONS
#define VKS_SPIN_ITERATIONS 8192u
#endif
#ifndef VKS_DELAY_ROUNDS
#define VKS_DELAY_ROUNDS 4
#endif

// flags: bits 0-3 dst segment, 4-7 src segment, 8-11 AMO op, 12-15 width (bytes),
// 16-17 signal op; the rest 0.
uint vks_flags(uint dst_seg, uint src_seg, uint amo_op, uint width, uint sig_op) {
    return (dst_seg & 15u) | ((src_seg & 15u) << 4) | ((amo_op & 15u) << 8)
         | ((width & 15u) << 12) | ((sig_op & 3u) << 16);
}

layout(buffer_reference, std430, buffer_reference_align = 64) coherent buffer VksRingHeader {
    uint magic;
    uint version;
    uint capacity;       // descriptors in the ring, a power of two
    uint desc_size;      // 64
    uint64_t peers;      // offset 16: device address of the peer table (u64 per PE: its GPU
                         // heap's base on this device, 0 where not mapped); 0: none
    uint64_t sync_off;   // offset 24: the device-sync block's offset in the GPU heap; 0: none
    uint direct_flags;   // offset 32: bit 0 (VKS_DIRECT_ALL) every PE is in the peer table;
                         // bit 1 (VKS_DIRECT_SHARED) another PE's kernels run on this GPU and
                         // never at the same time as this PE's (separate processes' contexts)
    uint spin_limit;     // offset 36: passes a wait may spin on this device (0: the
                         // compile-time VKS_SPIN_ITERATIONS; the runtime sets it on GPUs)
    uint kernel_error;   // offset 40: VKS_KERR_* bits a kernel sets; the host raises them
    uint reserved1;
    uint64_t reserved0[2];
    uint64_t head;       // offset 64: next ticket; producers claim tickets here
    uint64_t pad1[7];
    uint64_t tail;       // offset 128: next ticket the host will consume (host-written)
    uint64_t pad2[7];
    uint64_t done;       // offset 192: requests completed, in ticket order (host-written)
    uint64_t pad3[6];
    uint64_t spin;       // offset 248: scratch that waiting shaders hit with atomics (delay)
};

layout(buffer_reference, std430, buffer_reference_align = 64) coherent buffer VksDesc {
    uint op;             //  0
    uint pe;             //  4: target PE
    uint64_t dst;        //  8: offset in the dst segment (on `pe`; GET: on this PE)
    uint64_t src;        // 16: offset in the src segment (on this PE; GET: on `pe`)
    uint64_t nbytes;     // 24
    uint64_t value;      // 32: AMO operand, signal value
    uint64_t aux;        // 40: CSWAP compare; PUT_SIGNAL signal offset (in the dst segment)
    uint64_t result;     // 48: device address for a fetched value (0: none)
    uint flags;          // 56
    uint seq;            // 60: uint(ticket + 1), stored last: the descriptor is published
};

layout(buffer_reference, std430, buffer_reference_align = 8) coherent buffer VksU64 {
    uint64_t v;
};

layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer VksU32 {
    uint v;
};

// Passes a wait may spin: the runtime's limit for this device (ring header, set on GPUs where
// waits for another process's kernel last time slices), else VKS_SPIN_ITERATIONS (lavapipe,
// whose loop budget needs the compile-time bound).
uint vks_spin_limit(VksRingHeader r) {
    uint limit = r.spin_limit;
    return limit != 0u ? limit : VKS_SPIN_ITERATIONS;
}

uint64_t vks_load(VksRingHeader r, uint which) {
    // which: 0 head, 1 tail, 2 done. Device-scope relaxed atomic loads (see above).
    if (which == 0u) {
        return atomicLoad(r.head, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
    }
    if (which == 1u) {
        return atomicLoad(r.tail, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
    }
    return atomicLoad(r.done, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
}

// Atomics on the header's scratch word: a delay that spends no loop budget (no loop).
void vks_delay16(VksRingHeader r) {
    atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul);
    atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul);
    atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul);
    atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul); atomicAdd(r.spin, 1ul);
}

void vks_delay(VksRingHeader r) {
    vks_delay16(r);
#if VKS_DELAY_ROUNDS > 1
    vks_delay16(r);
#endif
#if VKS_DELAY_ROUNDS > 2
    vks_delay16(r);
#endif
#if VKS_DELAY_ROUNDS > 3
    vks_delay16(r);
#endif
}

// Claim a ticket only when its slot is free (so a claimed ticket is always published), write
// the descriptor, publish it. Returns the ticket, or VKS_NO_TICKET if the ring stayed full.
uint64_t vks_enqueue(uint64_t ring, uint op, uint pe, uint64_t dst, uint64_t src,
                     uint64_t nbytes, uint64_t value, uint64_t aux, uint64_t result,
                     uint flags) {
    VksRingHeader r = VksRingHeader(ring);
    uint64_t cap = uint64_t(r.capacity);
    uint64_t t = VKS_NO_TICKET;
    uint limit = vks_spin_limit(r);
    for (uint i = 0u; i < limit; ++i) {
        uint64_t h = vks_load(r, 0u);
        if (h - vks_load(r, 1u) >= cap) {
            if ((vks_load(r, 2u) & VKS_DONE_FAILED) != 0ul) {
                break;  // full and the host gave up on the ring: nobody will consume
            }
            vks_delay(r);
            continue;  // full: wait for the host to consume
        }
        if (atomicCompSwap(r.head, h, h + 1ul) == h) {
            t = h;
            break;
        }
    }
    if (t == VKS_NO_TICKET) {
        return t;
    }
    VksDesc d = VksDesc(ring + VKS_RING_HEADER + (t & (cap - 1ul)) * VKS_DESC_SIZE);
    d.op = op;
    d.pe = pe;
    d.dst = dst;
    d.src = src;
    d.nbytes = nbytes;
    d.value = value;
    d.aux = aux;
    d.result = result;
    d.flags = flags;
    memoryBarrierBuffer();
    atomicStore(d.seq, uint(t + 1ul), gl_ScopeDevice, gl_StorageSemanticsBuffer,
                gl_SemanticsRelease);
    return t;
}

// Wait until request `ticket` (and every earlier one) is complete. False if the spin budget
// ran out first (the request stays queued; wait again or report it), or if the host failed a
// request (VKS_DONE_FAILED: results are not to be trusted).
bool vks_wait(uint64_t ring, uint64_t ticket) {
    if (ticket == VKS_NO_TICKET) {
        return false;
    }
    if (ticket == VKS_DIRECT) {
        return true;
    }
    VksRingHeader r = VksRingHeader(ring);
    bool ok = false;
    uint limit = vks_spin_limit(r);
    for (uint i = 0u; i < limit; ++i) {
        // Several polls and slow atomics on a scratch word per pass stretch lavapipe's
        // per-invocation loop budget. A poisoned `done` (bit 63) exceeds every ticket.
        uint64_t d = vks_load(r, 2u);
        if (d <= ticket) {
            d = vks_load(r, 2u);
        }
        if (d <= ticket) {
            d = vks_load(r, 2u);
        }
        if (d <= ticket) {
            d = vks_load(r, 2u);
        }
        if (d > ticket) {
            ok = (d & VKS_DONE_FAILED) == 0ul;
            break;
        }
        vks_delay(r);
    }
    // Acquire: results the host wrote are read after this. Outside the loop on purpose (see
    // the lavapipe note at the top).
    memoryBarrierBuffer();
    return ok;
}

// Whether the host gave up on the ring (a request failed; see VKS_DONE_FAILED).
bool vks_failed(uint64_t ring) {
    return (vks_load(VksRingHeader(ring), 2u) & VKS_DONE_FAILED) != 0ul;
}

// -- the API, ring explicit --------------------------------------------------------------
// Each call returns the request's ticket (VKS_NO_TICKET: the ring stayed full); the request
// is complete once vks_wait(ring, ticket) returns true, or after a vks_quiet(ring) that
// returned true.

uint64_t vks_put_seg(uint64_t ring, uint pe, uint dst_seg, uint64_t dst, uint src_seg,
                     uint64_t src, uint64_t nbytes) {
    return vks_enqueue(ring, VKS_OP_PUT, pe, dst, src, nbytes, 0ul, 0ul, 0ul,
                       vks_flags(dst_seg, src_seg, 0u, 0u, 0u));
}

// Copy `nbytes` from offset `src` of this PE's GPU heap to offset `dst` of PE `pe`'s.
uint64_t vks_put(uint64_t ring, uint pe, uint64_t dst, uint64_t src, uint64_t nbytes) {
    return vks_put_seg(ring, pe, VKS_SEG_GPU, dst, VKS_SEG_GPU, src, nbytes);
}

// Copy `nbytes` from offset `src` of PE `pe`'s segment `src_seg` to offset `dst` of this PE's
// segment `dst_seg`.
uint64_t vks_get_seg(uint64_t ring, uint pe, uint dst_seg, uint64_t dst, uint src_seg,
                     uint64_t src, uint64_t nbytes) {
    return vks_enqueue(ring, VKS_OP_GET, pe, dst, src, nbytes, 0ul, 0ul, 0ul,
                       vks_flags(dst_seg, src_seg, 0u, 0u, 0u));
}

uint64_t vks_get(uint64_t ring, uint pe, uint64_t dst, uint64_t src, uint64_t nbytes) {
    return vks_get_seg(ring, pe, VKS_SEG_GPU, dst, VKS_SEG_GPU, src, nbytes);
}

// Post an AMO (VKS_AMO_*) on the `width`-byte (4 or 8) word at `dst` of PE `pe`'s segment
// `seg`; when `result` is a device address, the old value lands there once
// vks_wait(ring, ticket) returns true. CSWAP: `compare` is the condition, `value` the new value.
uint64_t vks_atomic_post_seg(uint64_t ring, uint pe, uint seg, uint64_t dst, uint amo_op,
                             uint width, uint64_t value, uint64_t compare, uint64_t result) {
    return vks_enqueue(ring, VKS_OP_AMO, pe, dst, 0ul, uint64_t(width), value, compare, result,
                       vks_flags(seg, seg, amo_op, width, 0u));
}

uint64_t vks_atomic_post(uint64_t ring, uint pe, uint64_t dst, uint amo_op, uint width,
                         uint64_t value, uint64_t compare, uint64_t result) {
    return vks_atomic_post_seg(ring, pe, VKS_SEG_GPU, dst, amo_op, width, value, compare,
                               result);
}

// A blocking AMO that fetches: post, wait, read the old value from `result` (a device address
// of host-visible memory, aligned to `width`). `ok` is false when the wait gave up.
uint64_t vks_atomic_fetch_op(uint64_t ring, uint pe, uint64_t dst, uint amo_op, uint width,
                             uint64_t value, uint64_t compare, uint64_t result, out bool ok) {
    uint64_t t = vks_atomic_post(ring, pe, dst, amo_op, width, value, compare, result);
    ok = vks_wait(ring, t);
    if (!ok) {
        return 0ul;
    }
    return width == 4u ? uint64_t(VksU32(result).v) : VksU64(result).v;
}

// Blocking fetch-add on a 64-bit word; `scratch` is a device address for the result.
// Returns false in `ok` when the wait ran out of spin budget.
uint64_t vks_atomic_fetch_add(uint64_t ring, uint pe, uint64_t dst, uint64_t value,
                              uint64_t scratch, out bool ok) {
    return vks_atomic_fetch_op(ring, pe, dst, VKS_AMO_ADD, 8u, value, 0ul, scratch, ok);
}

// Signal word `sig` (a uint64 at offset `sig` of `seg` on PE `pe`): SET or ADD `value`.
uint64_t vks_signal_seg(uint64_t ring, uint pe, uint seg, uint64_t sig, uint64_t value,
                        uint sig_op) {
    return vks_enqueue(ring, VKS_OP_SIGNAL, pe, sig, 0ul, 8ul, value, 0ul, 0ul,
                       vks_flags(seg, seg, 0u, 8u, sig_op));
}

uint64_t vks_signal(uint64_t ring, uint pe, uint64_t sig, uint64_t value, uint sig_op) {
    return vks_signal_seg(ring, pe, VKS_SEG_GPU, sig, value, sig_op);
}

// A put, then (once the data are delivered) a signal on the uint64 at `sig` of the
// destination segment of PE `pe`.
uint64_t vks_put_signal_seg(uint64_t ring, uint pe, uint dst_seg, uint64_t dst, uint src_seg,
                            uint64_t src, uint64_t nbytes, uint64_t sig, uint64_t value,
                            uint sig_op) {
    return vks_enqueue(ring, VKS_OP_PUT_SIGNAL, pe, dst, src, nbytes, value, sig, 0ul,
                       vks_flags(dst_seg, src_seg, 0u, 8u, sig_op));
}

uint64_t vks_put_signal(uint64_t ring, uint pe, uint64_t dst, uint64_t src, uint64_t nbytes,
                        uint64_t sig, uint64_t value, uint sig_op) {
    return vks_put_signal_seg(ring, pe, VKS_SEG_GPU, dst, VKS_SEG_GPU, src, nbytes, sig, value,
                              sig_op);
}

// Order: puts enqueued before it are delivered before those enqueued after it, per target PE.
uint64_t vks_fence(uint64_t ring) {
    return vks_enqueue(ring, VKS_OP_FENCE, 0u, 0ul, 0ul, 0ul, 0ul, 0ul, 0ul, 0u);
}

// Remote completion of every request enqueued before it (by any invocation). False when the
// wait gave up or the host failed a request.
bool vks_quiet(uint64_t ring) {
    return vks_wait(ring, vks_enqueue(ring, VKS_OP_QUIET, 0u, 0ul, 0ul, 0ul, 0ul, 0ul, 0ul, 0u));
}

#endif  // VKSHMEM_RING_GLSL
