// Self-test and example of the device-side API in vkshmem.glsl (used by the tests of
// vkshmem.gpu.ring). Invocation i < count:
//   mode 0: enqueue one request of kind i % 6 (PUT, GET, AMO fetch-add, SIGNAL, PUT_SIGNAL,
//           FENCE) with fields derived from i; out[i] = its ticket (VKS_NO_TICKET if the ring
//           stayed full). The AMO's old value is to land in out[count + i].
//   mode 1: out[2 * count + i] = 1 if request out[i] is complete (vks_wait), else 0.
//   mode 2: a blocking 64-bit fetch-add of i + 1 on offset 8 * (i % 4) of PE 0, whose result
//           the host writes to out[count + i] while this dispatch waits; out[i] = the value
//           fetched, out[2 * count + i] = 1 when the wait succeeded; then a quiet.
#version 460
#include "vkshmem.glsl"

layout(local_size_x = 64) in;

layout(buffer_reference, std430, buffer_reference_align = 8) coherent buffer U64s {
    uint64_t v[];
};

layout(push_constant) uniform Push {
    uint64_t ring;
    uint64_t out_;
    uint count;
    uint mode;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.count) {
        return;
    }
    U64s o = U64s(pc.out_);
    uint64_t ring = pc.ring;
    uint64_t j = uint64_t(i);
    uint pe = i % 4u;
    uint64_t result = pc.out_ + 8ul * (uint64_t(pc.count) + j);
    if (pc.mode == 0u) {
        uint64_t t = VKS_NO_TICKET;
        uint kind = i % 6u;
        switch (kind) {
            case 0u: t = vks_put(ring, pe, 64ul * j, 8ul * j, 8ul + j); break;
            case 1u: t = vks_get(ring, pe, 64ul * j, 8ul * j, 16ul); break;
            case 2u: t = vks_atomic_post(ring, pe, 8ul * j, VKS_AMO_ADD, 8u, j + 1ul, 0ul,
                                         result); break;
            case 3u: t = vks_signal(ring, pe, 8ul * j, j, VKS_SIGNAL_ADD); break;
            case 4u: t = vks_put_signal(ring, pe, 64ul * j, 8ul * j, 32ul, 4096ul + 8ul * j, j,
                                        VKS_SIGNAL_SET); break;
            default: t = vks_fence(ring); break;
        }
        o.v[i] = t;
    } else if (pc.mode == 1u) {
        o.v[2u * pc.count + i] = vks_wait(ring, o.v[i]) ? 1ul : 0ul;
    } else {
        bool ok;
        uint64_t v = vks_atomic_fetch_add(ring, 0u, 8ul * uint64_t(i % 4u), j + 1ul, result, ok);
        o.v[i] = v;
        o.v[2u * pc.count + i] = (ok && vks_quiet(ring)) ? 1ul : 0ul;
    }
}
