/* vkshmem-hostproxy server: one pthread per open transport serving RMA and AMO requests from
 * peers over TCP, so a PE's memory is served without that PE calling into Python.
 *
 * Design: a single epoll loop over the listening socket, an eventfd (shutdown) and every peer
 * connection. Sockets are non-blocking; each connection is a small state machine
 * (header -> payload -> header ..., or "reply pending" while the kernel send buffer is full),
 * so no peer, slow or dead, can stall the thread, and shutdown is always immediate. Small
 * requests are read in batches through a per-connection buffer; large PUT payloads are received
 * straight into the segment and GET data is sent straight from it. While a reply is pending the
 * connection's later requests wait, which keeps the per-connection order strict.
 *
 * A connection is served only once it proved that it knows the job's key (challenge-response,
 * see hp_server.h); until then it has HP_AUTH_MS (at most) from accept to do so, however many
 * bytes it sends, and counts against HP_MAX_PENDING. A sweep (every HP_SWEEP_MS) drops
 * connections that outlive those limits or whose begun request stopped making progress. The
 * failures of a connection that never authenticated are only counted (n_refused), never
 * recorded as errors: those describe the job's own peers. Every access to a segment is bounds-checked against the registered
 * size first; a bad request is answered with an error reply, recorded (hp_last_error) and the
 * connection dropped.
 * AMOs go through the core's vk_amo (passed in as a function pointer) so they are the same
 * hardware atomics as every other path. All state lives in struct hp_server: several servers
 * (rails) coexist in one process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <vkshmem/plugin.h>
#include "hp_auth.h"
#include "hp_server.h"
#include "hp_wire.h"

#define HP_RXBUF (64 * 1024)          /* per-connection request buffer */
#define HP_DIRECT_MIN (16 * 1024)     /* payload left >= this: recv straight into the segment */
#define HP_IO_MAX ((size_t)1 << 30)   /* largest single recv/send */
#define HP_READ_BUDGET 32             /* recv calls per connection per wake-up (fairness) */
#define HP_EVENTS 64
#define HP_SWEEP_MS 250

enum { ST_HDR, ST_PAYLOAD, ST_TX };
/* Admission: no HELLO yet; reading the client's nonce; challenge sent; reading its MAC; done. */
enum { AU_NONE, AU_NONCE, AU_WAIT, AU_MAC, AU_OK };

static const char SERVER_LABEL[] = "vkshmem hostproxy server v2";
static const char CLIENT_LABEL[] = "vkshmem hostproxy client v2";

typedef struct hp_seg {
    uintptr_t base;
    uint64_t size;
    int valid; /* published last, with release order */
} hp_seg;

typedef struct hp_conn {
    int fd;
    int state;
    int32_t peer_pe; /* -1 until HELLO */
    int auth;        /* AU_* */
    uint64_t accepted; /* accept time: the deadline to authenticate counts from it */
    uint64_t since;    /* once authenticated: the time of the last progress */
    unsigned char nc[HP_NONCE];            /* the client's nonce */
    unsigned char chal[HP_NONCE + HP_MAC]; /* our nonce and MAC (sent after the HELLO reply) */
    unsigned char mac[HP_MAC];             /* the client's MAC */
    unsigned char *rx;
    size_t rx_pos, rx_len; /* unconsumed bytes are rx[rx_pos, rx_len) */
    unsigned char *pay_dst;
    uint64_t pay_left;
    unsigned char tx_hdr[HP_REP_SIZE];
    size_t tx_hdr_off; /* bytes of tx_hdr already sent */
    const unsigned char *tx_data;
    uint64_t tx_data_left;
    struct hp_conn *prev, *next;
} hp_conn;

struct hp_server {
    int listen_fd, wake_fd, ep_fd;
    int32_t my_pe, n_pes;
    unsigned char key[HP_KEY];
    uint64_t spin_ns;    /* poll this long after the last request before sleeping */
    uint64_t request_ns; /* a begun request must progress within this */
    uint64_t auth_ns;    /* a new connection must authenticate within this */
    uint64_t now;        /* monotonic time of the latest wake-up */
    uint64_t last_sweep;
    uint32_t max_conns, n_pending;
    vk_amo_fn amo;
    pthread_t thread;
    char listen_tag, wake_tag; /* addresses used as epoll tags */
    hp_seg segs[HP_MAX_SEGS];
    hp_conn *conns;
    pthread_mutex_t err_lock;
    char last_error[HP_ERRLEN];
    uint64_t n_accepted, n_open, n_requests, n_errors, n_refused, n_stalled;
};

/* Counters have one writer (the server thread); Python reads them while it runs. */
#define COUNT(field, delta) \
    __atomic_store_n(&(field), (field) + (uint64_t)(delta), __ATOMIC_RELAXED)

static void hp_error(hp_server *s, const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&s->err_lock);
    va_start(ap, fmt);
    vsnprintf(s->last_error, sizeof s->last_error, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&s->err_lock);
    __atomic_add_fetch(&s->n_errors, 1, __ATOMIC_RELAXED);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *errstr(int e, char *buf, size_t n) {
    return strerror_r(e, buf, n); /* GNU variant: returns the message */
}

static int set_events(hp_server *s, hp_conn *c, uint32_t events) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = events;
    ev.data.ptr = c;
    return epoll_ctl(s->ep_fd, EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_close(hp_server *s, hp_conn *c) {
    if (c->auth != AU_OK) s->n_pending--;
    epoll_ctl(s->ep_fd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    free(c->rx);
    free(c);
    COUNT(s->n_open, -1);
}

/* Send what is left of the pending reply. 0: all sent; 1: rest pending (ST_TX); -1: dead. */
static int conn_flush_tx(hp_server *s, hp_conn *c) {
    while (c->tx_hdr_off < HP_REP_SIZE || c->tx_data_left) {
        struct iovec iov[2];
        struct msghdr m;
        int k = 0;
        if (c->tx_hdr_off < HP_REP_SIZE) {
            iov[k].iov_base = c->tx_hdr + c->tx_hdr_off;
            iov[k].iov_len = HP_REP_SIZE - c->tx_hdr_off;
            k++;
        }
        if (c->tx_data_left) {
            iov[k].iov_base = (void *)c->tx_data;
            iov[k].iov_len = c->tx_data_left < HP_IO_MAX ? (size_t)c->tx_data_left : HP_IO_MAX;
            k++;
        }
        memset(&m, 0, sizeof m);
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)k;
        ssize_t r = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (c->state != ST_TX) {
                    c->state = ST_TX;
                    if (set_events(s, c, EPOLLOUT) < 0) return -1;
                }
                return 1;
            }
            if (c->auth == AU_OK) { /* a stranger's failure is counted (server_main) only */
                char eb[96];
                hp_error(s, "PE %d: sending a reply failed: %s", c->peer_pe,
                         errstr(errno, eb, sizeof eb));
            }
            return -1;
        }
        size_t done = (size_t)r;
        c->since = s->now;
        if (c->tx_hdr_off < HP_REP_SIZE) {
            size_t h = HP_REP_SIZE - c->tx_hdr_off;
            if (done < h) {
                c->tx_hdr_off += done;
                continue;
            }
            c->tx_hdr_off = HP_REP_SIZE;
            done -= h;
        }
        c->tx_data += done;
        c->tx_data_left -= done;
    }
    c->tx_data = NULL;
    if (c->state == ST_TX) {
        c->state = ST_HDR;
        if (set_events(s, c, EPOLLIN) < 0) return -1;
    }
    return 0;
}

static int conn_reply(hp_server *s, hp_conn *c, int32_t status, uint32_t op, uint64_t value,
                      const unsigned char *data, uint64_t n) {
    wr32(c->tx_hdr, (uint32_t)status);
    wr32(c->tx_hdr + 4, op);
    wr64(c->tx_hdr + 8, value);
    c->tx_hdr_off = 0;
    c->tx_data = data;
    c->tx_data_left = n;
    return conn_flush_tx(s, c) < 0 ? -1 : 0;
}

/* Reject a request: record why, tell the client (best effort), and drop the connection. */
static int conn_fail(hp_server *s, hp_conn *c, int32_t status, const unsigned char *h,
                     const char *why) {
    if (c->auth == AU_OK)
        hp_error(s, "rejected a request from PE %d: %s (op %u, seg %u, offset %llu, arg %llu)",
                 c->peer_pe, why, (unsigned)h[0], rd32(h + 4), (unsigned long long)rd64(h + 8),
                 (unsigned long long)rd64(h + 16));
    /* else not a peer (yet): counted as refused when dropped (server_main), not recorded, so
     * a flood cannot bury real errors */
    unsigned char rep[HP_REP_SIZE];
    wr32(rep, (uint32_t)status);
    wr32(rep + 4, h[0]);
    wr64(rep + 8, rd64(h + 8));
    ssize_t r;
    do {
        r = send(c->fd, rep, sizeof rep, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (r < 0 && errno == EINTR);
    shutdown(c->fd, SHUT_WR);
    return -1;
}

/* Address of [off, off + n) in segment seg, or NULL (status in *st) when outside it. */
static unsigned char *seg_addr(hp_server *s, uint32_t seg, uint64_t off, uint64_t n,
                               int32_t *st) {
    if (seg >= HP_MAX_SEGS || !__atomic_load_n(&s->segs[seg].valid, __ATOMIC_ACQUIRE)) {
        *st = VK_ST_SEG;
        return NULL;
    }
    uint64_t size = s->segs[seg].size;
    if (off > size || n > size - off) {
        *st = VK_ST_BOUNDS;
        return NULL;
    }
    return (unsigned char *)(s->segs[seg].base + (uintptr_t)off);
}

static const char *seg_why(int32_t st) {
    return st == VK_ST_SEG ? "segment not registered" : "outside the registered segment";
}

void hp_mac(const unsigned char *key, const unsigned char *label, size_t label_len,
            const unsigned char *nc, const unsigned char *ns, uint32_t client_pe,
            uint32_t server_pe, unsigned char *out) {
    unsigned char pes[8];
    wr32(pes, client_pe);
    wr32(pes + 4, server_pe);
    const void *parts[] = {label, nc, ns, pes};
    const size_t lens[] = {label_len, HP_NONCE, HP_NONCE, sizeof pes};
    hp_hmac_sha256(key, HP_KEY, parts, lens, 4, out);
}

/* The client's nonce has arrived: answer the HELLO with our nonce and our proof. */
static int conn_challenge(hp_server *s, hp_conn *c) {
    unsigned char h[HP_REQ_SIZE] = {HP_OP_HELLO};
    if (getrandom(c->chal, HP_NONCE, 0) != HP_NONCE)
        return conn_fail(s, c, VK_ST_AUTH, h, "no random bytes for a challenge");
    hp_mac(s->key, (const unsigned char *)SERVER_LABEL, sizeof SERVER_LABEL - 1, c->nc, c->chal,
           (uint32_t)c->peer_pe, (uint32_t)s->my_pe, c->chal + HP_NONCE);
    c->auth = AU_WAIT;
    return conn_reply(s, c, HP_OK, HP_OP_HELLO, (uint64_t)(uint32_t)s->my_pe, c->chal,
                      sizeof c->chal);
}

/* The client's MAC has arrived: admit the connection, or refuse it (saying nothing more). */
static int conn_admit(hp_server *s, hp_conn *c) {
    unsigned char want[HP_MAC], h[HP_REQ_SIZE] = {HP_OP_AUTH};
    hp_mac(s->key, (const unsigned char *)CLIENT_LABEL, sizeof CLIENT_LABEL - 1, c->nc, c->chal,
           (uint32_t)c->peer_pe, (uint32_t)s->my_pe, want);
    if (!hp_equal_ct(want, c->mac, HP_MAC))
        return conn_fail(s, c, VK_ST_AUTH, h, "authentication failed");
    c->auth = AU_OK;
    s->n_pending--;
    c->since = s->now;
    return conn_reply(s, c, HP_OK, HP_OP_AUTH, 0, NULL, 0);
}

/* Apply one request. 0: go on; -1: drop the connection. */
static int conn_request(hp_server *s, hp_conn *c, const unsigned char *h) {
    unsigned op = h[0], aop = h[1], width = h[2];
    uint32_t seg = rd32(h + 4);
    uint64_t off = rd64(h + 8), arg = rd64(h + 16), cmp = rd64(h + 24);
    unsigned char *p;
    int32_t st = HP_OK;

    if (c->auth != AU_OK && op != HP_OP_HELLO && op != HP_OP_AUTH)
        return conn_fail(s, c, VK_ST_AUTH, h, "request before authentication");
    switch (op) {
    case HP_OP_HELLO:
        if (c->auth != AU_NONE || off != HP_MAGIC || arg != HP_VERSION)
            return conn_fail(s, c, VK_ST_HELLO, h,
                             "bad HELLO (not a vkshmem-hostproxy client of protocol version 2)");
        if (seg >= (uint32_t)s->n_pes)
            return conn_fail(s, c, VK_ST_HELLO, h, "HELLO from a PE outside the job");
        c->peer_pe = (int32_t)seg;
        c->auth = AU_NONCE;
        c->pay_dst = c->nc;
        c->pay_left = HP_NONCE;
        c->state = ST_PAYLOAD;
        return 0;
    case HP_OP_AUTH:
        if (c->auth != AU_WAIT) return conn_fail(s, c, VK_ST_AUTH, h, "AUTH out of turn");
        c->auth = AU_MAC;
        c->pay_dst = c->mac;
        c->pay_left = HP_MAC;
        c->state = ST_PAYLOAD;
        return 0;
    case HP_OP_PUT:
        if (!(p = seg_addr(s, seg, off, arg, &st))) return conn_fail(s, c, st, h, seg_why(st));
        if (arg == 0) {
            COUNT(s->n_requests, 1);
            return 0;
        }
        c->pay_dst = p;
        c->pay_left = arg;
        c->state = ST_PAYLOAD;
        return 0;
    case HP_OP_GET:
        if (!(p = seg_addr(s, seg, off, arg, &st))) return conn_fail(s, c, st, h, seg_why(st));
        COUNT(s->n_requests, 1);
        return conn_reply(s, c, HP_OK, op, 0, p, arg);
    case HP_OP_AMO:
    case HP_OP_AMO_FETCH: {
        if ((width != 4 && width != 8) || aop > VK_XOR)
            return conn_fail(s, c, VK_ST_AMO, h, "unsupported AMO op or width");
        if (!(p = seg_addr(s, seg, off, width, &st))) return conn_fail(s, c, st, h, seg_why(st));
        if ((uintptr_t)p % width) return conn_fail(s, c, VK_ST_ALIGN, h, "misaligned AMO");
        uint64_t old = s->amo((uintptr_t)p, (int)aop, (int)width, arg, cmp);
        COUNT(s->n_requests, 1);
        if (op == HP_OP_AMO) return 0;
        return conn_reply(s, c, HP_OK, op, old, NULL, 0);
    }
    case HP_OP_FLUSH:
        /* Everything earlier on this connection has been applied (in-order service). */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        COUNT(s->n_requests, 1);
        return conn_reply(s, c, HP_OK, op, 0, NULL, 0);
    case HP_OP_CLOSE:
        return -1;
    default:
        return conn_fail(s, c, VK_ST_PROTO, h, "unknown op");
    }
}
