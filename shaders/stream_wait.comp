// Stream-ordered wait (vkshmem.gpu.Stream.wait_word: signal_wait_until(stream=) on the Vulkan
// domain): spins until the 64-bit word at device address `word` satisfies `word cmp value`
// (unsigned; cmp: the CMP codes 1..6, EQ NE GT LE LT GE), bounded in time by the device's clock
// (VK_KHR_shader_clock, device scope; `timeout` in its ticks) and in loop passes.
//
// Built twice. stream_wait (GPUs): one invocation spins; the clock ends it. stream_wait_cpu
// (CPU drivers: lavapipe runs at most 65,535 loop passes per SIMD group and dispatch, and runs
// a workgroup's SIMD groups one after the other on one thread): 1024 invocations, one spinner
// per SIMD group, each `passes` passes slowed by clock reads, so one dispatch spins for
// seconds; the host chains `chain` such dispatches. Every spinner returns at once when the
// wait is over. The host zeroes `status`, `start` and `spent` before the first dispatch of a
// wait (vkCmdUpdateBuffer). A wait that gives up (timed out, or every spinner of the chain
// spent its passes) records a failure in the state block, host-visible memory the host
// raises as WaitTimeoutError; while one is recorded and not yet raised, later waits return
// at once. Flag CLOCK only writes the clock into `start` (the host's calibration of its rate).
#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require
#extension GL_EXT_shader_realtime_clock : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require

#ifndef CPU
#define CPU 0
#endif
#if CPU
layout(local_size_x = 1024) in;
#else
layout(local_size_x = 1) in;
#endif

layout(buffer_reference, std430, buffer_reference_align = 8) coherent buffer Word {
    uint64_t v;
};

// The stream's wait state (host-visible; vkshmem/gpu/stream.py reads it).
layout(buffer_reference, std430, buffer_reference_align = 8) coherent buffer State {
    uint64_t status;   // 0 waiting, 1 satisfied, 2 over without it
    uint64_t start;    // the clock when the first spinner began (0: not yet)
    uint64_t spent;    // spinners that spent their passes
    uint64_t failed;   // 1 once a failure is recorded (the host clears it when it raises it)
    uint64_t word;     // the failure: the word's address, the comparison, the value,
    uint64_t cmp;      // the value seen, the ticks waited
    uint64_t value;
    uint64_t seen;
    uint64_t waited;
};

layout(push_constant) uniform Push {
    uint64_t word;
    uint64_t value;
    uint64_t state;
    uint64_t timeout;  // clock ticks
    uint cmp;
    uint passes;       // per spinner
    uint chain;        // dispatches of this wait
    uint flags;        // 4 CLOCK
} pc;

bool satisfied(uint64_t a) {
    switch (pc.cmp) {
    case 1u: return a == pc.value;
    case 2u: return a != pc.value;
    case 3u: return a > pc.value;
    case 4u: return a <= pc.value;
    case 5u: return a < pc.value;
    case 6u: return a >= pc.value;
    default: return false;
    }
}

void main() {
    if (gl_SubgroupInvocationID != 0u) {
        return;
    }
    State s = State(pc.state);
    if ((pc.flags & 4u) != 0u) {
        s.start = clockRealtimeEXT();
        return;
    }
    if (s.status != 0ul) {
        return;
    }
    if (s.failed != 0ul) {  // an unraised failure: later waits return at once
        s.status = 2ul;
        return;
    }
    uint64_t now = clockRealtimeEXT();
    uint64_t start = atomicCompSwap(s.start, 0ul, now);
    start = start == 0ul ? now : start;
    uint64_t v = 0ul;
    bool ok = false;
    bool late = false;
    Word w = Word(pc.word);
    // Relaxed loads in the loop, the barrier after it (lavapipe: see shaders/README.md).
    for (uint i = 0u; i < pc.passes; ++i) {
        v = atomicLoad(w.v, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
        if (satisfied(v)) {
            ok = true;
            break;
        }
        now = clockRealtimeEXT();
#if CPU
        // a slower pass: more time within the loop budget (each read is a call on the CPU)
        now = max(now, clockRealtimeEXT()); now = max(now, clockRealtimeEXT());
        now = max(now, clockRealtimeEXT()); now = max(now, clockRealtimeEXT());
        now = max(now, clockRealtimeEXT()); now = max(now, clockRealtimeEXT());
        now = max(now, clockRealtimeEXT()); now = max(now, clockRealtimeEXT());
        now = max(now, clockRealtimeEXT()); now = max(now, clockRealtimeEXT());
        now = max(now, clockRealtimeEXT()); now = max(now, clockRealtimeEXT());
        now = max(now, clockRealtimeEXT()); now = max(now, clockRealtimeEXT());
        now = max(now, clockRealtimeEXT()); now = max(now, clockRealtimeEXT());
#endif
        // Signed, and confirmed by a second read: lavapipe's clock now and then reads 2^32
        // ticks off (its halves read apart), which must not end a wait early.
        if (int64_t(now - start) > int64_t(pc.timeout)) {
            now = clockRealtimeEXT();
            if (int64_t(now - start) > int64_t(pc.timeout)) {
                late = true;
                break;
            }
        }
        if (i % 64u == 63u && atomicLoad(s.status, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                                         gl_SemanticsRelaxed) != 0ul) {
            break;  // another spinner ended the wait
        }
    }
    memoryBarrierBuffer();
    if (ok) {
        atomicExchange(s.status, 1ul);
        return;
    }
    uint spinners = CPU != 0 ? gl_NumSubgroups * pc.chain : pc.chain;
    if (!late && atomicAdd(s.spent, 1ul) + 1ul < uint64_t(spinners)) {
        return;  // the next spinner goes on
    }
    if (atomicCompSwap(s.status, 0ul, 2ul) == 0ul) {
        s.word = pc.word;
        s.cmp = uint64_t(pc.cmp);
        s.value = pc.value;
        s.seen = v;
        s.waited = now - start;
        memoryBarrierBuffer();
        atomicExchange(s.failed, 1ul);
    }
}
