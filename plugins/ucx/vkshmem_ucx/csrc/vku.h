/* vkshmem-ucx native helper: the UCX (UCP) data path and its progress thread.
 *
 * One vku_ctx per open transport (rail): a UCP context, the symmetric segments it mapped, and a
 * progress thread. One vku_worker per communication context of that transport (the default
 * one and each create_context()): a UCP worker with its own endpoints and unpacked rkeys, so
 * flushing it (quiet) completes only its own operations. Every UCX call on a worker is made
 * under that worker's mutex (workers are created UCS_THREAD_MODE_SERIALIZED); the progress
 * thread takes the same mutex, so UCX is never entered from two threads at once per worker.
 *
 * Return codes: 0 is success; other negative values are ucs_status_t (ucs_status_string names
 * them) or vkshmem's VK_ST_* status codes (vkshmem/plugin.h; vku_status_string names both).
 */
#ifndef VKU_H
#define VKU_H

#include <stddef.h>
#include <stdint.h>

#include <vkshmem/plugin.h> /* struct vk_native_ops, VK_NATIVE_*, VK_ST_*, AMO codes VK_FETCH.. */

#define VKU_MAX_SEGS 64      /* segment ids 0..63 */
#define VKU_MAX_LOCAL 64     /* segments mapped by one transport */
#define VKU_RKEY_MAX 8192    /* largest packed rkey / worker address we accept */
#define VKU_ERRLEN 256

/* Emulation mask bits: (1 << op) for the fetching form, (1 << (8 + op)) non-fetching. */
#define VKU_EMU_NONFETCH 8

typedef struct vku_ctx vku_ctx;
typedef struct vku_worker vku_worker;

/* The UCX library actually loaded, and the headers this module was built against. */
void vku_version(unsigned *major, unsigned *minor, unsigned *release);
void vku_build_version(unsigned *major, unsigned *minor);
const char *vku_library_path(void); /* the file libucp was loaded from */
const char *vku_status_string(int status);

/* Open a UCP context with names[i]=values[i] applied to its configuration (ucp_config_modify,
 * names without the UCX_ prefix), and start the progress thread. spin_us: how long the thread
 * keeps polling after activity before it sleeps; timeout_s: how long any wait may last;
 * err_peer: endpoints use UCP_ERR_HANDLING_MODE_PEER. NULL on failure, with err filled. */
vku_ctx *vku_ctx_create(const char *const *names, const char *const *values, int n,
                        uint32_t spin_us, uint32_t wait_spin_us, double timeout_s,
                        int err_peer, char *err, size_t errlen);
/* Stop the thread, destroy every worker, unmap every segment, release the context. */
void vku_ctx_destroy(vku_ctx *c);
void vku_set_emulation(vku_ctx *c, uint32_t mask);
/* direct = 1: where UCX maps a peer's segment into this process (ucp_rkey_ptr: its shared
 * memory, on memory UCX allocated), put/get are memcpy and AMOs cpu_amo (the core's vk_amo)
 * on that mapping, after any un-flushed UCX writes of the worker to that PE. */
void vku_set_direct(vku_ctx *c, uintptr_t cpu_amo, int direct);
/* The core's liveness words (TransportContext.liveness_words; 0: none): a wait gives up with
 * VK_ST_FAILED once words[0] says a PE of the job failed. */
void vku_set_liveness(vku_ctx *c, uintptr_t words);
uint32_t vku_get_emulation(vku_ctx *c);
/* wakeups of the progress thread, of which by timeout, progress calls that did work. */
void vku_stats(vku_ctx *c, uint64_t *out3);

/* ucp_mem_map the memory [addr, addr+size) and pack its rkey into buf (capacity *len; *len
 * becomes the packed size). Mapping the same range again repacks it. *allocate = 1 (with fd,
 * the memfd mapped there): let UCX allocate the range in place (ALLOCATE | FIXED, bytes kept;
 * given back to the memfd at vku_ctx_destroy), falling back to registering the memory as it
 * is; *allocate becomes 1 when UCX allocated it. cuda=1: the range is CUDA device memory
 * (a device virtual address), mapped with UCS_MEMORY_TYPE_CUDA and never allocated. */
int vku_mem_map(vku_ctx *c, uintptr_t addr, uint64_t size, int fd, int cuda, int *allocate,
                void *buf, size_t *len);

/* A worker with a table of n_pes peers; it joins the progress thread's set. */
vku_worker *vku_worker_create(vku_ctx *c, int32_t n_pes, char *err, size_t errlen);
/* Close its endpoints (bounded wait), leave the progress set, destroy it. */
void vku_worker_destroy(vku_worker *w, int force);
int vku_worker_address(vku_worker *w, void *buf, size_t *len);
int vku_peer_set(vku_worker *w, int32_t pe, const void *addr, size_t len);
/* device=1: the segment is device memory (never reached through a ucp_rkey_ptr mapping). */
int vku_peer_seg(vku_worker *w, int32_t pe, uint32_t seg, uint64_t base, uint64_t size,
                 int device, const void *rkey, size_t len);

/* Data path. nbi=1: the operation completes by vku_quiet (buffers must stay valid).
 * nbi=VK_NATIVE_TRY (and fetch | VK_NATIVE_TRY for vku_amo): only if it completes at once,
 * through a direct mapping and without waiting for the worker's lock or a flush; else
 * VK_NATIVE_AGAIN, nothing done (vkshmem's try protocol, vkshmem/plugin.h). */
int vku_put(vku_worker *w, int32_t pe, uint32_t seg, uint64_t off, const void *src, size_t n,
            int nbi);
int vku_get(vku_worker *w, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n,
            int nbi);
int vku_amo(vku_worker *w, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
            uint64_t operand, uint64_t compare, int fetch, uint64_t *result);
int vku_fence(vku_worker *w);

/* Fill ops (vkshmem's struct vk_native_ops, vkshmem/plugin.h; Transport.native_ops) with
 * vku_put, vku_get, vku_amo, vku_quiet (VK_NATIVE_PYTHON while *vku_held_flag(w)) and
 * vku_fence of one worker, flags VK_NATIVE_CAN_TRY: the core's compiled hot path calls them
 * directly. */
void vku_native_ops(vku_worker *w, struct vk_native_ops *ops);
/* Set by Python while it holds buffers of non-blocking operations (its quiet releases them):
 * the native quiet then answers 1, "call the Python quiet". */
int *vku_held_flag(vku_worker *w);
int vku_quiet(vku_worker *w);
int vku_progress(vku_worker *w);

/* Apply fetching and non-fetching AND/OR/XOR between two fresh workers of the context and
 * check the values written; sets a mask of the ops (VKU_EMU bits) that came out wrong. */
int vku_selftest(vku_ctx *c, uint32_t *bad_mask, char *err, size_t errlen);

#endif
