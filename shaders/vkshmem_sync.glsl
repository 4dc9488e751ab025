// vkshmem device-side API, part 3: waits on local words, the device barrier across PEs and the
// workgroup-scope calls. Included by vkshmem.glsl (include that, not this file).
#ifndef VKSHMEM_SYNC_GLSL
#define VKSHMEM_SYNC_GLSL

// -- waiting on local words ----------------------------------------------------------------

bool vks_compare(uint64_t a, uint cmp, uint64_t b) {
    switch (cmp) {
    case VKS_CMP_EQ: return a == b;
    case VKS_CMP_NE: return a != b;
    case VKS_CMP_GT: return a > b;
    case VKS_CMP_LE: return a <= b;
    case VKS_CMP_LT: return a < b;
    case VKS_CMP_GE: return a >= b;
    default: return false;
    }
}

// Wait until the uint64 at offset `offset` of this PE's GPU heap satisfies `word cmp value`
// (VKS_CMP_*, unsigned); bounded by vks_spin_limit passes: false when it gave up (or the
// ring failed), never a hang. Acquire: what was written before the update that satisfied it
// is visible after it returns true.
bool vks_wait_until(uint64_t offset, uint cmp, uint64_t value) {
    VksRingHeader r = VksRingHeader(vks_ring());
    uint64_t addr = vks_heap() + offset;
    bool ok = false;
    uint limit = vks_spin_limit(r);
    for (uint i = 0u; i < limit; ++i) {
        uint64_t v = atomicLoad(VksU64(addr).v, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                                gl_SemanticsRelaxed);
        if (vks_compare(v, cmp, value)) {
            ok = true;
            break;
        }
        if ((vks_load(r, 2u) & VKS_DONE_FAILED) != 0ul) {
            break;
        }
        vks_delay(r);
    }
    memoryBarrierBuffer();  // outside the loop (the lavapipe note at the top)
    if (!ok && (r.direct_flags & VKS_DIRECT_SHARED) != 0u) {
        atomicOr(r.kernel_error, VKS_KERR_SHARED_WAIT);  // the host says why (Launch.wait)
    }
    return ok;
}

// vks_wait_until on a signal word; returns the value that satisfied it (`ok` as above).
uint64_t vks_signal_wait_until(uint64_t sig, uint cmp, uint64_t value, out bool ok) {
    ok = vks_wait_until(sig, cmp, value);
    return atomicLoad(VksU64(vks_heap() + sig).v, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                      gl_SemanticsRelaxed);
}

// -- across PEs ------------------------------------------------------------------------------

// Device-side barrier over every PE (nvshmem_barrier_all in a kernel): vks_quiet(), then a
// dissemination barrier on the counters of the device-sync block (signals into the peers'
// blocks: direct, or through the ring for PEs not mapped). Thread scope: exactly one
// invocation of one kernel per PE calls it, the same number of times on every PE. False when
// a wait gave up (vks_spin_limit), the ring failed, or the heap has no sync block.
// Kernels of different PEs that wait for each other must run at the same time: one PE per
// GPU. Where other PEs' kernels share this GPU (separate processes' contexts, which the
// driver does not run together: seen on the H100), it returns false at once and the host's
// Launch.wait raises a GpuError that says so; a wait that gives up there does the same.
bool vks_barrier_all() {
    if (!vks_quiet()) {
        return false;
    }
    VksRingHeader r = VksRingHeader(vks_ring());
    uint64_t sync = r.sync_off;
    if (sync == 0ul) {
        return false;
    }
    if ((r.direct_flags & VKS_DIRECT_SHARED) != 0u) {
        // other PEs' kernels on this GPU run only when this one has ended: waiting for them
        // would spin out its bound; say so instead (the host raises it: Launch.wait)
        atomicOr(r.kernel_error, VKS_KERR_SHARED_BARRIER);
        return false;
    }
    uint n = vks_n_pes();
    uint me = vks_my_pe();
    VksU64 gen = VksU64(vks_heap() + sync);  // this PE's count of barriers (local only)
    uint64_t g = gen.v + 1ul;
    gen.v = g;
    bool ok = true;
    uint64_t word = sync + 8ul;
    for (uint dist = 1u; dist < n; dist <<= 1u) {
        if (vks_signal((me + dist) % n, word, 1ul, VKS_SIGNAL_ADD) == VKS_NO_TICKET ||
            !vks_wait_until(word, VKS_CMP_GE, g)) {
            ok = false;
            break;
        }
        word += 8ul;
    }
    return ok;
}

// -- workgroup scope: every invocation of the workgroup calls it, in uniform control flow ---
// The workgroup copies the block together (each invocation a share, 16-byte units where
// aligned); through the ring, one request for the whole block (invocation 0). Writes of the
// workgroup's invocations before the call are included; on return the copy is done (direct)
// or requested (ring: complete at vks_quiet()).

shared uint64_t vks_block_ticket_;

// The workgroup's size, read where a call is written (after the kernel's
// layout(local_size_x = ...) in; a function of this file, compiled before it, would see 1).
#define VKS_LANES (gl_WorkGroupSize.x * gl_WorkGroupSize.y * gl_WorkGroupSize.z)
#define vks_put_block(pe, dst, src, nbytes) vks_block_n(VKS_LANES, false, pe, dst, src, nbytes)
#define vks_get_block(pe, dst, src, nbytes) vks_block_n(VKS_LANES, true, pe, dst, src, nbytes)
#define vks_put_signal_block(pe, dst, src, nbytes, sig, value, sig_op) \
    vks_put_signal_block_n(VKS_LANES, pe, dst, src, nbytes, sig, value, sig_op)

// vks_put_block / vks_get_block(pe, dst, src, nbytes): the workgroup's put (from this PE's
// `src` to `pe`'s `dst`) or get (from `pe`'s `src` to this PE's `dst`); returns the ticket
// (the same in every invocation).
uint64_t vks_block_n(uint lanes, bool get, uint pe, uint64_t dst, uint64_t src,
                     uint64_t nbytes) {
    memoryBarrierBuffer();
    barrier();
    uint64_t base = vks_peer_base(pe);
    if (vks_direct_ok(base, dst, src, nbytes)) {
        uint64_t to = (get ? vks_heap() : base) + dst;
        uint64_t from = (get ? base : vks_heap()) + src;
        vks_copy(to, from, nbytes, gl_LocalInvocationIndex, lanes);
        memoryBarrierBuffer();
        barrier();
        return VKS_DIRECT;
    }
    if (gl_LocalInvocationIndex == 0u) {
        vks_block_ticket_ = get ? vks_get(vks_ring(), pe, dst, src, nbytes)
                                : vks_put(vks_ring(), pe, dst, src, nbytes);
    }
    barrier();
    return vks_block_ticket_;
}

// vks_put_signal_block(pe, dst, src, nbytes, sig, value, sig_op): the workgroup's put, then
// (once every invocation's share is delivered) the signal.
uint64_t vks_put_signal_block_n(uint lanes, uint pe, uint64_t dst, uint64_t src,
                                uint64_t nbytes, uint64_t sig, uint64_t value, uint sig_op) {
    memoryBarrierBuffer();
    barrier();
    uint64_t base = vks_peer_base(pe);
    if (vks_direct_ok(base, dst, src, nbytes) && (sig & 7ul) == 0ul) {
        vks_copy(base + dst, vks_heap() + src, nbytes, gl_LocalInvocationIndex, lanes);
        memoryBarrierBuffer();
        barrier();
        if (gl_LocalInvocationIndex == 0u) {
            vks_signal_direct(base + sig, value, sig_op);
        }
        return VKS_DIRECT;
    }
    if (gl_LocalInvocationIndex == 0u) {
        vks_block_ticket_ = vks_put_signal(vks_ring(), pe, dst, src, nbytes, sig, value, sig_op);
    }
    barrier();
    return vks_block_ticket_;
}

#endif  // VKSHMEM_SYNC_GLSL
