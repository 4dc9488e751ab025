// vkshmem device-side API (sketch): GPU-initiated communication through a request ring.
//
//   #include "vkshmem.glsl"
//   ... uint64_t t = vks_put(ring, pe, dst_offset, src_offset, nbytes); vks_quiet(ring);
//
// A shader cannot drive a NIC, so it writes fixed-size request descriptors into a ring in
// host-visible memory; the PE's host proxy thread drains the ring (vkshmem/gpu/ring.py is its
// Python reference), performs each request through the chosen transport and then advances the
// ring's `done` counter, which shaders wait on. shaders/README.md documents the layout; the
// host side (vkshmem.gpu.ring) uses the same offsets.
//
// Addresses: dst/src are byte offsets in symmetric segments (segment ids in the flags: 0 host,
// 1 gpu), so they mean the same on every PE; `result` is a device address of this PE where
// the host writes a fetched value.
//
// Memory model: the ring is `coherent`; head/tail/done are read with device-scope atomic
// loads (a plain load in a loop may never observe a host write: seen on NVIDIA), relaxed,
// followed by memoryBarrierBuffer() after the wait loop; a descriptor is published by a
// release atomic store of its `seq` after a buffer memory barrier.
// lavapipe 22.3 trap: a memory barrier inside a loop that invocations leave at different
// iterations (an acquire atomicLoad is one, or memoryBarrierBuffer() in the loop body) breaks
// the invocations of that SIMD group: they stop writing anything. Keep barriers out of loops.
//
// lavapipe (Mesa 22.3): a SIMD group of invocations (8 lanes) may run at most 65,535 loop
// passes in total, across all its loops (divergent lanes' loops add up); past that, loops are
// cut short and control flow goes wrong (lanes run code meant for others). Every wait here
// is therefore bounded by VKS_SPIN_ITERATIONS passes (each slowed down by atomics on a
// scratch word) and reports failure instead of hanging: keep VKS_SPIN_ITERATIONS times the
// number of waits a shader can run well under 65,535, and the ring's capacity at least the
// number of requests in flight.
#ifndef VKSHMEM_GLSL
#define VKSHMEM_GLSL

#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require
#extension GL_KHR_memory_scope_semantics : require

// -- layout (keep in sync with vkshmem/gpu/ring.py and shaders/README.md) -----------------
#define VKS_RING_MAGIC 0x474E5256u  // "VRNG"
#define VKS_RING_VERSION 1u
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

// AmoOp codes (vkshmem.core.transport.AmoOp)
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
    uint64_t reserved0[6];
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
    for (uint i = 0u; i < VKS_SPIN_ITERATIONS; ++i) {
        uint64_t h = vks_load(r, 0u);
        if (h - vks_load(r, 1u) >= cap) {
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
// ran out first (the request stays queued; wait again or report it).
bool vks_wait(uint64_t ring, uint64_t ticket) {
    if (ticket == VKS_NO_TICKET) {
        return false;
    }
    VksRingHeader r = VksRingHeader(ring);
    bool ok = false;
    for (uint i = 0u; i < VKS_SPIN_ITERATIONS; ++i) {
        // Several polls and slow atomics on a scratch word per pass stretch lavapipe's
        // per-invocation loop budget.
        if (vks_load(r, 2u) > ticket || vks_load(r, 2u) > ticket || vks_load(r, 2u) > ticket
            || vks_load(r, 2u) > ticket) {
            ok = true;
            break;
        }
        vks_delay(r);
    }
    // Acquire: results the host wrote are read after this. Outside the loop on purpose (see
    // the lavapipe note at the top).
    memoryBarrierBuffer();
    return ok;
}

// -- the API --------------------------------------------------------------------------------

uint64_t vks_put_seg(uint64_t ring, uint pe, uint dst_seg, uint64_t dst, uint src_seg,
                     uint64_t src, uint64_t nbytes) {
    return vks_enqueue(ring, VKS_OP_PUT, pe, dst, src, nbytes, 0ul, 0ul, 0ul,
                       vks_flags(dst_seg, src_seg, 0u, 0u, 0u));
}

uint64_t vks_put(uint64_t ring, uint pe, uint64_t dst, uint64_t src, uint64_t nbytes) {
    return vks_put_seg(ring, pe, VKS_SEG_GPU, dst, VKS_SEG_GPU, src, nbytes);
}

uint64_t vks_get(uint64_t ring, uint pe, uint64_t dst, uint64_t src, uint64_t nbytes) {
    return vks_enqueue(ring, VKS_OP_GET, pe, dst, src, nbytes, 0ul, 0ul, 0ul,
                       vks_flags(VKS_SEG_GPU, VKS_SEG_GPU, 0u, 0u, 0u));
}

// Post an AMO on the `width`-byte word at `dst` of PE `pe` (GPU segment); when `result` is a
// device address, the old value lands there once vks_wait(ring, ticket) returns true.
uint64_t vks_atomic_post(uint64_t ring, uint pe, uint64_t dst, uint amo_op, uint width,
                         uint64_t value, uint64_t compare, uint64_t result) {
    return vks_enqueue(ring, VKS_OP_AMO, pe, dst, 0ul, uint64_t(width), value, compare, result,
                       vks_flags(VKS_SEG_GPU, VKS_SEG_GPU, amo_op, width, 0u));
}

// Blocking fetch-add on a 64-bit word; `scratch` is a device address for the result.
// Returns false in `ok` when the wait ran out of spin budget.
uint64_t vks_atomic_fetch_add(uint64_t ring, uint pe, uint64_t dst, uint64_t value,
                              uint64_t scratch, out bool ok) {
    uint64_t t = vks_atomic_post(ring, pe, dst, VKS_AMO_ADD, 8u, value, 0ul, scratch);
    ok = vks_wait(ring, t);
    return ok ? VksU64(scratch).v : 0ul;
}

uint64_t vks_signal(uint64_t ring, uint pe, uint64_t sig, uint64_t value, uint sig_op) {
    return vks_enqueue(ring, VKS_OP_SIGNAL, pe, sig, 0ul, 8ul, value, 0ul, 0ul,
                       vks_flags(VKS_SEG_GPU, VKS_SEG_GPU, 0u, 8u, sig_op));
}

uint64_t vks_put_signal(uint64_t ring, uint pe, uint64_t dst, uint64_t src, uint64_t nbytes,
                        uint64_t sig, uint64_t value, uint sig_op) {
    return vks_enqueue(ring, VKS_OP_PUT_SIGNAL, pe, dst, src, nbytes, value, sig, 0ul,
                       vks_flags(VKS_SEG_GPU, VKS_SEG_GPU, 0u, 8u, sig_op));
}

uint64_t vks_fence(uint64_t ring) {
    return vks_enqueue(ring, VKS_OP_FENCE, 0u, 0ul, 0ul, 0ul, 0ul, 0ul, 0ul, 0u);
}

// Remote completion of every request enqueued before it (by any invocation).
bool vks_quiet(uint64_t ring) {
    return vks_wait(ring, vks_enqueue(ring, VKS_OP_QUIET, 0u, 0ul, 0ul, 0ul, 0ul, 0ul, 0ul, 0u));
}

#endif  // VKSHMEM_GLSL
