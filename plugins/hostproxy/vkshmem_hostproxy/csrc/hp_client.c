/* vkshmem-hostproxy client: the requests and the API (see hp_client.h; connections are in
 * hp_conn.c). Each connection has a mutex held for a whole request (and for quiet, every dirty
 * connection's, in PE order). Built into the same cffi module as hp_server.c and hp_conn.c (the
 * extern "Python" callback _hpc_signalled is defined by cffi).
 */
#include "hp_conn.h"

/* -- requests ------------------------------------------------------------------------------- */

static int range_error(hpc_conn *k, uint32_t seg, int64_t off, uint64_t n, uint64_t size) {
    if (size == UINT64_MAX)
        return fail(VK_ST_SEG, 0, "hostproxy: %s has no segment %u registered", k->where, seg);
    return fail(VK_ST_BOUNDS, 0, "hostproxy: %llu bytes at offset %lld are outside segment %u of "
                "%s (%llu bytes)", (unsigned long long)n, (long long)off, seg, k->where,
                (unsigned long long)size);
}

/* 0 when [off, off + n) lies in PE pe's segment seg (as it published it). */
static int in_range(hpc_client *c, hpc_conn *k, uint32_t seg, int64_t off, uint64_t n) {
    hpc_sizes *s = __atomic_load_n(&c->targets[k->pe].sizes, __ATOMIC_ACQUIRE);
    uint64_t size = s && seg < s->cap ? s->size[seg] : UINT64_MAX;
    if (size == UINT64_MAX || off < 0 || (uint64_t)off > size || n > size - (uint64_t)off)
        return range_error(k, seg, off, n, size);
    return 0;
}

/* The connection to pe, locked and usable, for a request on [off, off + n) of seg. */
static hpc_conn *begin(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, uint64_t n,
                       int *rc) {
    hpc_conn *k = conn_get(c, pe, rc);
    if (!k) return NULL;
    if ((*rc = in_range(c, k, seg, off, n)) != 0) return NULL;
    pthread_mutex_lock(&k->lock);
    if (k->broken[0]) {
        *rc = unusable(k);
        pthread_mutex_unlock(&k->lock);
        return NULL;
    }
    return k;
}

/* The address of [off, off + n) in this PE's segment seg, or NULL (status in *rc). */
static unsigned char *local(hpc_client *c, uint32_t seg, int64_t off, uint64_t n, int *rc) {
    if (__atomic_load_n(&c->closed, __ATOMIC_ACQUIRE)) { /* the segments may be gone */
        *rc = fail(VK_ST_CLOSED, 0, "the transport is closed");
        return NULL;
    }
    uintptr_t base = seg < HP_MAX_SEGS ? __atomic_load_n(&c->local_base[seg], __ATOMIC_ACQUIRE)
                                       : 0;
    uint64_t size = base ? c->local_size[seg] : UINT64_MAX;
    if (!base || off < 0 || (uint64_t)off > size || n > size - (uint64_t)off) {
        if (size == UINT64_MAX)
            *rc = fail(VK_ST_SEG, 0, "hostproxy: this PE (%d) has no segment %u registered",
                       c->my_pe, seg);
        else
            *rc = fail(VK_ST_BOUNDS, 0, "hostproxy: %llu bytes at offset %lld are outside "
                       "segment %u of this PE (%d) (%llu bytes)", (unsigned long long)n,
                       (long long)off, seg, c->my_pe, (unsigned long long)size);
        return NULL;
    }
    return (unsigned char *)(base + (uintptr_t)off);
}

static int do_put(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, const void *src,
                  size_t n) {
    int rc;
    unsigned char *p;
    if (pe == c->my_pe) {
        if (!(p = local(c, seg, off, n, &rc))) return rc;
        memmove(p, src, n);
        return 0;
    }
    hpc_conn *k = begin(c, pe, seg, off, n, &rc);
    if (!k) return rc;
    unsigned char h[HP_REQ_SIZE];
    hp_header(h, HP_OP_PUT, 0, 0, seg, (uint64_t)off, n, 0);
    struct iovec iov[2] = {{h, sizeof h}, {(void *)src, n}};
    k->dirty = 1;
    rc = send_all(c, k, iov, n ? 2 : 1, "sending a put");
    pthread_mutex_unlock(&k->lock);
    return rc;
}

static int do_get(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, void *dst, size_t n) {
    int rc;
    unsigned char *p;
    if (pe == c->my_pe) {
        if (!(p = local(c, seg, off, n, &rc))) return rc;
        memmove(dst, p, n);
        return 0;
    }
    hpc_conn *k = begin(c, pe, seg, off, n, &rc);
    if (!k) return rc;
    unsigned char h[HP_REQ_SIZE], rep[HP_REP_SIZE];
    hp_header(h, HP_OP_GET, 0, 0, seg, (uint64_t)off, n, 0);
    rc = send_bytes(c, k, h, sizeof h, "sending a get");
    if (!rc) {
        struct iovec iov[2] = {{rep, sizeof rep}, {dst, n}};
        size_t got;
        rc = recv_all(c, k, iov, n ? 2 : 1, "getting", &got);
        /* a rejection (a short reply, then the end of the stream) */
        if (rc == VK_ST_BROKEN && got >= HP_REP_SIZE && (int32_t)rd32(rep) < 0)
            rc = check_reply(k, rep, NULL);
        else if (!rc)
            rc = check_reply(k, rep, NULL);
        if (!rc) k->dirty = 0; /* the reply proves every earlier request was applied */
    }
    pthread_mutex_unlock(&k->lock);
    return rc;
}

static int do_amo(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, int op, int width,
                  uint64_t operand, uint64_t compare, int fetch, uint64_t *result) {
    int rc;
    hpc_conn *k = NULL;
    unsigned char *p = NULL;
    if (width != 4 && width != 8)
        return fail(VK_ST_AMO, 0, "hostproxy: AMO width %d (4 or 8 bytes only)", width);
    if (pe == c->my_pe) {
        if (!(p = local(c, seg, off, (uint64_t)width, &rc))) return rc;
    } else {
        if (!(k = conn_get(c, pe, &rc))) return rc;
        if ((rc = in_range(c, k, seg, off, (uint64_t)width)) != 0) return rc;
    }
    if (off % width)
        return fail(VK_ST_ALIGN, 0, "hostproxy: AMO at offset %lld is not aligned to its width %d",
                    (long long)off, width);
    uint64_t mask = width == 8 ? UINT64_MAX : 0xffffffffu;
    if (p) { /* this PE's word: the core's atomic, as the server applies peers' AMOs */
        *result = c->amo((uintptr_t)p, op, width, operand & mask, compare & mask);
        if (!fetch) *result = 0;
        return 0;
    }
    unsigned char h[HP_REQ_SIZE];
    hp_header(h, fetch ? HP_OP_AMO_FETCH : HP_OP_AMO, (unsigned)op, (unsigned)width, seg,
              (uint64_t)off, operand & mask, compare & mask);
    pthread_mutex_lock(&k->lock);
    if (k->broken[0]) {
        rc = unusable(k);
    } else if (!fetch) {
        k->dirty = 1;
        rc = send_bytes(c, k, h, sizeof h, "sending an AMO");
        *result = 0;
    } else if (!(rc = send_bytes(c, k, h, sizeof h, "sending an AMO")) &&
               !(rc = read_reply(c, k, "fetching an AMO", result))) {
        k->dirty = 0;
    }
    pthread_mutex_unlock(&k->lock);
    return rc;
}

/* The current connections with un-acknowledged puts/AMOs (malloc'd; *n of them), PE order. */
static hpc_conn **dirty_conns(hpc_client *c, int *n) {
    *n = 0;
    hpc_conn **out = NULL;
    pthread_mutex_lock(&c->lock);
    int count = 0;
    for (hpc_conn *k = c->all; k; k = k->next_all)
        count += c->conns[k->pe] == k && __atomic_load_n(&k->dirty, __ATOMIC_RELAXED);
    if (count && (out = malloc(sizeof *out * (size_t)count)) != NULL) {
        for (int32_t pe = 0; pe < c->n_pes && *n < count; pe++) {
            hpc_conn *k = c->conns[pe];
            if (k && __atomic_load_n(&k->dirty, __ATOMIC_RELAXED)) out[(*n)++] = k;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return out;
}

static int do_quiet(hpc_client *c) {
    int n, rc = 0;
    hpc_conn **pending = dirty_conns(c, &n);
    if (!pending) return 0;
    static const unsigned char zero[HP_REQ_SIZE];
    unsigned char flush[HP_REQ_SIZE];
    memcpy(flush, zero, sizeof flush);
    flush[0] = HP_OP_FLUSH;
    char *sent = calloc((size_t)n, 1);
    char first[HPC_MSGLEN];
    int first_status = 0;
    first[0] = 0;
    for (int i = 0; i < n; i++) /* PE order: concurrent quiets lock in the same order */
        pthread_mutex_lock(&pending[i]->lock);
    for (int i = 0; i < n && rc != VK_ST_INTR; i++) {
        hpc_conn *k = pending[i];
        int r = 0;
        if (k->broken[0]) r = unusable(k);
        else if (k->dirty && !(r = send_bytes(c, k, flush, sizeof flush, "sending a flush")))
            sent[i] = 1;
        if (r && !rc) {
            rc = r;
            first_status = last_status;
            memcpy(first, last_msg, sizeof first);
        }
        if (r == VK_ST_INTR) rc = r;
    }
    for (int i = 0; i < n; i++) {
        hpc_conn *k = pending[i];
        if (!sent[i]) continue;
        if (rc == VK_ST_INTR) { /* its flush reply will never be read */
            if (!k->broken[0]) conn_retire(c, k, "a request on it was interrupted");
            continue;
        }
        int r = read_reply(c, k, "waiting for a flush", NULL);
        if (!r) k->dirty = 0;
        if (r == VK_ST_INTR) rc = r;
        else if (r && !rc) {
            rc = r;
            first_status = last_status;
            memcpy(first, last_msg, sizeof first);
        }
    }
    for (int i = 0; i < n; i++) pthread_mutex_unlock(&pending[i]->lock);
    if (rc && rc != VK_ST_INTR) fail(rc, first_status, "%s", first);
    else if (rc == VK_ST_INTR) fail(rc, EINTR, "interrupted");
    free(sent);
    free(pending);
    return rc;
}

/* -- the API --------------------------------------------------------------------------------- */

#define COUNTED(field) __atomic_fetch_add(&c->field, 1, __ATOMIC_RELAXED)

int hpc_put(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, const void *src, size_t n) {
    COUNTED(n_python);
    return do_put(c, pe, seg, off, src, n);
}

int hpc_get(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, void *dst, size_t n) {
    COUNTED(n_python);
    return do_get(c, pe, seg, off, dst, n);
}

int hpc_amo(hpc_client *c, int32_t pe, uint32_t seg, int64_t off, int op, int width,
            uint64_t operand, uint64_t compare, int fetch, uint64_t *result) {
    COUNTED(n_python);
    return do_amo(c, pe, seg, off, op, width, operand, compare, fetch, result);
}

int hpc_quiet(hpc_client *c) {
    COUNTED(n_python);
    return do_quiet(c);
}

static int native_put(void *self, int32_t pe, uint32_t seg, uint64_t off, const void *src,
                      size_t n, int nbi) {
    hpc_client *c = self;
    COUNTED(n_native);
    return do_put(c, pe, seg, (int64_t)off, src, n);
}

static int native_get(void *self, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n,
                      int nbi) {
    hpc_client *c = self;
    COUNTED(n_native);
    return do_get(c, pe, seg, (int64_t)off, dst, n);
}

static int native_amo(void *self, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
                      uint64_t operand, uint64_t compare, int fetch, uint64_t *result) {
    hpc_client *c = self;
    COUNTED(n_native);
    return do_amo(c, pe, seg, (int64_t)off, op, width, operand, compare, fetch, result);
}

static int native_quiet(void *self, int mode) {
    hpc_client *c = self;
    COUNTED(n_native);
    return do_quiet(c);
}

static int native_fence(void *self, int mode) {
    return 0; /* one ordered stream per target, served in order */
}

void hpc_native_ops(hpc_client *c, struct vk_native_ops *ops) {
    *ops = (struct vk_native_ops){.self = c, .put = native_put, .get = native_get,
                                  .amo = native_amo, .quiet = native_quiet,
                                  .fence = native_fence, .flags = 0};
}

void hpc_stats(hpc_client *c, uint64_t *out) {
    out[0] = __atomic_load_n(&c->n_native, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&c->n_python, __ATOMIC_RELAXED);
    out[2] = __atomic_load_n(&c->n_opened, __ATOMIC_RELAXED);
}

hpc_client *hpc_create(int32_t my_pe, int32_t n_pes, int rail, const unsigned char *key,
                       double timeout_s, uintptr_t amo_fn) {
    if (n_pes < 1 || !amo_fn) return NULL;
    hpc_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->targets = calloc((size_t)n_pes, sizeof *c->targets);
    c->conns = calloc((size_t)n_pes, sizeof *c->conns);
    if (!c->targets || !c->conns) {
        free(c->targets);
        free(c->conns);
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->my_pe = my_pe;
    c->n_pes = n_pes;
    c->rail = rail;
    memcpy(c->key, key, HP_KEY);
    c->timeout_s = timeout_s;
    c->amo = (vk_amo_fn)amo_fn;
    c->tv.tv_sec = (time_t)timeout_s;
    c->tv.tv_usec = (suseconds_t)((timeout_s - (double)c->tv.tv_sec) * 1e6);
    if (c->tv.tv_sec == 0 && c->tv.tv_usec == 0) c->tv.tv_usec = 1;
    return c;
}

int hpc_set_target(hpc_client *c, int32_t pe, const char *host, const char *port) {
    if (pe < 0 || pe >= c->n_pes) return VK_ST_PEER;
    char *h = strdup(host), *p = strdup(port);
    if (!h || !p) {
        free(h);
        free(p);
        return VK_ST_NOMEM;
    }
    pthread_mutex_lock(&c->lock);
    hpc_target *t = &c->targets[pe];
    free(t->host);
    free(t->port);
    t->host = h;
    t->port = p;
    pthread_mutex_unlock(&c->lock);
    return 0;
}

int hpc_set_local(hpc_client *c, uint32_t seg, uintptr_t base, uint64_t size) {
    if (seg >= HP_MAX_SEGS || !base) return VK_ST_BOUNDS;
    c->local_size[seg] = size;
    __atomic_store_n(&c->local_base[seg], base, __ATOMIC_RELEASE);
    return 0;
}

int hpc_set_size(hpc_client *c, int32_t pe, uint32_t seg, uint64_t size) {
    if (pe < 0 || pe >= c->n_pes || seg >= HP_MAX_SEGS) return VK_ST_BOUNDS;
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    hpc_target *t = &c->targets[pe];
    hpc_sizes *s = t->sizes;
    if (!s || seg >= s->cap) { /* grow: readers may still hold the old array (kept) */
        uint32_t cap = seg < 16 ? 16 : HP_MAX_SEGS;
        hpc_sizes *g = malloc(sizeof *g + sizeof(uint64_t) * cap);
        if (!g) {
            rc = VK_ST_NOMEM;
            goto out;
        }
        g->cap = cap;
        g->older = s;
        for (uint32_t i = 0; i < cap; i++) g->size[i] = s && i < s->cap ? s->size[i] : UINT64_MAX;
        __atomic_store_n(&t->sizes, g, __ATOMIC_RELEASE);
        s = g;
    }
    __atomic_store_n(&s->size[seg], size, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void hpc_close(hpc_client *c) {
    static const unsigned char zero[HP_REQ_SIZE];
    pthread_mutex_lock(&c->lock);
    if (c->closed) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    __atomic_store_n(&c->closed, 1, __ATOMIC_RELEASE);
    for (int32_t pe = 0; pe < c->n_pes; pe++) __atomic_store_n(&c->conns[pe], NULL,
                                                               __ATOMIC_RELEASE);
    hpc_conn *all = c->all;
    pthread_mutex_unlock(&c->lock);
    for (hpc_conn *k = all; k; k = k->next_all) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        if (pthread_mutex_timedlock(&k->lock, &until) == 0) {
            if (!k->broken[0] && k->fd >= 0) {
                unsigned char bye[HP_REQ_SIZE];
                memcpy(bye, zero, sizeof bye);
                bye[0] = HP_OP_CLOSE;
                ssize_t r = send(k->fd, bye, sizeof bye, MSG_DONTWAIT | MSG_NOSIGNAL);
                (void)r;
            }
            conn_drop(k, "the transport was closed");
            pthread_mutex_unlock(&k->lock);
        } else if (k->fd >= 0) {
            shutdown(k->fd, SHUT_RDWR); /* wakes the holder, which then drops it */
        }
    }
}

void hpc_free(hpc_client *c) {
    hpc_close(c);
    hpc_conn *k = c->all;
    while (k) {
        hpc_conn *next = k->next_all;
        if (k->fd >= 0) close(k->fd);
        pthread_mutex_destroy(&k->lock);
        free(k);
        k = next;
    }
    for (int32_t pe = 0; pe < c->n_pes; pe++) {
        hpc_target *t = &c->targets[pe];
        free(t->host);
        free(t->port);
        hpc_sizes *s = t->sizes;
        while (s) {
            hpc_sizes *older = s->older;
            free(s);
            s = older;
        }
    }
    free(c->targets);
    free(c->conns);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
