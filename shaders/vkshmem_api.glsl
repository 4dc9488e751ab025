// vkshmem device-side API, part 2: the calls on the push header's ring and heap, direct where
// the peer is mapped. Included by vkshmem.glsl (include that, not this file).
#ifndef VKSHMEM_API_GLSL
#define VKSHMEM_API_GLSL

// -- the API on the header's ring: direct where the peer is mapped ------------------------
// These calls take the direct path for a PE whose GPU heap this device maps (vks_ptr(pe, 0)
// != 0: this PE itself, and same-device peers; the runtime fills the peer table): plain
// loads and stores (16-byte units where dst, src and nbytes are multiples of 16, else 4-byte
// words) and the device's own atomics on the peer's memory, with no request and no host in
// the loop; such an operation is complete when the call returns (ticket VKS_DIRECT). Other
// PEs (another node, another GPU without a link), host-heap segments, and GPU-heap ranges not
// 4-byte aligned go through the ring as before.
//
// Memory model (see shaders/README.md, "Direct path"): every direct access is to `coherent`
// memory at device scope. vks_fence()/vks_quiet() are memoryBarrierBuffer() (device scope,
// acquire-release on buffer memory) plus the ring's fence/quiet where some PE is not mapped;
// a signal is a device-scope atomic after a memoryBarrierBuffer(), so a peer that sees the
// signal (by an atomic load) sees the data put before it.
//
// lavapipe's loop budget: a direct copy by one invocation loops nbytes / 16 (or / 4) times,
// counted against the 65,535 passes per SIMD group: keep a thread-scope copy under ~512 KiB
// (16-byte units) there, or use the workgroup calls (vks_put_block), which split the loop.

layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer VksPeerTable {
    uint64_t base[];
};

layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer VksU128 {
    uvec4 v;
};

// Device address of byte 0 of PE `pe`'s GPU heap on this device, or 0 when kernels reach it
// only through the ring.
uint64_t vks_peer_base(uint pe) {
    VksRingHeader r = VksRingHeader(vks_ring());
    if (r.peers == 0ul || pe >= vks_n_pes()) {
        return 0ul;
    }
    return VksPeerTable(r.peers).base[pe];
}

// Device address of byte `offset` of PE `pe`'s GPU heap for direct loads and stores, or 0
// where the PE is not mapped (shmem_ptr / nvshmem_ptr).
uint64_t vks_ptr(uint pe, uint64_t offset) {
    uint64_t base = vks_peer_base(pe);
    return base == 0ul ? 0ul : base + offset;
}

// Whether fence/quiet can skip the ring (every PE is mapped).
bool vks_direct_all() {
    return (VksRingHeader(vks_ring()).direct_flags & VKS_DIRECT_ALL) != 0u;
}

bool vks_direct_ok(uint64_t base, uint64_t a, uint64_t b, uint64_t nbytes) {
    return base != 0ul && ((a | b | nbytes) & 3ul) == 0ul;
}

// Invocation `lane` of `lanes` copies its share of [src, src + nbytes) to dst (device
// addresses, 4-byte aligned): every lanes-th 16-byte unit (or 4-byte word).
void vks_copy(uint64_t dst, uint64_t src, uint64_t nbytes, uint lane, uint lanes) {
    if (((dst | src | nbytes) & 15ul) == 0ul) {
        uint64_t n = nbytes >> 4;
        for (uint64_t i = uint64_t(lane); i < n; i += uint64_t(lanes)) {
            VksU128(dst + 16ul * i).v = VksU128(src + 16ul * i).v;
        }
    } else {
        uint64_t n = nbytes >> 2;
        for (uint64_t i = uint64_t(lane); i < n; i += uint64_t(lanes)) {
            VksU32(dst + 4ul * i).v = VksU32(src + 4ul * i).v;
        }
    }
}

// The device's own atomic `amo_op` on the `width`-byte word at device address `addr`;
// returns the old value.
uint64_t vks_amo_direct(uint64_t addr, uint amo_op, uint width, uint64_t value,
                        uint64_t compare) {
    // an if chain, not a switch: a switch on a run-time op misbehaved on lavapipe 22.3
    if (width == 4u) {
        uint v = uint(value);
        VksU32 w = VksU32(addr);
        uint old = 0u;
        if (amo_op == VKS_AMO_FETCH) {
            old = atomicAdd(w.v, 0u);
        } else if (amo_op == VKS_AMO_SET || amo_op == VKS_AMO_SWAP) {
            old = atomicExchange(w.v, v);
        } else if (amo_op == VKS_AMO_CSWAP) {
            old = atomicCompSwap(w.v, uint(compare), v);
        } else if (amo_op == VKS_AMO_ADD) {
            old = atomicAdd(w.v, v);
        } else if (amo_op == VKS_AMO_AND) {
            old = atomicAnd(w.v, v);
        } else if (amo_op == VKS_AMO_OR) {
            old = atomicOr(w.v, v);
        } else if (amo_op == VKS_AMO_XOR) {
            old = atomicXor(w.v, v);
        }
        return uint64_t(old);
    }
    VksU64 w = VksU64(addr);
    uint64_t old = 0ul;
    if (amo_op == VKS_AMO_FETCH) {
        old = atomicAdd(w.v, 0ul);
    } else if (amo_op == VKS_AMO_SET || amo_op == VKS_AMO_SWAP) {
        old = atomicExchange(w.v, value);
    } else if (amo_op == VKS_AMO_CSWAP) {
        old = atomicCompSwap(w.v, compare, value);
    } else if (amo_op == VKS_AMO_ADD) {
        old = atomicAdd(w.v, value);
    } else if (amo_op == VKS_AMO_AND) {
        old = atomicAnd(w.v, value);
    } else if (amo_op == VKS_AMO_OR) {
        old = atomicOr(w.v, value);
    } else if (amo_op == VKS_AMO_XOR) {
        old = atomicXor(w.v, value);
    }
    return old;
}

// Release the data written before, then update the signal word at device address `addr`.
void vks_signal_direct(uint64_t addr, uint64_t value, uint sig_op) {
    memoryBarrierBuffer();
    if (sig_op == VKS_SIGNAL_ADD) {
        atomicAdd(VksU64(addr).v, value);
    } else {
        atomicExchange(VksU64(addr).v, value);
    }
}

uint64_t vks_put_seg(uint pe, uint dst_seg, uint64_t dst, uint src_seg, uint64_t src,
                     uint64_t nbytes) {
    uint64_t base = dst_seg == VKS_SEG_GPU && src_seg == VKS_SEG_GPU ? vks_peer_base(pe) : 0ul;
    if (vks_direct_ok(base, dst, src, nbytes)) {
        vks_copy(base + dst, vks_heap() + src, nbytes, 0u, 1u);
        return VKS_DIRECT;
    }
    return vks_put_seg(vks_ring(), pe, dst_seg, dst, src_seg, src, nbytes);
}

// Copy `nbytes` from offset `src` of this PE's GPU heap to offset `dst` of PE `pe`'s
// (thread scope: this invocation alone).
uint64_t vks_put(uint pe, uint64_t dst, uint64_t src, uint64_t nbytes) {
    return vks_put_seg(pe, VKS_SEG_GPU, dst, VKS_SEG_GPU, src, nbytes);
}

uint64_t vks_get_seg(uint pe, uint dst_seg, uint64_t dst, uint src_seg, uint64_t src,
                     uint64_t nbytes) {
    uint64_t base = dst_seg == VKS_SEG_GPU && src_seg == VKS_SEG_GPU ? vks_peer_base(pe) : 0ul;
    if (vks_direct_ok(base, dst, src, nbytes)) {
        vks_copy(vks_heap() + dst, base + src, nbytes, 0u, 1u);
        return VKS_DIRECT;
    }
    return vks_get_seg(vks_ring(), pe, dst_seg, dst, src_seg, src, nbytes);
}

// Copy `nbytes` from offset `src` of PE `pe`'s GPU heap to offset `dst` of this PE's. Through
// the ring the data are there once the ticket is waited on (or after vks_quiet()).
uint64_t vks_get(uint pe, uint64_t dst, uint64_t src, uint64_t nbytes) {
    return vks_get_seg(pe, VKS_SEG_GPU, dst, VKS_SEG_GPU, src, nbytes);
}

// Single 64-bit words (nvshmem_p / nvshmem_g). vks_g: `ok` false when the ring path's wait
// gave up; `result` (ring path only) is where the host writes the word (host-visible memory,
// e.g. vks_scratch_addr(8 * i)).
uint64_t vks_p(uint pe, uint64_t dst, uint64_t value) {
    uint64_t base = vks_peer_base(pe);
    if (base != 0ul && (dst & 7ul) == 0ul) {
        VksU64(base + dst).v = value;
        return VKS_DIRECT;
    }
    return vks_atomic_post(vks_ring(), pe, dst, VKS_AMO_SET, 8u, value, 0ul, 0ul);
}

uint64_t vks_g(uint pe, uint64_t src, uint64_t result, out bool ok) {
    uint64_t base = vks_peer_base(pe);
    if (base != 0ul && (src & 7ul) == 0ul) {
        ok = true;
        return VksU64(base + src).v;
    }
    result = result != 0ul ? result : vks_scratch();  // the host needs somewhere to write
    if (result == 0ul) {
        ok = false;
        return 0ul;
    }
    return vks_atomic_fetch_op(vks_ring(), pe, src, VKS_AMO_FETCH, 8u, 0ul, 0ul, result, ok);
}

uint64_t vks_signal_seg(uint pe, uint seg, uint64_t sig, uint64_t value, uint sig_op) {
    uint64_t base = seg == VKS_SEG_GPU ? vks_peer_base(pe) : 0ul;
    if (base != 0ul && (sig & 7ul) == 0ul) {
        vks_signal_direct(base + sig, value, sig_op);
        return VKS_DIRECT;
    }
    return vks_signal_seg(vks_ring(), pe, seg, sig, value, sig_op);
}

uint64_t vks_signal(uint pe, uint64_t sig, uint64_t value, uint sig_op) {
    return vks_signal_seg(pe, VKS_SEG_GPU, sig, value, sig_op);
}

uint64_t vks_put_signal_seg(uint pe, uint dst_seg, uint64_t dst, uint src_seg, uint64_t src,
                            uint64_t nbytes, uint64_t sig, uint64_t value, uint sig_op) {
    uint64_t base = dst_seg == VKS_SEG_GPU && src_seg == VKS_SEG_GPU ? vks_peer_base(pe) : 0ul;
    if (vks_direct_ok(base, dst, src, nbytes) && (sig & 7ul) == 0ul) {
        vks_copy(base + dst, vks_heap() + src, nbytes, 0u, 1u);
        vks_signal_direct(base + sig, value, sig_op);
        return VKS_DIRECT;
    }
    return vks_put_signal_seg(vks_ring(), pe, dst_seg, dst, src_seg, src, nbytes, sig, value,
                              sig_op);
}

uint64_t vks_put_signal(uint pe, uint64_t dst, uint64_t src, uint64_t nbytes, uint64_t sig,
                        uint64_t value, uint sig_op) {
    return vks_put_signal_seg(pe, VKS_SEG_GPU, dst, VKS_SEG_GPU, src, nbytes, sig, value,
                              sig_op);
}

// Order this invocation's operations to each PE: earlier ones are delivered before later ones.
uint64_t vks_fence() {
    memoryBarrierBuffer();
    return vks_direct_all() ? VKS_DIRECT : vks_fence(vks_ring());
}

// Complete every operation issued before it: direct stores are visible at device scope, ring
// requests (of any invocation) are done. False when a ring wait gave up or the ring failed.
bool vks_quiet() {
    memoryBarrierBuffer();
    return vks_direct_all() ? true : vks_quiet(vks_ring());
}

bool vks_wait(uint64_t ticket) {
    return vks_wait(vks_ring(), ticket);
}

bool vks_failed() {
    return vks_failed(vks_ring());
}

// AMOs on the GPU heap. Without fetch: return the ticket (VKS_DIRECT: done; a ring ticket is
// complete at a later vks_quiet()). Where `result` is a device address the old value lands
// there as well.
uint64_t vks_atomic_post_seg(uint pe, uint seg, uint64_t dst, uint amo_op, uint width,
                             uint64_t value, uint64_t compare, uint64_t result) {
    uint64_t base = seg == VKS_SEG_GPU ? vks_peer_base(pe) : 0ul;
    if (base != 0ul && (width == 4u || width == 8u) && (dst & uint64_t(width - 1u)) == 0ul) {
        uint64_t old = vks_amo_direct(base + dst, amo_op, width, value, compare);
        if (result != 0ul) {
            if (width == 4u) {
                VksU32(result).v = uint(old);
            } else {
                VksU64(result).v = old;
            }
        }
        return VKS_DIRECT;
    }
    return vks_atomic_post_seg(vks_ring(), pe, seg, dst, amo_op, width, value, compare,
                               result);
}

uint64_t vks_atomic_post(uint pe, uint64_t dst, uint amo_op, uint width, uint64_t value,
                         uint64_t compare, uint64_t result) {
    return vks_atomic_post_seg(pe, VKS_SEG_GPU, dst, amo_op, width, value, compare, result);
}

uint64_t vks_atomic_add(uint pe, uint64_t dst, uint64_t value) {
    return vks_atomic_post(pe, dst, VKS_AMO_ADD, 8u, value, 0ul, 0ul);
}

uint64_t vks_atomic_set(uint pe, uint64_t dst, uint64_t value) {
    return vks_atomic_post(pe, dst, VKS_AMO_SET, 8u, value, 0ul, 0ul);
}

uint64_t vks_atomic_and(uint pe, uint64_t dst, uint64_t value) {
    return vks_atomic_post(pe, dst, VKS_AMO_AND, 8u, value, 0ul, 0ul);
}

uint64_t vks_atomic_or(uint pe, uint64_t dst, uint64_t value) {
    return vks_atomic_post(pe, dst, VKS_AMO_OR, 8u, value, 0ul, 0ul);
}

uint64_t vks_atomic_xor(uint pe, uint64_t dst, uint64_t value) {
    return vks_atomic_post(pe, dst, VKS_AMO_XOR, 8u, value, 0ul, 0ul);
}

// Fetching AMOs (`width` 4 or 8): the old value. Direct: at once, `ok` true. Ring: block
// until the host wrote it to `result` (host-visible memory, e.g. vks_scratch_addr(8 * i));
// `ok` false when the wait gave up or the ring failed (the value is then 0).
uint64_t vks_atomic_fetch_op(uint pe, uint64_t dst, uint amo_op, uint width, uint64_t value,
                             uint64_t compare, uint64_t result, out bool ok) {
    uint64_t base = vks_peer_base(pe);
    if (base != 0ul && (width == 4u || width == 8u) && (dst & uint64_t(width - 1u)) == 0ul) {
        ok = true;
        return vks_amo_direct(base + dst, amo_op, width, value, compare);
    }
    return vks_atomic_fetch_op(vks_ring(), pe, dst, amo_op, width, value, compare, result, ok);
}

uint64_t vks_atomic_fetch(uint pe, uint64_t dst, uint64_t result, out bool ok) {
    return vks_atomic_fetch_op(pe, dst, VKS_AMO_FETCH, 8u, 0ul, 0ul, result, ok);
}

uint64_t vks_atomic_fetch_add(uint pe, uint64_t dst, uint64_t value, uint64_t result,
                              out bool ok) {
    return vks_atomic_fetch_op(pe, dst, VKS_AMO_ADD, 8u, value, 0ul, result, ok);
}

uint64_t vks_atomic_swap(uint pe, uint64_t dst, uint64_t value, uint64_t result, out bool ok) {
    return vks_atomic_fetch_op(pe, dst, VKS_AMO_SWAP, 8u, value, 0ul, result, ok);
}

// Replace the word with `value` if it equals `cond`; returns the old value.
uint64_t vks_atomic_compare_swap(uint pe, uint64_t dst, uint64_t cond, uint64_t value,
                                 uint64_t result, out bool ok) {
    return vks_atomic_fetch_op(pe, dst, VKS_AMO_CSWAP, 8u, value, cond, result, ok);
}

uint64_t vks_atomic_fetch_and(uint pe, uint64_t dst, uint64_t value, uint64_t result,
                              out bool ok) {
    return vks_atomic_fetch_op(pe, dst, VKS_AMO_AND, 8u, value, 0ul, result, ok);
}

uint64_t vks_atomic_fetch_or(uint pe, uint64_t dst, uint64_t value, uint64_t result,
                             out bool ok) {
    return vks_atomic_fetch_op(pe, dst, VKS_AMO_OR, 8u, value, 0ul, result, ok);
}

uint64_t vks_atomic_fetch_xor(uint pe, uint64_t dst, uint64_t value, uint64_t result,
                              out bool ok) {
    return vks_atomic_fetch_op(pe, dst, VKS_AMO_XOR, 8u, value, 0ul, result, ok);
}

#endif  // VKSHMEM_API_GLSL
