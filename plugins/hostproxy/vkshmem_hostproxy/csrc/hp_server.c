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
 * see hp_server.h); until then it has HP_AUTH_MS (at most) to do so and counts against HP_MAX_PENDING.
 * A sweep (every HP_SWEEP_MS) drops connections that outlive those limits or whose begun request
 * stopped making progress. Every access to a segment is bounds-checked against the registered
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

#include "_native.h"
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
    uint64_t since;  /* accept time until authenticated, then the time of the last progress */
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
            if (c->peer_pe >= 0) {
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
    else /* not a peer (yet): counted, not recorded, so a flood cannot bury real errors */
        COUNT(s->n_refused, 1);
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
        *st = HP_ESEG;
        return NULL;
    }
    uint64_t size = s->segs[seg].size;
    if (off > size || n > size - off) {
        *st = HP_EBOUNDS;
        return NULL;
    }
    return (unsigned char *)(s->segs[seg].base + (uintptr_t)off);
}

static const char *seg_why(int32_t st) {
    return st == HP_ESEG ? "segment not registered" : "outside the registered segment";
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
        return conn_fail(s, c, HP_EAUTH, h, "no random bytes for a challenge");
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
        return conn_fail(s, c, HP_EAUTH, h, "authentication failed");
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
        return conn_fail(s, c, HP_EAUTH, h, "request before authentication");
    switch (op) {
    case HP_OP_HELLO:
        if (c->auth != AU_NONE || off != HP_MAGIC || arg != HP_VERSION)
            return conn_fail(s, c, HP_EHELLO, h,
                             "bad HELLO (not a vkshmem-hostproxy client of protocol version 2)");
        if (seg >= (uint32_t)s->n_pes)
            return conn_fail(s, c, HP_EHELLO, h, "HELLO from a PE outside the job");
        c->peer_pe = (int32_t)seg;
        c->auth = AU_NONCE;
        c->pay_dst = c->nc;
        c->pay_left = HP_NONCE;
        c->state = ST_PAYLOAD;
        return 0;
    case HP_OP_AUTH:
        if (c->auth != AU_WAIT) return conn_fail(s, c, HP_EAUTH, h, "AUTH out of turn");
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
            return conn_fail(s, c, HP_EAMO, h, "unsupported AMO op or width");
        if (!(p = seg_addr(s, seg, off, width, &st))) return conn_fail(s, c, st, h, seg_why(st));
        if ((uintptr_t)p % width) return conn_fail(s, c, HP_EALIGN, h, "misaligned AMO");
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
        return conn_fail(s, c, HP_EPROTO, h, "unknown op");
    }
}

/* recv() result handling shared by the reads below. 1: retry; 0: wait for more; -1: drop. */
static int read_result(hp_server *s, hp_conn *c, ssize_t r) {
    if (r == 0) {
        int mid = c->state == ST_PAYLOAD || c->rx_len > c->rx_pos;
        if (mid)
            hp_error(s, "PE %d closed its connection in the middle of a request", c->peer_pe);
        return -1;
    }
    if (errno == EINTR) return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (c->state == ST_PAYLOAD || c->rx_len > c->rx_pos) {
        char eb[96];
        hp_error(s, "PE %d: connection failed in the middle of a request: %s", c->peer_pe,
                 errstr(errno, eb, sizeof eb));
    }
    return -1;
}

/* Serve what the connection has sent. 0: wait for the next event; -1: drop it. */
static int conn_service(hp_server *s, hp_conn *c) {
    int reads = 0;
    for (;;) {
        if (c->state == ST_TX) return 0;
        size_t avail = c->rx_len - c->rx_pos;
        if (c->state == ST_PAYLOAD) {
            if (avail) {
                size_t k = avail < c->pay_left ? avail : (size_t)c->pay_left;
                memcpy(c->pay_dst, c->rx + c->rx_pos, k);
                c->rx_pos += k;
                c->pay_dst += k;
                c->pay_left -= k;
            }
            if (c->pay_left == 0) {
                c->state = ST_HDR;
                if (c->auth == AU_NONCE) {
                    if (conn_challenge(s, c) < 0) return -1;
                } else if (c->auth == AU_MAC) {
                    if (conn_admit(s, c) < 0) return -1;
                } else {
                    COUNT(s->n_requests, 1);
                }
                continue;
            }
            c->rx_pos = c->rx_len = 0; /* the buffer is empty here */
            if (reads++ >= HP_READ_BUDGET) return 0;
            if (c->pay_left >= HP_DIRECT_MIN) {
                size_t want = c->pay_left < HP_IO_MAX ? (size_t)c->pay_left : HP_IO_MAX;
                ssize_t r = recv(c->fd, c->pay_dst, want, 0);
                if (r > 0) {
                    c->since = s->now;
                    c->pay_dst += r;
                    c->pay_left -= (uint64_t)r;
                    continue;
                }
                int rc = read_result(s, c, r);
                if (rc <= 0) return rc;
                continue;
            }
        } else {
            if (avail >= HP_REQ_SIZE) {
                const unsigned char *h = c->rx + c->rx_pos;
                c->rx_pos += HP_REQ_SIZE;
                if (conn_request(s, c, h) < 0) return -1;
                continue;
            }
            if (reads++ >= HP_READ_BUDGET) return 0;
            if (c->rx_pos) {
                memmove(c->rx, c->rx + c->rx_pos, avail);
                c->rx_pos = 0;
                c->rx_len = avail;
            }
        }
        ssize_t r = recv(c->fd, c->rx + c->rx_len, HP_RXBUF - c->rx_len, 0);
        if (r > 0) {
            c->since = s->now;
            c->rx_len += (size_t)r;
            continue;
        }
        int rc = read_result(s, c, r);
        if (rc <= 0) return rc;
    }
}

/* The connection that has been authenticating longest, or NULL. */
static hp_conn *oldest_pending(hp_server *s) {
    hp_conn *found = NULL;
    for (hp_conn *c = s->conns; c; c = c->next) /* newest first */
        if (c->auth != AU_OK) found = c;
    return found;
}

/* Called outside an event batch (it may close connections). */
static void server_accept(hp_server *s) {
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            char eb[96];
            hp_error(s, "accept failed: %s", errstr(errno, eb, sizeof eb));
            usleep(10000); /* out of fds or memory: do not spin on the listening socket */
            return;
        }
        if (s->n_pending >= HP_MAX_PENDING || s->n_open >= s->max_conns) {
            hp_conn *old = oldest_pending(s);
            COUNT(s->n_refused, 1);
            if (!old) { /* every slot holds an authenticated peer: refuse the newcomer */
                close(fd);
                continue;
            }
            conn_close(s, old);
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        hp_conn *c = calloc(1, sizeof *c);
        unsigned char *rx = malloc(HP_RXBUF);
        struct epoll_event ev;
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN;
        ev.data.ptr = c;
        if (!c || !rx || epoll_ctl(s->ep_fd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            hp_error(s, "cannot accept a connection: out of memory");
            free(c);
            free(rx);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->rx = rx;
        c->peer_pe = -1;
        c->auth = AU_NONE;
        c->since = now_ns();
        c->state = ST_HDR;
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        s->n_pending++;
        COUNT(s->n_accepted, 1);
        COUNT(s->n_open, 1);
    }
}

/* Drop connections that did not authenticate in time, or whose begun request (or pending
 * reply) made no progress within the request timeout. Called outside an event batch. */
static void server_sweep(hp_server *s) {
    hp_conn *next;
    for (hp_conn *c = s->conns; c; c = next) {
        next = c->next;
        uint64_t idle = s->now - c->since;
        if (c->auth != AU_OK) {
            if (idle > s->auth_ns) {
                COUNT(s->n_refused, 1);
                conn_close(s, c);
            }
            continue;
        }
        int busy = c->state != ST_HDR || c->rx_len > c->rx_pos;
        if (busy && idle > s->request_ns) {
            hp_error(s, "PE %d: a request made no progress for %llu ms; connection dropped",
                     c->peer_pe, (unsigned long long)(s->request_ns / 1000000u));
            COUNT(s->n_stalled, 1);
            conn_close(s, c);
        }
    }
}

static void *server_main(void *arg) {
    hp_server *s = arg;
    struct epoll_event ev[HP_EVENTS];
    uint64_t busy_at = 0; /* when the last request was served (spin mode) */
    for (;;) {
        int timeout = s->conns ? HP_SWEEP_MS : -1;
        if (s->spin_ns && now_ns() - busy_at < s->spin_ns) timeout = 0;
        int n = epoll_wait(s->ep_fd, ev, HP_EVENTS, timeout);
        s->now = now_ns();
        if (s->now - s->last_sweep >= (uint64_t)HP_SWEEP_MS * 1000000u) {
            s->last_sweep = s->now;
            server_sweep(s);
            if (n > 0) continue; /* the batch may name a closed connection: poll again */
        }
        if (n == 0) continue;
        if (s->spin_ns) busy_at = s->now;
        if (n < 0) {
            if (errno == EINTR) continue;
            char eb[96];
            hp_error(s, "epoll_wait failed, server stopped: %s", errstr(errno, eb, sizeof eb));
            return NULL;
        }
        int accept_now = 0;
        for (int i = 0; i < n; i++) {
            void *tag = ev[i].data.ptr;
            if (tag == &s->wake_tag) return NULL;
            if (tag == &s->listen_tag) {
                accept_now = 1; /* after the batch: accepting may close connections */
                continue;
            }
            hp_conn *c = tag;
            int rc = 0;
            if (c->state == ST_TX) rc = conn_flush_tx(s, c);
            if (rc == 0) rc = conn_service(s, c);
            if (rc < 0) conn_close(s, c);
        }
        if (accept_now) server_accept(s);
    }
}

static int add_tag(int ep, int fd, void *tag) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.ptr = tag;
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

hp_server *hp_create(int listen_fd, int32_t my_pe, int32_t n_pes, const unsigned char *key,
                     uintptr_t amo_fn, uint32_t spin_us, uint32_t request_ms, uint32_t max_conns,
                     char *err, size_t errlen) {
    char eb[96];
    if (!amo_fn || !key || n_pes < 1 || my_pe < 0 || my_pe >= n_pes || !max_conns) {
        snprintf(err, errlen, "bad arguments (amo function, key, PE %d of %d, %u connections)",
                 my_pe, n_pes, max_conns);
        return NULL;
    }
    hp_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->listen_fd = listen_fd;
    s->my_pe = my_pe;
    s->n_pes = n_pes;
    memcpy(s->key, key, HP_KEY);
    s->request_ns = (uint64_t)request_ms * 1000000u;
    s->auth_ns = (uint64_t)(request_ms < HP_AUTH_MS ? request_ms : HP_AUTH_MS) * 1000000u;
    s->max_conns = max_conns;
    s->now = s->last_sweep = now_ns();
    s->spin_ns = (uint64_t)spin_us * 1000u;
    s->amo = (vk_amo_fn)amo_fn;
    s->wake_fd = s->ep_fd = -1;
    pthread_mutex_init(&s->err_lock, NULL);
    int fl = fcntl(listen_fd, F_GETFL);
    if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0) goto fail;
    if ((s->ep_fd = epoll_create1(EPOLL_CLOEXEC)) < 0) goto fail;
    if ((s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) goto fail;
    if (add_tag(s->ep_fd, listen_fd, &s->listen_tag) < 0) goto fail;
    if (add_tag(s->ep_fd, s->wake_fd, &s->wake_tag) < 0) goto fail;
    /* The thread blocks every signal: they belong to the Python main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        goto fail;
    }
    return s;
fail:
    snprintf(err, errlen, "cannot start the server: %s", errstr(errno, eb, sizeof eb));
    if (s->wake_fd >= 0) close(s->wake_fd);
    if (s->ep_fd >= 0) close(s->ep_fd);
    pthread_mutex_destroy(&s->err_lock);
    free(s);
    return NULL;
}

int hp_register(hp_server *s, uint32_t seg, uintptr_t base, uint64_t size) {
    if (seg >= HP_MAX_SEGS) return -1;
    hp_seg *g = &s->segs[seg];
    if (__atomic_load_n(&g->valid, __ATOMIC_ACQUIRE))
        return g->base == base && g->size == size ? 0 : -2;
    g->base = base;
    g->size = size;
    __atomic_store_n(&g->valid, 1, __ATOMIC_RELEASE);
    return 0;
}

void hp_stats(hp_server *s, uint64_t *out) {
    out[0] = __atomic_load_n(&s->n_accepted, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&s->n_open, __ATOMIC_RELAXED);
    out[2] = __atomic_load_n(&s->n_requests, __ATOMIC_RELAXED);
    out[3] = __atomic_load_n(&s->n_errors, __ATOMIC_RELAXED);
    out[4] = __atomic_load_n(&s->n_refused, __ATOMIC_RELAXED);
    out[5] = __atomic_load_n(&s->n_stalled, __ATOMIC_RELAXED);
}

uint64_t hp_last_error(hp_server *s, char *buf, size_t buflen) {
    pthread_mutex_lock(&s->err_lock);
    if (buflen) snprintf(buf, buflen, "%s", s->last_error);
    pthread_mutex_unlock(&s->err_lock);
    return __atomic_load_n(&s->n_errors, __ATOMIC_RELAXED);
}

void hp_destroy(hp_server *s) {
    uint64_t one = 1;
    ssize_t r;
    do {
        r = write(s->wake_fd, &one, sizeof one);
    } while (r < 0 && errno == EINTR);
    pthread_join(s->thread, NULL);
    while (s->conns) conn_close(s, s->conns);
    close(s->listen_fd);
    close(s->wake_fd);
    close(s->ep_fd);
    pthread_mutex_destroy(&s->err_lock);
    free(s);
}
