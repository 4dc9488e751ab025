/* The domain proxy's native rounds (vkshmem.core.proxy.serve; the protocol and the mailbox
 * layout: vkshmem.core.proxy.protocol). Part of the core's cffi helper vkshmem.core._native
 * (appended to _native_build.py's SOURCE, after vk_proxy_due).
 *
 * vk_proxy_serve lists the requests due, like vk_proxy_due, and serves them in C when every
 * one of them comes from a sender whose mailbox is mapped here (the shm path) or that a
 * transport with a data path in C reaches (struct vk_native_ops), and is a put, a get, or an
 * AMO the domain offers in C (struct vk_domain_ops): each request's copy is started,
 * overlapping ones ordered by a quiet, AMOs applied after the round's copies so far; then one
 * quiet, and every answer goes into the sender's mailbox (header, a get's payload unless it
 * already landed there by DMA), a fence, then the answer word: by stores where the mailbox is
 * mapped here, else by the transport's put, fence, put.
 * Otherwise it serves nothing and returns minus the number found, the requests listed in due
 * for the Python round. Errors (a request past the segment, a failed copy) become error
 * answers, as in Python. */

#include <stdio.h>

#define VKP_HEAD 64
#define VKP_PUT 1
#define VKP_GET 2
#define VKP_AMO 3
#define VKP_TEXT 480 /* bytes of an error answer's text */
/* gets from this size up, answered through a transport from a CPU-mapped segment, are sent
 * straight from the mapping (a second put, instead of a copy next to the header) */
#define VKP_SEND_MAPPED (64u << 10)
/* answers of at least this many bytes go into a sender's mapped answer area with streaming
 * stores (copy_stream.h): the sender's core reads them next, and read the area's lines last */
#define VKP_STREAM_MIN (128u << 10)

struct vk_proxy {
    uint64_t *bells;   /* this PE's mailbox (the bells come first) */
    uint64_t *next;    /* [n]: the seq due from each sender */
    uint64_t *due;     /* [3 * n * depth]: (sender, slot, seq) found */
    uint64_t *answer;  /* [4 * n * depth]: value, status, nbytes, bytes to send */
    uint64_t *ranges;  /* [3 * n * depth]: the round's copies: lo, hi, write */
    uint8_t **peer;    /* [n]: each sender's mailbox mapped here (NULL: not mapped) */
    struct vk_native_ops **route; /* [n]: else the transport that reaches it, in C (NULL) */
    uint8_t *direct;   /* [n]: 1 where the sender's block for this PE is registered */
    struct vk_domain_ops *dom;
    uint64_t base;     /* the mailbox's offset in the host heap (segment 0) */
    uint64_t answers, blocks, area, chunk;
    int n, depth, me;
    uint64_t rounds, requests, direct_pieces, max_round, answer_errors, mapped_sends;
};

struct vkp_hdr { /* struct.Struct("<IIQQQQQ") of vkshmem/core/proxy/mailbox.py's HDR */
    uint32_t op, width;
    uint64_t offset, nbytes, operand, compare, seq;
};

static inline uint8_t *vkp_request(struct vk_proxy *p, int s, uint64_t j) {
    return (uint8_t *)p->bells + p->blocks + ((uint64_t)s * p->depth + j) * 2 * p->area;
}

/* Where this PE's answer to sender s's slot j goes: in s's mailbox, the response area after
 * the request area of (sender me, slot j). */
static inline uint8_t *vkp_response(struct vk_proxy *p, int s, uint64_t j) {
    return p->peer[s] + p->blocks + ((uint64_t)p->me * p->depth + j) * 2 * p->area + p->area;
}

static int vkp_servable(struct vk_proxy *p, int s, const struct vkp_hdr *h) {
    struct vk_native_ops *t = p->route[s];
    if (!p->peer[s] && !(t && t->put && t->fence)) return 0;
    int kind = (int)(h->op & 0xFF);
    if (kind == VKP_AMO) return p->dom->amo != NULL;
    return kind == VKP_PUT || kind == VKP_GET;
}

/* Complete the round's copies so far when [lo, lo + n) overlaps one of them and either
 * writes; then record it. */
static int vkp_order(struct vk_proxy *p, int *nr, uint64_t lo, uint64_t n, int write) {
    uint64_t hi = lo + n;
    int rc = 0;
    for (int i = 0; i < *nr; i++) {
        uint64_t *r = p->ranges + 3 * i;
        if (r[0] < hi && lo < r[1] && (write || r[2])) {
            rc = p->dom->quiet(p->dom->self);
            *nr = 0;
            break;
        }
    }
    uint64_t *r = p->ranges + 3 * (*nr)++;
    r[0] = lo;
    r[1] = hi;
    r[2] = (uint64_t)write;
    return rc;
}

/* An error answer: the text goes in the request's payload area (as Python's _fail). */
static void vkp_fail(struct vk_proxy *p, int i, uint8_t *req, const char *text) {
    int len = snprintf((char *)req + VKP_HEAD, VKP_TEXT, "%s", text);
    if (len < 0) len = 0;
    if (len >= VKP_TEXT) len = VKP_TEXT - 1;
    uint64_t *a = p->answer + 4 * i;
    a[0] = 0;
    a[1] = 1;
    a[2] = a[3] = (uint64_t)len;
}

/* Start (or, through the mapping, do) request i's work; its answer in p->answer. */
static void vkp_start(struct vk_proxy *p, int i, int s, uint64_t j, uint8_t *req, int *nr) {
    struct vkp_hdr h;
    memcpy(&h, req, sizeof h);
    struct vk_domain_ops *d = p->dom;
    uint64_t *a = p->answer + 4 * i;
    char text[VKP_TEXT];
    int kind = (int)(h.op & 0xFF), rc = 0;
    a[0] = a[1] = a[2] = a[3] = 0;
    if (h.seq != p->due[3 * i + 2]) {
        snprintf(text, sizeof text, "ProxyError: request %llu found where %llu was due",
                 (unsigned long long)h.seq, (unsigned long long)p->due[3 * i + 2]);
        vkp_fail(p, i, req, text);
        return;
    }
    uint64_t n = kind == VKP_AMO ? h.width : h.nbytes;
    if (kind != VKP_AMO && n > p->chunk) {
        snprintf(text, sizeof text, "ProxyError: request of %llu bytes exceeds the proxy chunk",
                 (unsigned long long)n);
        vkp_fail(p, i, req, text);
        return;
    }
    if (h.offset > d->size || n > d->size - h.offset) {
        snprintf(text, sizeof text, "InvalidArgumentError: proxy %s of %llu bytes at offset "
                 "%llu runs past the end of the segment (%llu bytes)",
                 kind == VKP_PUT ? "put" : kind == VKP_GET ? "get" : "AMO",
                 (unsigned long long)n, (unsigned long long)h.offset,
                 (unsigned long long)d->size);
        vkp_fail(p, i, req, text);
        return;
    }
    uint8_t *payload = req + VKP_HEAD;
    if (kind == VKP_PUT) {
        rc = vkp_order(p, nr, h.offset, n, 1);
        if (!rc && d->mapped && n <= d->write_max) {
            memcpy(d->mapped + h.offset, payload, n);
            /* drain a write-combined mapping before a device copy or an AMO may read it */
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
        } else if (!rc && n) {
            rc = d->start(d->self, 1, h.offset, payload, n);
        }
    } else if (kind == VKP_GET) {
        uint8_t *dst = payload;
        a[2] = a[3] = n;
        if (p->peer[s] && p->direct[s]) { /* straight into the sender's answer area */
            dst = vkp_response(p, s, j) + VKP_HEAD;
            a[3] = 0;
            p->direct_pieces++;
        }
        rc = vkp_order(p, nr, h.offset, n, 0);
        if (!rc && !p->peer[s] && d->mapped && n <= d->read_max && n >= VKP_SEND_MAPPED) {
            /* the transport sends the payload straight from the mapping (no copy into the
             * request area), now, so later requests of the round cannot change it; the
             * answer's header follows it on the same endpoint */
            struct vk_native_ops *t = p->route[s];
            uint64_t at = p->base + p->blocks + ((uint64_t)p->me * p->depth + j) * 2 * p->area
                          + p->area + VKP_HEAD;
            if (t->put(t->self, s, 0, at, d->mapped + h.offset, n, 0)) {
                p->answer_errors++;
                vkp_fail(p, i, req, "TransportError: sending the answer's payload failed");
                return;
            }
            a[3] = 0;
            p->mapped_sends++;
        } else if (!rc && d->mapped && n <= d->read_max) {
            if (dst != payload && n >= VKP_STREAM_MIN) /* the sender reads it on its core */
                copy_stream((char *)dst, (const char *)d->mapped + h.offset, n);
            else
                memcpy(dst, d->mapped + h.offset, n);
        }
        else if (!rc && n)
            rc = d->start(d->self, 0, h.offset, dst, n);
    } else { /* VKP_AMO */
        if ((h.width != 4 && h.width != 8) || h.offset % h.width || (h.op >> 8) > 7) {
            snprintf(text, sizeof text, "InvalidArgumentError: AMOs take aligned 4- or 8-byte "
                     "words and ops 0-7; got %u bytes at offset %llu, op %u", h.width,
                     (unsigned long long)h.offset, h.op >> 8);
            vkp_fail(p, i, req, text);
            return;
        }
        if (*nr) {
            rc = d->quiet(d->self);
            *nr = 0;
        }
        if (!rc)
            rc = d->amo(d->self, h.offset, (int)(h.op >> 8), (int)h.width, h.operand,
                        h.compare, &a[0]);
    }
    if (rc) {
        snprintf(text, sizeof text, "GpuError: the domain's device operation failed "
                 "(error %d)", rc);
        vkp_fail(p, i, req, text);
    }
}

/* Write request i's answer into its sender's mailbox: header (and payload), fence, seq;
 * by stores where it is mapped here, else by the transport's puts. A transport's failure
 * leaves that sender to time out (counted in answer_errors), as in Python. */
static void vkp_answer(struct vk_proxy *p, int i, int s, uint64_t j, uint8_t *req) {
    uint64_t *a = p->answer + 4 * i;
    uint64_t resp[3] = {a[0], a[1], a[2]}, seq = p->due[3 * i + 2];
    memcpy(req, resp, sizeof resp);
    uint64_t slot = (uint64_t)p->me * p->depth + j;
    if (p->peer[s]) {
        memcpy(vkp_response(p, s, j), req, VKP_HEAD + a[3]);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        __atomic_store_n((uint64_t *)(p->peer[s] + p->answers) + slot, seq, __ATOMIC_RELEASE);
        return;
    }
    struct vk_native_ops *t = p->route[s];
    uint64_t at = p->base + p->blocks + slot * 2 * p->area + p->area;
    int rc = t->put(t->self, s, 0, at, req, VKP_HEAD + a[3], 0);
    if (!rc) rc = t->fence(t->self, 0);
    if (!rc) rc = t->put(t->self, s, 0, p->base + p->answers + slot * 8, &seq, 8, 0);
    if (rc) p->answer_errors++;
}

int vk_proxy_serve(struct vk_proxy *p, uint64_t max_ns) {
    int found = vk_proxy_due(p->bells, p->next, p->n, p->depth, p->due, p->n * p->depth,
                             max_ns);
    if (found <= 0) return found;
    for (int i = 0; i < found; i++) {
        struct vkp_hdr h;
        memcpy(&h, vkp_request(p, (int)p->due[3 * i], p->due[3 * i + 1]), sizeof h);
        if (!vkp_servable(p, (int)p->due[3 * i], &h)) return -found;
    }
    int nr = 0;
    for (int i = 0; i < found; i++) {
        int s = (int)p->due[3 * i];
        uint64_t j = p->due[3 * i + 1];
        vkp_start(p, i, s, j, vkp_request(p, s, j), &nr);
    }
    int rc = p->dom->quiet(p->dom->self);
    for (int i = 0; i < found; i++) {
        int s = (int)p->due[3 * i];
        uint64_t j = p->due[3 * i + 1];
        uint8_t *req = vkp_request(p, s, j);
        if (rc && p->answer[4 * i + 1] == 0) {
            char text[VKP_TEXT];
            snprintf(text, sizeof text, "GpuError: the domain's device copies failed "
                     "(error %d)", rc);
            vkp_fail(p, i, req, text);
        }
        vkp_answer(p, i, s, j, req);
    }
    p->rounds++;
    p->requests += (uint64_t)found;
    if ((uint64_t)found > p->max_round) p->max_round = (uint64_t)found;
    return found;
}

/* struct vk_domain_ops for a segment the CPU reaches coherently at base (a CPU Vulkan
 * driver's host-visible, cached memory): every copy goes through the mapping, AMOs are the
 * CPU's (atomic with every other vk_amo on the word). */
static int vkp_mapped_start(void *self, int to_device, uint64_t off, void *host, uint64_t n) {
    return -1; /* not reached: write_max and read_max cover every size */
}

static int vkp_mapped_quiet(void *self) { return 0; }

static int vkp_mapped_amo(void *self, uint64_t off, int op, int width, uint64_t operand,
                          uint64_t compare, uint64_t *old) {
    *old = vk_amo_impl((uintptr_t)self + off, op, width, operand, compare);
    return 0;
}

void vk_mapped_domain_ops(struct vk_domain_ops *ops, uintptr_t base, uint64_t size) {
    ops->self = (void *)base;
    ops->start = vkp_mapped_start;
    ops->quiet = vkp_mapped_quiet;
    ops->amo = vkp_mapped_amo;
    ops->size = size;
    ops->mapped = (uint8_t *)base;
    ops->write_max = ops->read_max = UINT64_MAX;
}
