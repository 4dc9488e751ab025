// vkshmem device-side API: GPU-initiated communication, by direct loads and stores where the
// peer's GPU heap is mapped, through a request ring elsewhere.
//
// A user kernel (dispatched by vkshmem.gpu.UserKernel) declares the vkshmem push-constant
// header first in its push-constant block and binds it; every call then finds the ring, the
// symmetric GPU heap and the PE numbers itself:
//
//   #version 460
//   #include "vkshmem.glsl"
//   layout(local_size_x = 64) in;
//   layout(push_constant) uniform Push {
//       VKS_PUSH_HEADER              // 32 bytes: heap, ring, scratch, my_pe, n_pes
//       uint64_t dst_off;            // the kernel's own push constants, from byte 32 on
//   } pc;
//   VKS_USE_PUSH(pc)
//   void main() { ... vks_put((vks_my_pe() + 1u) % vks_n_pes(), pc.dst_off, 0ul, 64ul);
//                 vks_quiet(); }
//
// Every call also exists with the ring's device address as an explicit first argument
// (vks_put(ring, pe, ...)), for shaders without the header (ring_selftest.comp).
//
// Direct first: where this PE's device maps a PE's GPU heap (this PE itself, and peers on the
// same device, whose heaps the runtime imports; vks_ptr(pe, 0) != 0), the calls of
// vkshmem_api.glsl and vkshmem_sync.glsl copy and update that memory themselves (plain loads,
// stores and the device's atomics; shaders/README.md, "The direct path"): no request, no host.
// Only for other PEs (another node, another GPU), host-heap segments and unaligned ranges:
//
// A shader cannot drive a NIC, so it writes fixed-size request descriptors into a ring in
// host-visible memory; the PE's host side drains the ring (vkshmem.gpu.RingService), performs
// each request through the chosen transport and then advances the ring's `done` counter,
// which shaders wait on. shaders/README.md documents the layout; the host side
// (vkshmem.gpu.ring) uses the same offsets.
//
// Addresses: dst/src are byte offsets in symmetric segments (segment ids in the flags: 0 host,
// 1 gpu; the calls without _seg use the GPU segment), so they mean the same on every PE;
// `result` is a device address of this PE where the host writes a fetched value: it must be
// memory a running shader sees host writes to (VulkanDevice.alloc_mapped, e.g. the kernel's
// scratch, vks_scratch()), not the GPU heap (on NVIDIA that is not host-visible).
//
// Failure: the host poisons the ring (bit 63 of `done`, VKS_DONE_FAILED) when a request
// fails; every wait then returns false at once, and a full ring is given up on.
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

#include "vkshmem_ring.glsl"

// -- user kernels: the push-constant header -----------------------------------------------
// vkshmem.gpu.UserKernel fills the first VKS_PUSH_HEADER_SIZE bytes of the push constants:
//   0 u64 device address of this PE's symmetric GPU heap (offset 0 of segment 1)
//   8 u64 device address of this PE's request ring
//  16 u64 device address of the kernel's scratch (host-visible: for fetched values; 0: none)
//  24 u32 my PE   28 u32 number of PEs
// Put VKS_PUSH_HEADER first in the push-constant block, give the block an instance name, and
// write VKS_USE_PUSH(<that name>) after it: that defines vks_ring(), vks_heap(),
// vks_scratch(), vks_my_pe() and vks_n_pes(), which the calls below use. The kernel's own
// push constants follow the header (at most 128 - 32 = 96 bytes).
#define VKS_PUSH_HEADER_SIZE 32u
#define VKS_PUSH_HEADER \
    uint64_t vks_heap_base_; \
    uint64_t vks_ring_addr_; \
    uint64_t vks_scratch_base_; \
    uint vks_my_pe_; \
    uint vks_n_pes_;
#define VKS_USE_PUSH(PC) \
    uint64_t vks_heap() { return PC.vks_heap_base_; } \
    uint64_t vks_ring() { return PC.vks_ring_addr_; } \
    uint64_t vks_scratch() { return PC.vks_scratch_base_; } \
    uint vks_my_pe() { return PC.vks_my_pe_; } \
    uint vks_n_pes() { return PC.vks_n_pes_; }

// Defined by VKS_USE_PUSH (a link error "No function definition (body) found" means it is
// missing).
uint64_t vks_heap();
uint64_t vks_ring();
uint64_t vks_scratch();
uint vks_my_pe();
uint vks_n_pes();

// Device address of byte `offset` of this PE's GPU heap (cast it to a buffer_reference type).
uint64_t vks_heap_addr(uint64_t offset) {
    return vks_heap() + offset;
}

// Device address of byte `offset` of the kernel's scratch (where fetched values may land).
uint64_t vks_scratch_addr(uint64_t offset) {
    return vks_scratch() + offset;
}

#include "vkshmem_api.glsl"
#include "vkshmem_sync.glsl"

#endif  // VKSHMEM_GLSL
