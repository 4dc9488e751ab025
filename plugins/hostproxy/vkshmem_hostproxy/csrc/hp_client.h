/* vkshmem-hostproxy: the client (one per transport endpoint) of the peers' proxy servers.
 *
 * It speaks the wire protocol of hp_server.h: one TCP connection per target PE, opened on first
 * use and admitted by the same HMAC challenge-response (the client checks the server's proof
 * before it sends anything else). Both the Python methods of HostProxyTransport (through cffi)
 * and the core's compiled hot path (struct vk_native_ops, hpc_native_ops) call these functions,
 * so there is one client.
 *
 * Requests to this PE itself are applied in place (a copy, or the core's vk_amo on the word),
 * complete on return, as the core's own CPU atomics on this PE's words are.
 *
 * Ordering and completion: a put (header + payload) returns once the kernel has the bytes; a get
 * and a fetching AMO wait for their reply; a non-fetching AMO does not; fence is nothing (one
 * ordered stream per target, served in order); quiet sends FLUSH on every connection with
 * un-acknowledged puts/AMOs and waits for every ack. Every wait is bounded by the timeout (no
 * progress for that long: the connection is dropped); a signal that interrupts a wait calls
 * back into Python (_hpc_signalled) to run its handlers: when one raises, the request's
 * connection is retired (its stream is out of step; the next request opens a fresh one) and the
 * call returns VK_ST_INTR, the Python exception kept for the caller to raise.
 *
 * Functions return 0 or a negative VK_ST_* status (vkshmem/plugin.h): VK_ST_BROKEN (the
 * connection failed or is unusable), VK_ST_REJECTED (the server rejected a request and dropped
 * it), VK_ST_SEG / VK_ST_BOUNDS (no such segment at the target, or outside it), VK_ST_AMO /
 * VK_ST_ALIGN (AMO width or alignment), VK_ST_PEER (the PE published no address),
 * VK_ST_CONNECT, VK_ST_AUTH (the server could not prove the secret, or is another PE),
 * VK_ST_CLOSED, VK_ST_INTR (a signal handler raised: Python holds the exception),
 * VK_ST_NOMEM. The message (and the OS or server status) of the calling thread's last failure
 * is read with hpc_last_error.
 */
#ifndef VKSHMEM_HP_CLIENT_H
#define VKSHMEM_HP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <vkshmem/plugin.h> /* struct vk_native_ops, VK_ST_* */

#define HPC_MSGLEN 768

typedef struct hpc_client hpc_client;

/* An endpoint of PE my_pe of n_pes on rail `rail`, with the job's key (HP_KEY bytes); every wait
 * may go timeout_s seconds without progress; amo_fn: the core's vk_amo (for this PE's words).
 * NULL when out of memory. */
hpc_client *hpc_create(int32_t my_pe, int32_t n_pes, int rail, const unsigned char *key,
                       double timeout_s, uintptr_t amo_fn);
/* This PE's segment seg, mapped at base (requests to this PE use it in place). */
int hpc_set_local(hpc_client *c, uint32_t seg, uintptr_t base, uint64_t size);
/* Where PE pe's server listens (a later call replaces it for connections opened later). */
int hpc_set_target(hpc_client *c, int32_t pe, const char *host, const char *port);
/* The size of PE pe's segment seg (requests outside it fail with VK_ST_BOUNDS before sending). */
int hpc_set_size(hpc_client *c, int32_t pe, uint32_t seg, uint64_t size);

int hpc_put(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, const void *src, size_t n);
int hpc_get(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, void *dst, size_t n);
int hpc_amo(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, int op, int width,
            uint64_t operand, uint64_t compare, int fetch, uint64_t *result);
int hpc_quiet(hpc_client *c);

/* Fill ops with this endpoint's data path for the core's compiled hot path (vkshmem/plugin.h). */
void hpc_native_ops(hpc_client *c, struct vk_native_ops *ops);
/* [0] operations and quiets served through vk_native_ops, [1] through the Python methods,
 * [2] connections opened. */
void hpc_stats(hpc_client *c, uint64_t *out);
/* The calling thread's last failure: its message (into buf) and its OS errno or server
 * status (0: none). */
int hpc_last_error(char *buf, size_t buflen);
/* Send CLOSE on, and close, every connection (waiting at most 1 s for each one's current
 * request); later calls fail with VK_ST_CLOSED. Safe to call twice. */
void hpc_close(hpc_client *c);
/* Free the endpoint (after hpc_close, once no thread can still be using it). */
void hpc_free(hpc_client *c);

#endif
