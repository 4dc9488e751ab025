/* vkshmem-hostproxy client: see hp_client.h (the API) and hp_server.h (the wire protocol).
 *
 * Connections are blocking sockets whose SO_RCVTIMEO/SO_SNDTIMEO are the timeout, so a wait is
 * one system call that ends on data, on the timeout (no progress) or on a signal. Each
 * connection has a mutex held for a whole request (and for quiet, every dirty connection's, in
 * PE order). A connection is never freed before hpc_free: a retired or broken one stays on the
 * endpoint's list, so a thread that raced to it only finds it unusable. Built into the same
 * cffi module as hp_server.c (the extern "Python" callback below is defined by cffi).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "_native.h"
#include "hp_auth.h"
#include "hp_client.h"
#include "hp_server.h"
#include "hp_wire.h"

/* Runs Python's signal handlers (cffi takes the GIL): 0 to go on waiting, nonzero when one
 * raised (the exception is kept on the Python side). */
static int _hpc_signalled(void);

static const char HPC_SERVER_LABEL[] = "vkshmem hostproxy server v2";
static const char HPC_CLIENT_LABEL[] = "vkshmem hostproxy client v2";

typedef struct hpc_sizes {
    uint32_t cap;
    struct hpc_sizes *older; /* replaced arrays, freed with the endpoint */
    uint64_t size[];         /* UINT64_MAX: not registered */
} hpc_sizes;

typedef struct hpc_target {
    char *host, *port;
    hpc_sizes *sizes; /* published with release order; read without the lock */
} hpc_target;

typedef struct hpc_conn {
    pthread_mutex_t lock;
    int fd; /* -1 once dropped */
    int32_t pe;
    int dirty; /* puts/AMOs sent since the last reply */
    char where[288];
    char broken[HPC_MSGLEN]; /* why it is unusable ("" while usable) */
    struct hpc_conn *next_all;
} hpc_conn;

struct hpc_client {
    pthread_mutex_t lock; /* targets, opening, the lists below */
    int32_t my_pe, n_pes;
    int rail, closed;
    unsigned char key[HP_KEY];
    double timeout_s;
    struct timeval tv;
    vk_amo_fn amo;
    uintptr_t local_base[HP_MAX_SEGS]; /* this PE's segments (0: none) */
    uint64_t local_size[HP_MAX_SEGS];
    hpc_target *targets;
    hpc_conn **conns; /* the current connection to each PE (NULL: none yet) */
    hpc_conn *all;    /* every connection ever opened, newest first */
    uint64_t n_native, n_python, n_opened;
};

static __thread char last_msg[HPC_MSGLEN];
static __thread int last_status;

static int fail(int rc, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    last_status = status;
    return rc;
}

int hpc_last_error(char *buf, size_t buflen) {
    if (buflen) snprintf(buf, buflen, "%s", last_msg);
    return last_status;
}

/* -- connections ---------------------------------------------------------------------------- */

static void conn_drop(hpc_conn *k, const char *why) {
    if (!k->broken[0]) snprintf(k->broken, sizeof k->broken, "%s", why);
    if (k->fd >= 0) {
        shutdown(k->fd, SHUT_RDWR);
        close(k->fd);
        k->fd = -1;
    }
}

/* Take k out of service (k locked): the next request to its PE opens a fresh connection. A
 * connection still being set up (under the endpoint's lock) is not in service yet. */
static void conn_retire(hpc_client *c, hpc_conn *k, const char *why) {
    conn_drop(k, why);
    if (__atomic_load_n(&c->conns[k->pe], __ATOMIC_ACQUIRE) != k) return;
    pthread_mutex_lock(&c->lock);
    if (c->conns[k->pe] == k) __atomic_store_n(&c->conns[k->pe], NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&c->lock);
}

static int interrupted(hpc_client *c, hpc_conn *k) {
    conn_retire(c, k, "a request on it was interrupted");
    return fail(HPC_EINTR, EINTR, "interrupted");
}

static const char *describe(hpc_client *c, int err, char *buf, size_t n) {
    if (err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT) {
        snprintf(buf, n, "no progress for %g s (the peer may be dead or stuck; the rail option "
                 "timeout= sets this limit)", c->timeout_s);
    } else if (err == 0 || err == ECONNRESET || err == EPIPE || err == ECONNABORTED ||
               err == ECONNREFUSED || err == ESHUTDOWN) {
        snprintf(buf, n, "the peer closed the connection (did it exit or fail?)");
    } else {
        char eb[128];
        snprintf(buf, n, "[Errno %d] %s", err, strerror_r(err, eb, sizeof eb));
    }
    return buf;
}

static const char *op_name(unsigned op) {
    static const char *names[] = {"?", "HELLO", "PUT", "GET", "AMO", "AMO_FETCH", "FLUSH",
                                  "CLOSE", "AUTH"};
    return op < sizeof names / sizeof *names ? names[op] : NULL;
}

static const char *status_text(int32_t st) {
    switch (st) {
    case HP_EPROTO: return "protocol error";
    case HP_ESEG: return "segment not registered";
    case HP_EBOUNDS: return "outside the registered segment";
    case HP_EALIGN: return "misaligned AMO";
    case HP_EAMO: return "unsupported AMO op or width";
    case HP_EHELLO: return "bad HELLO (protocol version mismatch?)";
    case HP_EAUTH: return "authentication failed: this PE and that one were given different "
                          "job secrets, or that server belongs to another job";
    }
    return NULL;
}

static void rejection(const unsigned char *rep, char *buf, size_t n) {
    int32_t st = (int32_t)rd32(rep);
    unsigned op = rd32(rep + 4);
    const char *text = status_text(st), *name = op_name(op);
    char sb[32], ob[16];
    if (!text) snprintf(sb, sizeof sb, "status %d", st);
    if (!name) snprintf(ob, sizeof ob, "%u", op);
    snprintf(buf, n, "it rejected a request (%s; op %s, offset %llu) and dropped the connection",
             text ? text : sb, name ? name : ob, (unsigned long long)rd64(rep + 8));
}

/* k failed while `doing` (err: errno, 0 for end of stream): drop it, record why. After a failed
 * send, the server may have left an error reply saying why. */
static int broken(hpc_client *c, hpc_conn *k, const char *doing, int err, int sending) {
    char detail[HPC_MSGLEN / 2];
    detail[0] = 0;
    if (sending && k->fd >= 0) {
        unsigned char rep[HP_REP_SIZE];
        ssize_t r = recv(k->fd, rep, sizeof rep, MSG_DONTWAIT | MSG_PEEK);
        if (r == HP_REP_SIZE && (int32_t)rd32(rep) < 0) rejection(rep, detail, sizeof detail);
    }
    if (!detail[0]) describe(c, err, detail, sizeof detail);
    fail(HPC_EBROKEN, err, "%s failed while %s: %s", k->where, doing, detail);
    conn_drop(k, last_msg);
    return HPC_EBROKEN;
}

static int unusable(hpc_conn *k) {
    return fail(HPC_EBROKEN, 0, "connection to %s is unusable: %s", k->where, k->broken);
}

/* Step the vector iov[0..n) past `done` bytes; the number of entries left. */
static int advance(struct iovec **iov, int n, size_t done) {
    struct iovec *v = *iov;
    while (n > 0 && done >= v->iov_len) {
        done -= v->iov_len;
        v++;
        n--;
    }
    if (n > 0) {
        v->iov_base = (char *)v->iov_base + done;
        v->iov_len -= done;
    }
    *iov = v;
    return n;
}

/* Send (sending) or receive exactly the bytes of iov[0..n) (modified); *got: bytes moved. */
static int transfer(hpc_client *c, hpc_conn *k, struct iovec *iov, int n, int sending,
                    const char *doing, size_t *got) {
    *got = 0;
    while (n > 0) {
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)n;
        ssize_t r = sending ? sendmsg(k->fd, &m, MSG_NOSIGNAL) : recvmsg(k->fd, &m, MSG_WAITALL);
        if (r < 0 && errno == EINTR) {
            if (_hpc_signalled()) return interrupted(c, k);
            continue;
        }
        if (r < 0 || (r == 0 && !sending)) return broken(c, k, doing, r < 0 ? errno : 0, sending);
        *got += (size_t)r;
        n = advance(&iov, n, (size_t)r);
    }
    return 0;
}

static int send_all(hpc_client *c, hpc_conn *k, struct iovec *iov, int n, const char *doing) {
    size_t sent;
    return transfer(c, k, iov, n, 1, doing, &sent);
}

static int recv_all(hpc_client *c, hpc_conn *k, struct iovec *iov, int n, const char *doing,
                    size_t *got) {
    return transfer(c, k, iov, n, 0, doing, got);
}

static int send_bytes(hpc_client *c, hpc_conn *k, const void *p, size_t n, const char *doing) {
    struct iovec iov = {(void *)p, n};
    return send_all(c, k, &iov, 1, doing);
}

/* A reply header in rep: its value, or the server's rejection (the connection dropped). */
static int check_reply(hpc_conn *k, const unsigned char *rep, uint64_t *value) {
    int32_t st = (int32_t)rd32(rep);
    if (st) {
        char why[HPC_MSGLEN / 2];
        rejection(rep, why, sizeof why);
        fail(HPC_EREJECTED, st, "%s: %s", k->where, why);
        snprintf(k->broken, sizeof k->broken, "%s", last_msg); /* the reason, over "closed" */
        conn_drop(k, last_msg);
        return HPC_EREJECTED;
    }
    if (value) *value = rd64(rep + 8);
    return 0;
}

static int read_reply(hpc_client *c, hpc_conn *k, const char *doing, uint64_t *value) {
    unsigned char rep[HP_REP_SIZE];
    struct iovec iov = {rep, sizeof rep};
    size_t got;
    int rc = recv_all(c, k, &iov, 1, doing, &got);
    return rc ? rc : check_reply(k, rep, value);
}

/* The handshake: HELLO with our nonce; check the server's proof; prove ours. */
static int authenticate(hpc_client *c, hpc_conn *k) {
    unsigned char hello[HP_REQ_SIZE + HP_NONCE], chal[HP_NONCE + HP_MAC], mac[HP_MAC];
    unsigned char auth[HP_REQ_SIZE + HP_MAC];
    unsigned char *nc = hello + HP_REQ_SIZE;
    uint64_t value;
    int rc;
    if (getrandom(nc, HP_NONCE, 0) != HP_NONCE)
        return fail(HPC_ECONNECT, errno, "no random bytes for a nonce");
    hp_header(hello, HP_OP_HELLO, 0, 0, (uint32_t)c->my_pe, HP_MAGIC, HP_VERSION, 0);
    if ((rc = send_bytes(c, k, hello, sizeof hello, "saying hello")) ||
        (rc = read_reply(c, k, "saying hello", &value)))
        return rc;
    if (value != (uint64_t)(uint32_t)k->pe)
        return fail(HPC_EAUTH, 0, "%s answered as PE %llu: addresses were mixed up", k->where,
                    (unsigned long long)value);
    struct iovec iov = {chal, sizeof chal};
    size_t got;
    if ((rc = recv_all(c, k, &iov, 1, "saying hello", &got))) return rc;
    hp_mac(c->key, (const unsigned char *)HPC_SERVER_LABEL, sizeof HPC_SERVER_LABEL - 1, nc,
           chal, (uint32_t)c->my_pe, (uint32_t)k->pe, mac);
    if (!hp_equal_ct(mac, chal + HP_NONCE, HP_MAC))
        return fail(HPC_EAUTH, 0, "%s could not prove that it knows this job's secret "
                    "(another job's server at that address, or the PEs were given different "
                    "secrets)", k->where);
    hp_header(auth, HP_OP_AUTH, 0, 0, 0, 0, 0, 0);
    hp_mac(c->key, (const unsigned char *)HPC_CLIENT_LABEL, sizeof HPC_CLIENT_LABEL - 1, nc,
           chal, (uint32_t)c->my_pe, (uint32_t)k->pe, auth + HP_REQ_SIZE);
    if ((rc = send_bytes(c, k, auth, sizeof auth, "authenticating"))) return rc;
    return read_reply(c, k, "authenticating", NULL);
}

/* A connected socket to host:port within the timeout, or -1 (message set; *rc the status). */
static int dial(hpc_client *c, const char *host, const char *port, const char *where, int *rc) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, port, &hints, &res), err = 0;
    if (gai) {
        *rc = fail(HPC_ECONNECT, 0, "cannot connect to %s: %s", where, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 && errno != EINPROGRESS) {
            err = errno;
        } else {
            struct pollfd p = {fd, POLLOUT, 0};
            int ms = (int)(c->timeout_s * 1000) + 1, n;
            while ((n = poll(&p, 1, ms)) < 0 && errno == EINTR) {
                if (_hpc_signalled()) {
                    close(fd);
                    freeaddrinfo(res);
                    *rc = fail(HPC_EINTR, EINTR, "interrupted");
                    return -1;
                }
            }
            socklen_t len = sizeof err;
            if (n == 0) err = ETIMEDOUT;
            else if (n < 0) err = errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
            if (!err) break;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        char eb[128];
        *rc = fail(HPC_ECONNECT, err, "cannot connect to %s: [Errno %d] %s", where, err,
                   strerror_r(err, eb, sizeof eb));
        return -1;
    }
    int one = 1, fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &c->tv, sizeof c->tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &c->tv, sizeof c->tv);
    return fd;
}

/* The connection to pe, opened (once, under the endpoint's lock) and authenticated. */
static hpc_conn *conn_get(hpc_client *c, int32_t pe, int *rc) {
    if (pe < 0 || pe >= c->n_pes) {
        *rc = fail(HPC_EUNREACH, 0, "PE %d is not reachable through hostproxy on rail %d (it "
                   "published no address)", pe, c->rail);
        return NULL;
    }
    hpc_conn *k = __atomic_load_n(&c->conns[pe], __ATOMIC_ACQUIRE);
    if (k) return k;
    pthread_mutex_lock(&c->lock);
    k = c->conns[pe];
    if (k) goto out;
    hpc_target *t = &c->targets[pe];
    if (c->closed) {
        *rc = fail(HPC_ECLOSED, 0, "the transport is closed");
        goto out;
    }
    if (!t->host) {
        *rc = fail(HPC_EUNREACH, 0, "PE %d is not reachable through hostproxy on rail %d (it "
                   "published no address)", pe, c->rail);
        goto out;
    }
    k = calloc(1, sizeof *k);
    if (!k) {
        *rc = fail(HPC_ENOMEM, ENOMEM, "out of memory");
        goto out;
    }
    pthread_mutex_init(&k->lock, NULL);
    k->pe = pe;
    snprintf(k->where, sizeof k->where, "PE %d at %s:%s", pe, t->host, t->port);
    k->fd = dial(c, t->host, t->port, k->where, rc);
    k->next_all = c->all;
    c->all = k;
    if (k->fd < 0) {
        conn_drop(k, "connection set-up failed");
        k = NULL;
        goto out;
    }
    c->n_opened++;
    if ((*rc = authenticate(c, k)) != 0) {
        conn_drop(k, "connection set-up failed");
        k = NULL;
        goto out;
    }
    __atomic_store_n(&c->conns[pe], k, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&c->lock);
    return k;
}

/* -- requests ------------------------------------------------------------------------------- */

static int range_error(hpc_conn *k, uint32_t seg, int64_t off, uint64_t n, uint64_t size) {
    if (size == UINT64_MAX)
        return fail(HPC_ERANGE, 0, "hostproxy: %s has no segment %u registered", k->where, seg);
    return fail(HPC_ERANGE, 0, "hostproxy: %llu bytes at offset %lld are outside segment %u of "
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
        *rc = fail(HPC_ECLOSED, 0, "the transport is closed");
        return NULL;
    }
    uintptr_t base = seg < HP_MAX_SEGS ? __atomic_load_n(&c->local_base[seg], __ATOMIC_ACQUIRE)
                                       : 0;
    uint64_t size = base ? c->local_size[seg] : UINT64_MAX;
    if (!base || off < 0 || (uint64_t)off > size || n > size - (uint64_t)off) {
        if (size == UINT64_MAX)
            *rc = fail(HPC_ERANGE, 0, "hostproxy: this PE (%d) has no segment %u registered",
                       c->my_pe, seg);
        else
            *rc = fail(HPC_ERANGE, 0, "hostproxy: %llu bytes at offset %lld are outside "
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
        if (rc == HPC_EBROKEN && got >= HP_REP_SIZE && (int32_t)rd32(rep) < 0)
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
        return fail(HPC_EARG, 0, "hostproxy: AMO width %d (4 or 8 bytes only)", width);
    if (pe == c->my_pe) {
        if (!(p = local(c, seg, off, (uint64_t)width, &rc))) return rc;
    } else {
        if (!(k = conn_get(c, pe, &rc))) return rc;
        if ((rc = in_range(c, k, seg, off, (uint64_t)width)) != 0) return rc;
    }
    if (off % width)
        return fail(HPC_EARG, 0, "hostproxy: AMO at offset %lld is not aligned to its width %d",
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
    for (int i = 0; i < n && rc != HPC_EINTR; i++) {
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
        if (r == HPC_EINTR) rc = r;
    }
    for (int i = 0; i < n; i++) {
        hpc_conn *k = pending[i];
        if (!sent[i]) continue;
        if (rc == HPC_EINTR) { /* its flush reply will never be read */
            if (!k->broken[0]) conn_retire(c, k, "a request on it was interrupted");
            continue;
        }
        int r = read_reply(c, k, "waiting for a flush", NULL);
        if (!r) k->dirty = 0;
        if (r == HPC_EINTR) rc = r;
        else if (r && !rc) {
            rc = r;
            first_status = last_status;
            memcpy(first, last_msg, sizeof first);
        }
    }
    for (int i = 0; i < n; i++) pthread_mutex_unlock(&pending[i]->lock);
    if (rc && rc != HPC_EINTR) fail(rc, first_status, "%s", first);
    else if (rc == HPC_EINTR) fail(rc, EINTR, "interrupted");
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
    if (pe < 0 || pe >= c->n_pes) return HPC_EUNREACH;
    char *h = strdup(host), *p = strdup(port);
    if (!h || !p) {
        free(h);
        free(p);
        return HPC_ENOMEM;
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
    if (seg >= HP_MAX_SEGS || !base) return HPC_ERANGE;
    c->local_size[seg] = size;
    __atomic_store_n(&c->local_base[seg], base, __ATOMIC_RELEASE);
    return 0;
}

int hpc_set_size(hpc_client *c, int32_t pe, uint32_t seg, uint64_t size) {
    if (pe < 0 || pe >= c->n_pes || seg >= HP_MAX_SEGS) return HPC_ERANGE;
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    hpc_target *t = &c->targets[pe];
    hpc_sizes *s = t->sizes;
    if (!s || seg >= s->cap) { /* grow: readers may still hold the old array (kept) */
        uint32_t cap = seg < 16 ? 16 : HP_MAX_SEGS;
        hpc_sizes *g = malloc(sizeof *g + sizeof(uint64_t) * cap);
        if (!g) {
            rc = HPC_ENOMEM;
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
