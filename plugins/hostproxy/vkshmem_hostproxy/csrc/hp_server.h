/* vkshmem-hostproxy: the per-PE proxy server (a native thread serving peers over TCP).
 *
 * Wire protocol (all integers little-endian). Every request starts with a 32-byte header:
 *
 *   offset 0  u8   op        HP_OP_*
 *   offset 1  u8   amo_op    AmoOp code (vkshmem.plugin.AmoOp / vkshmem/plugin.h), AMOs only
 *   offset 2  u8   width     4 or 8, AMOs only
 *   offset 3  u8   reserved  0
 *   offset 4  u32  seg       segment id (HELLO: the client's PE)
 *   offset 8  u64  offset    byte offset in the segment (HELLO: HP_MAGIC)
 *   offset 16 u64  arg       PUT/GET: byte count; AMO: operand; HELLO: HP_VERSION
 *   offset 24 u64  compare   AMO CSWAP: compare value
 *
 * PUT is followed by `arg` payload bytes. Replies are a 16-byte header
 *
 *   offset 0  i32  status    HP_OK or a negative VK_ST_* code (vkshmem/plugin.h)
 *   offset 4  u32  op        the op answered
 *   offset 8  u64  value     AMO_FETCH: old value; HELLO: the server's PE
 *
 * followed, for a successful GET, by the `arg` requested bytes. Replies are sent for HELLO, AUTH,
 * GET, AMO_FETCH and FLUSH only. A bad request gets an error reply (whatever its op) and the
 * connection is then dropped, so a client learns about a rejected PUT at its next reply.
 * Requests on one connection are applied strictly in order.
 *
 * Admission (protocol version 2): nothing but HELLO, then AUTH, is served before a connection
 * proved that it knows the job's key (a key derived from the job's secret):
 *
 *   client: HELLO header (seg = client PE, offset = HP_MAGIC, arg = HP_VERSION), then a
 *           16-byte random nonce Nc
 *   server: reply (value = server PE), then a 16-byte random nonce Ns and
 *           HMAC-SHA256(key, "vkshmem hostproxy server v2" | Nc | Ns | client PE | server PE)
 *           (the PEs as little-endian u32), which the client checks
 *   client: AUTH header, then HMAC-SHA256(key, "vkshmem hostproxy client v2" | Nc | Ns |
 *           client PE | server PE)
 *   server: compares it in constant time; reply HP_OK, or VK_ST_AUTH and the connection dropped
 *
 * A connection that has not authenticated within HP_AUTH_MS (or the request timeout, if
 * shorter) of being accepted is dropped, however many bytes it has sent meanwhile (a hard
 * deadline); at most HP_MAX_PENDING connections may be authenticating at a time (the oldest is
 * dropped for a new one) and at most max_conns may be open (hp_create). The failures of a
 * connection that never authenticated are counted (refused), never recorded as errors. An authenticated connection may idle
 * between requests, but once a request has begun, it (and a pending reply) must make progress
 * within the server's request timeout, or the connection is dropped.
 */
#ifndef VKSHMEM_HP_SERVER_H
#define VKSHMEM_HP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <vkshmem/plugin.h> /* VK_ST_*, vk_amo_fn, the AMO op codes */

#define HP_REQ_SIZE 32
#define HP_REP_SIZE 16
#define HP_MAX_SEGS 256
#define HP_ERRLEN 256
#define HP_VERSION 3 /* 3: statuses are VK_ST_* codes */
#define HP_NONCE 16
#define HP_MAC 32
#define HP_KEY 32
#define HP_AUTH_MS 10000
#define HP_MAX_PENDING 64
#define HP_MAGIC 0x316d656d68736b76ULL /* "vkshmem1" read as a little-endian u64 */

#define HP_OP_HELLO 1
#define HP_OP_PUT 2
#define HP_OP_GET 3
#define HP_OP_AMO 4
#define HP_OP_AMO_FETCH 5
#define HP_OP_FLUSH 6
#define HP_OP_CLOSE 7
#define HP_OP_AUTH 8

/* a reply's status: HP_OK or one of vkshmem's VK_ST_* codes (vkshmem/plugin.h): VK_ST_PROTO
 * (unknown op, request before HELLO), VK_ST_SEG (segment id not registered), VK_ST_BOUNDS
 * (offset + length outside the segment), VK_ST_ALIGN (AMO target not aligned to its width),
 * VK_ST_AMO (AMO op or width not supported), VK_ST_HELLO (bad magic or protocol version, or a
 * PE outside the job), VK_ST_AUTH (authentication failed, or a request before it) */
#define HP_OK 0

typedef struct hp_server hp_server;

/* Start a server on an already listening socket (ownership passes on success only) for PE
 * my_pe of a job of n_pes, admitting peers that prove they know key (HP_KEY bytes). After
 * serving a request the thread polls for spin_us microseconds before sleeping (0: never
 * polls). A begun request must progress within request_ms; at most max_conns connections are
 * open. Returns NULL and writes a message to err on failure. */
hp_server *hp_create(int listen_fd, int32_t my_pe, int32_t n_pes, const unsigned char *key,
                     uintptr_t amo_fn, uint32_t spin_us, uint32_t request_ms, uint32_t max_conns,
                     char *err, size_t errlen);
/* HMAC-SHA256 of parts (for the client side and tests): see hp_auth.h. */
void hp_mac(const unsigned char *key, const unsigned char *label, size_t label_len,
            const unsigned char *nc, const unsigned char *ns, uint32_t client_pe,
            uint32_t server_pe, unsigned char *out);
/* Make segment seg reachable: 0, VK_ST_SEG (seg id out of range), VK_ST_BUSY (registered
 * differently). */
int hp_register(hp_server *s, uint32_t seg, uintptr_t base, uint64_t size);
/* Counters: [0] connections accepted, [1] open, [2] requests served, [3] errors recorded,
 * [4] connections that ended without authenticating: refused, failed, gone or out of time
 *     (or dropped for the caps); their failures are not errors (those are the job's peers'),
 * [5] connections dropped for a request that stopped making progress. */
void hp_stats(hp_server *s, uint64_t *out); /* 6 counters */
/* Copy the last recorded error message; returns the number of errors recorded so far. */
uint64_t hp_last_error(hp_server *s, char *buf, size_t buflen);
/* Stop the thread, join it, close every socket, free everything. */
void hp_destroy(hp_server *s);

#endif
