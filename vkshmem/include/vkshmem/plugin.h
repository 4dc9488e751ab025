/* vkshmem plugin ABI: what a native transport or memory domain shares with vkshmem's core.
 *
 * The one definition of the native interface between vkshmem and its plugins (the core's own
 * vkshmem/core/_native.h includes it). A plugin puts vkshmem.plugin.get_include() on its
 * include path and writes #include <vkshmem/plugin.h>; vkshmem.plugin.header_cdef turns this
 * file (or the plugin's own header) into a cffi cdef.
 *
 *  - the AMO op codes (the same as vkshmem.plugin.AmoOp) and the type of the core's vk_amo
 *    (TransportContext.amo_function), which applies an AMO atomically with every other path;
 *  - struct vk_native_ops: a transport's data path in C (Transport.native_ops);
 *  - struct vk_watch: the core's wake board (a transport that applies incoming data itself
 *    pokes it);
 *  - struct vk_domain_ops: a memory domain's operations on its segment (MemoryDomain.native_ops);
 *  - the status codes VK_ST_*: what every native call of a plugin returns besides 0 (the
 *    Python side, vkshmem.plugin.NativeTransport, turns them into exceptions; the text after
 *    each code is its message there).
 *
 * Changing a layout or a value here is a change of the plugin API's major version
 * (vkshmem.plugin.API_VERSION); adding a code or a flag, of its minor version.
 */
#ifndef VKSHMEM_PLUGIN_H
#define VKSHMEM_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

/* -- status codes -------------------------------------------------------------------------
 * 0 is success. Negative values from -1001 to -1099 are these; other negative values are the
 * plugin's own library's (ucs_status_t, -FI_*, -errno), which the plugin names itself. */
#define VK_ST_OK 0
#define VK_ST_PEER (-1001)      /* the PE is not reachable (it published no address) */
#define VK_ST_SEG (-1002)       /* the PE has no such segment registered */
#define VK_ST_BOUNDS (-1003)    /* the range is outside the segment */
#define VK_ST_ALIGN (-1004)     /* the AMO is not aligned to its width */
#define VK_ST_AMO (-1005)       /* unsupported AMO op or width */
#define VK_ST_CLOSED (-1006)    /* the transport is closed */
#define VK_ST_NOMEM (-1007)     /* out of memory */
#define VK_ST_TOOBIG (-1008)    /* a blob does not fit the caller's buffer */
#define VK_ST_TIMEDOUT (-1009)  /* no completion within the transport's timeout */
#define VK_ST_FAILED (-1010)    /* abandoned: a PE of the job failed */
#define VK_ST_BUSY (-1011)      /* another transport of this process allocated the range */
#define VK_ST_NODMABUF (-1012)  /* this build cannot register dma-buf memory */
#define VK_ST_RANDOM (-1013)    /* no random bytes for a key */
#define VK_ST_BROKEN (-1014)    /* the connection failed or is unusable */
#define VK_ST_REJECTED (-1015)  /* the target rejected the request */
#define VK_ST_CONNECT (-1016)   /* connecting to the PE failed */
#define VK_ST_AUTH (-1017)      /* authentication failed */
#define VK_ST_INTR (-1018)      /* interrupted: a signal handler raised */
#define VK_ST_PROTO (-1019)     /* protocol error: unknown request, or one out of order */
#define VK_ST_HELLO (-1020)     /* refused greeting: wrong magic, version or PE */
#define VK_ST_COMPLETION (-1021) /* a completion reported an error */
#define VK_ST_FIRST (-1001)     /* the range of VK_ST_* codes (reserved to -1099) */
#define VK_ST_LAST (-1099)

/* -- atomics ------------------------------------------------------------------------------ */
enum { VK_FETCH = 0, VK_SET, VK_SWAP, VK_CSWAP, VK_ADD, VK_AND, VK_OR, VK_XOR };

/* The core's vk_amo (TransportContext.amo_function, DomainContext.amo_function): applies op
 * to the width-byte (4 or 8) word at addr with the CPU's atomics and returns the old value. */
typedef uint64_t (*vk_amo_fn)(uintptr_t addr, int op, int width, uint64_t operand,
                              uint64_t compare);

/* -- a transport's data path in C ---------------------------------------------------------
 * Transport.native_ops returns the address of one: the core's compiled hot path calls these
 * for PEs the transport reaches, with the GIL released, instead of the transport's Python
 * methods. Each returns 0 or a status (VK_ST_* or the plugin's own), which
 * Transport.native_error turns into the exception its Python method would raise. put and
 * get are blocking (nbi = 0): the source is reusable, the destination filled on return.
 * quiet and fence (NULL: not offered; then the core calls the Python methods) do what
 * Transport.quiet/fence do (mode 0, or VK_NATIVE_TRY as below); they may also return
 * VK_NATIVE_PYTHON: "not done, call the Python method" (e.g. it holds buffers of
 * non-blocking operations to release).
 * With VK_NATIVE_CAN_TRY in flags, put/get also take nbi = VK_NATIVE_TRY, amo takes
 * fetch | VK_NATIVE_TRY and quiet/fence mode VK_NATIVE_TRY: "only if it completes without
 * waiting" (the core then holds the GIL and has not pinned the buffers, so the call must
 * neither wait nor keep the pointers); such a call returns VK_NATIVE_AGAIN, having done
 * nothing, when it would have to wait, and the core repeats it as a blocking call with the
 * GIL released. */

/* The wake board: waking a PE's long waits on its own memory (the core's wait_until,
 * signal_wait, barrier waits). A transport may offer `watch` (VK_NATIVE_CAN_WATCH) where every
 * write and AMO of a peer to this PE's memory through it is applied inside the transport by a
 * thread of this process: its progress thread, or a caller reading its completions (libfabric
 * providers with manual data progress: tcp;ofi_rxm, shm), never by a peer storing into the
 * memory itself (shared memory, RDMA hardware) nor by a thread it does not run. The core calls
 * watch(self, w), with or without the GIL, when one of its waits stops spinning; from then on
 * the transport (1) calls w->poke(w), from any thread, after each step of its progress that
 * may have applied incoming data (a CQ read; cheap while nothing waits) and (2) makes sure
 * that its progress runs without this PE's caller (e.g. wakes a progress thread it had paused
 * while the caller drove the progress itself). The core then sleeps on a futex that poke wakes
 * once the awaited word holds, instead of checking it every 50 us; it does so only while every
 * peer's route and every open transport offer watch (no peer on the shm path, no memory domain
 * open), and every sleep is bounded (a poke that never comes costs a wait at most 1 ms, its
 * slice). w stays valid for the life of the process. */
struct vk_watch {
    void (*poke)(struct vk_watch *w);
};

struct vk_native_ops {
    void *self;
    int (*put)(void *self, int32_t pe, uint32_t seg, uint64_t off, const void *src,
               size_t n, int nbi);
    int (*get)(void *self, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n,
               int nbi);
    int (*amo)(void *self, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
               uint64_t operand, uint64_t compare, int fetch, uint64_t *result);
    int (*quiet)(void *self, int mode);
    int (*fence)(void *self, int mode);
    unsigned flags;
    /* only with VK_NATIVE_CAN_WATCH in flags (the struct ends at flags without it): */
    void (*watch)(void *self, struct vk_watch *w);
};

#define VK_NATIVE_CAN_TRY 1u   /* flags: put/get/amo accept VK_NATIVE_TRY */
#define VK_NATIVE_CAN_WATCH 2u /* flags: watch is there (struct vk_watch above) */
#define VK_NATIVE_TRY 2        /* or-ed into put/get's nbi (0) and amo's fetch */
#define VK_NATIVE_AGAIN 1      /* a VK_NATIVE_TRY call would have to wait: nothing done */
#define VK_NATIVE_PYTHON 2     /* quiet/fence: call the transport's Python method instead */

/* -- a memory domain's operations on its own segment --------------------------------------
 * MemoryDomain.native_ops returns the address of one: the domain proxy's native rounds serve
 * requests with them, GIL released. start issues a copy between the segment at off and host
 * memory (to_device 1: host -> segment; the host side lies in memory the domain registered:
 * the host heap, peers' mailboxes) without waiting; quiet completes every copy started; amo
 * (NULL: not offered, those requests go to Python) applies op to the word and stores the old
 * value. Each returns 0 or the domain's error code. Copies of up to write_max / read_max bytes
 * are done by the CPU through mapped (NULL: none) instead, each followed by a store fence. */
struct vk_domain_ops {
    void *self;
    int (*start)(void *self, int to_device, uint64_t off, void *host, uint64_t n);
    int (*quiet)(void *self);
    int (*amo)(void *self, uint64_t off, int op, int width, uint64_t operand, uint64_t compare,
               uint64_t *old);
    uint64_t size;              /* the segment's bytes */
    uint8_t *mapped;            /* the segment in this process's address space, or NULL */
    uint64_t write_max, read_max;
};

#endif
