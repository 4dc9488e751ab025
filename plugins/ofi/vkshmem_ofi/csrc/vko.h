/* vkshmem-ofi native helper: the libfabric (OFI) data path and its progress thread.
 *
 * One vko_ctx per open transport (rail): fabric, domain, address vector, one completion queue
 * shared by all its endpoints, the memory registrations, the peers' addresses and segment keys,
 * and a progress thread. One vko_ep per communication context (the default one and each
 * create_context()): an FI_EP_RDM endpoint bound to the shared AV and CQ, with its own count of
 * outstanding operations, so its quiet waits only for its own operations.
 *
 * Every operation carries a heap request as its op_context; whoever reads the CQ (the caller
 * waiting, or the progress thread) marks it done. Blocking calls wait for their own request;
 * quiet waits until the endpoint's outstanding count is zero. Operands of AMOs and the data of
 * small puts live in the request, so the caller's buffer is reusable at once. The domain is
 * opened FI_THREAD_SAFE: the library does its own locking.
 *
 * Return codes: 0 is success; other negative values are -FI_* (fi_strerror names them) or
 * vkshmem's VK_ST_* status codes (vkshmem/plugin.h; vko_strerror names both).
 */
#ifndef VKO_H
#define VKO_H

#include <stddef.h>
#include <stdint.h>

#include <vkshmem/plugin.h> /* struct vk_native_ops, VK_NATIVE_*, VK_ST_*, AMO codes VK_FETCH.. */

#define VKO_MAX_SEGS 64      /* segment ids 0..63 */
#define VKO_ADDR_MAX 512     /* largest endpoint name we accept */
#define VKO_ERRLEN 256
#define VKO_BOUNCE 256       /* puts up to this size are copied: blocking put returns at once */

/* Capability/emulation bits of an AMO: 1 << (op + 8 * (width == 8) + 16 * fetch). */
#define VKO_AMO_W8 8
#define VKO_AMO_FETCH 16

typedef struct vko_ctx vko_ctx;
typedef struct vko_ep vko_ep;

/* fi_version() of the library loaded, and FI_VERSION of the headers built against. */
uint32_t vko_version(void);
uint32_t vko_build_version(void);
int vko_has_dmabuf(void); /* built with FI_MR_DMABUF (libfabric >= 1.20 headers) */
const char *vko_strerror(int rc);

/* fi_getinfo for an RDM endpoint with RMA and atomics from provider prov ("tcp;ofi_rxm",
 * "shm", ...; NULL or "" lets libfabric choose), then fabric, domain, AV and CQ, and start the
 * progress thread. src_node: the job's address of this host; a provider that binds network
 * addresses (tcp, sockets, udp, verbs, net: any layer of prov's name) is asked again with it as
 * the source (FI_SOURCE), so its endpoints listen on that address only (NULL or "": the
 * provider's own choice; ignored by shm and the others). n_pes sizes the peer table; poll_us: how long the progress thread sleeps
 * between polls where the CQ has no wait object, idle_poll_us: the same once this PE issued
 * nothing for a second; busy_us: how long it polls without sleeping after a peer's operation
 * landed here (seen by a remote-access counter, where the provider offers FI_RMA_EVENT, or
 * by the CQ's wait fd waking it while this PE issued nothing; 0: never; vko_progress.c);
 * spin_us: how long a waiting caller spins
 * before it yields; timeout_s bounds every wait. NULL on failure, with err filled. */
vko_ctx *vko_open(const char *prov, const char *src_node, int32_t n_pes, uint32_t poll_us,
                  uint32_t idle_poll_us, uint32_t busy_us, uint32_t spin_us, double timeout_s,
                  char *err, size_t errlen);
/* Stop the thread, close every endpoint and MR, the CQ, AV, domain and fabric. */
void vko_close(vko_ctx *c);
/* What the provider granted: name, mr_mode, tx msg_order, inject size, max message size,
 * how the progress thread waits (2: poll() on the CQ's wait fd, with a busy window after a
 * peer's traffic woke it; 1: fi_cq_sread; 0: it polls the CQ, napping), caps. */
const char *vko_provider(vko_ctx *c);
void vko_info(vko_ctx *c, uint64_t *out6);
/* The AMO capability mask (VKO_AMO bits) found by fi_*atomicvalid, and which to emulate
 * (with compare-and-swap; by the caller's choice or because the provider lacks the op). */
uint32_t vko_amo_valid(vko_ctx *c);
void vko_set_emulation(vko_ctx *c, uint32_t mask);
/* Non-fetching AMOs as fi_inject_atomic (quiet then flushes each PE with a fetching read). */
void vko_set_inject_amo(vko_ctx *c, int on);
/* requests done, errors, progress-thread wakeups that found completions, peers' operations
 * counted here by the remote-access counter (UINT64_MAX: no counter), busy-poll windows,
 * AMOs run as compare-and-swap loops, the progress thread's rounds, the times it parked while
 * a caller's wait read the CQ (vko.c: drive_enter) */
void vko_stats(vko_ctx *c, uint64_t *out8);

/* This PE's number (its puts through vko_native_ops complete before returning, since the core
 * applies AMOs on its own words with the CPU) and the core's liveness words (0: none): a
 * waiting caller gives up with VK_ST_FAILED once words[0] is set. */
void vko_set_self(vko_ctx *c, int32_t my_pe, uintptr_t liveness_words);
/* The progress thread's busy window (busy_us): on=1 yields the CPU between polls (the
 * default, for nodes with more PEs than CPUs), on=0 spins (a peer's next request is served
 * within a poll, as a provider's own benchmarks serve it). */
void vko_set_busy_yield(vko_ctx *c, int on);

/* Register [addr, addr+size) (not allocating it), or the dma-buf fd (offset 0, size bytes,
 * mapped at addr by the caller) where dmabuf_fd >= 0; the key and the remote address of its
 * first byte are what peers need. The key requested is random (getrandom(2)), of
 * vko_mr_key_size() bytes, non-zero and unique in the context; where the provider grants
 * FI_MR_PROV_KEY the provider's key is returned instead. */
int vko_mr_key_size(vko_ctx *c); /* bytes of the requested keys: the domain's mr_key_size, 1..8 */
int vko_mr_reg(vko_ctx *c, uintptr_t addr, uint64_t size, int dmabuf_fd, uint64_t *key,
               uint64_t *remote_base);

/* The peers' endpoint names (AV insert) and segment keys, shared by every endpoint. */
int vko_peer_set(vko_ctx *c, int32_t pe, const void *addr, size_t len);
int vko_peer_seg(vko_ctx *c, int32_t pe, uint32_t seg, uint64_t base, uint64_t size,
                 uint64_t key);

/* The first endpoint is the root (peers target it; the progress thread sleeps on its CQ);
 * later ones are contexts' endpoints: on the root's (vko_set_context_endpoints), or each with
 * its own CQ. */
/* name: the endpoint's name where the provider names endpoints by strings (shm: the file under
 * /dev/shm), set before it is enabled; NULL or "" keeps the provider's default. */
vko_ep *vko_ep_open(vko_ctx *c, const char *name, char *err, size_t errlen);
/* Wait (bounded) for a context endpoint's operations, then park it: the next vko_ep_open
 * reuses it (vko_close closes every endpoint; one whose operations did not finish within 5 s is
 * closed at once instead). For the root endpoint this does nothing (vko_close closes it, after
 * stopping the progress thread). */
void vko_ep_close(vko_ep *e);
/* own=0 (the default): a context's vko_ep shares the root's libfabric endpoint and CQ, with
 * its own counts of outstanding operations (its quiet and fence wait only for its own; the
 * requests' op_context names the vko_ep they count in), so creating one opens nothing (an
 * rxm endpoint allocates tens of MB of buffers and connects to each peer again on first use).
 * own=1: each opens its own endpoint and CQ on the domain and AV (contexts=own). */
void vko_set_context_endpoints(vko_ctx *c, int own);
int vko_ep_name(vko_ep *e, void *buf, size_t *len);

/* Data path. nbi=1: completes by vko_quiet (buffers must stay valid until then). */
int vko_put(vko_ep *e, int32_t pe, uint32_t seg, uint64_t off, const void *src, size_t n,
            int nbi);
int vko_get(vko_ep *e, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n, int nbi);
int vko_amo(vko_ep *e, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
            uint64_t operand, uint64_t compare, int fetch, uint64_t *result);
int vko_fence(vko_ep *e);
/* fence: on=1 waits for every outstanding write; on=0 (the default once called) leaves puts
 * in flight where tx and rx msg_order grant FI_ORDER_WAW or FI_ORDER_RMA_WAW. */
void vko_set_fence_quiet(vko_ctx *c, int on);
int vko_puts_ordered(vko_ctx *c);
/* Wait for this endpoint's outstanding puts (before an AMO applied by the CPU). */
int vko_settle_puts(vko_ep *e);
int vko_quiet(vko_ep *e);
/* vkshmem's compiled hot path (vko_native.c): the address of this endpoint's
 * struct vk_native_ops (vkshmem/plugin.h), whose put/get/amo/quiet/fence are the
 * calls above without Python, with the VK_NATIVE_TRY protocol; its quiet answers
 * VK_NATIVE_PYTHON while *vko_held_flag(e) is set (Python holds buffers of non-blocking
 * operations, released by its quiet). vko_native_calls counts the calls it served. */
uintptr_t vko_native_ops(vko_ep *e);
int *vko_held_flag(vko_ep *e);
uint64_t vko_native_calls(vko_ctx *c);
/* Diagnostics (tools/probe_ofi.py): n repetitions of step `what` towards PE pe, timed in C
 * (out[0]: nanoseconds in all; out[1]: CQ reads the waiting caller made; out[2]: rounds of
 * the progress thread meanwhile). what: 0 an empty CQ read (the caller's progress call),
 * 1 a read of the remote-access counter (the progress thread's, each round; -FI_ENOSYS
 * without one), 2 put 8 B + quiet, 3 put 8 B (posted, no wait), 4 get 8 B, 5 fetch_add 8 B,
 * 6 a non-fetching add 8 B + quiet. Offset 0 of segment 0 of pe is written. */
int vko_probe(vko_ep *e, int32_t pe, int what, int n, uint64_t *out3);
/* The text of the last completion error the CQ reported (provider's own words). */
const char *vko_last_error(vko_ctx *c);

#endif
