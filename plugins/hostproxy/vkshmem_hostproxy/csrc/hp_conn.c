/* vkshmem-hostproxy client, connections: opening one (within the timeout), the handshake that
 * admits it (hp_server.h), moving bytes with every wait bounded and interruptible, and turning
 * failures into the messages the Python client always gave. See hp_conn.h and hp_client.h.
 *
 * Connections are blocking sockets whose SO_RCVTIMEO/SO_SNDTIMEO are the timeout, so a wait is
 * one system call that ends on data, on the timeout (no progress) or on a signal. A connection
 * is never freed before hpc_free: a retired or broken one stays on the endpoint's list, so a
 * thread that raced to it only finds it unusable.
 */
#include "hp_conn.h"

static const char HPC_SERVER_LABEL[] = "vkshmem hostproxy server v2";
static const char HPC_CLIENT_LABEL[] = "vkshmem hostproxy client v2";

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
    return fail(VK_ST_INTR, EINTR, "interrupted");
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
    case VK_ST_PROTO: return "protocol error";
    case VK_ST_SEG: return "segment not registered";
    case VK_ST_BOUNDS: return "outside the registered segment";
    case VK_ST_ALIGN: return "misaligned AMO";
    case VK_ST_AMO: return "unsupported AMO op or width";
    case VK_ST_HELLO: return "bad HELLO (protocol version mismatch?)";
    case VK_ST_AUTH: return "authentication failed: this PE and that one were given different "
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
    fail(VK_ST_BROKEN, err, "%s failed while %s: %s", k->where, doing, detail);
    conn_drop(k, last_msg);
    return VK_ST_BROKEN;
}

static int unusable(hpc_conn *k) {
    return fail(VK_ST_BROKEN, 0, "connection to %s is unusable: %s", k->where, k->broken);
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
        fail(VK_ST_REJECTED, st, "%s: %s", k->where, why);
        snprintf(k->broken, sizeof k->broken, "%s", last_msg); /* the reason, over "closed" */
        conn_drop(k, last_msg);
        return VK_ST_REJECTED;
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
        return fail(VK_ST_CONNECT, errno, "no random bytes for a nonce");
    hp_header(hello, HP_OP_HELLO, 0, 0, (uint32_t)c->my_pe, HP_MAGIC, HP_VERSION, 0);
    if ((rc = send_bytes(c, k, hello, sizeof hello, "saying hello")) ||
        (rc = read_reply(c, k, "saying hello", &value)))
        return rc;
    if (value != (uint64_t)(uint32_t)k->pe)
        return fail(VK_ST_AUTH, 0, "%s answered as PE %llu: addresses were mixed up", k->where,
                    (unsigned long long)value);
    struct iovec iov = {chal, sizeof chal};
    size_t got;
    if ((rc = recv_all(c, k, &iov, 1, "saying hello", &got))) return rc;
    hp_mac(c->key, (const unsigned char *)HPC_SERVER_LABEL, sizeof HPC_SERVER_LABEL - 1, nc,
           chal, (uint32_t)c->my_pe, (uint32_t)k->pe, mac);
    if (!hp_equal_ct(mac, chal + HP_NONCE, HP_MAC))
        return fail(VK_ST_AUTH, 0, "%s could not prove that it knows this job's secret "
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
        *rc = fail(VK_ST_CONNECT, 0, "cannot connect to %s: %s", where, gai_strerror(gai));
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
                    *rc = fail(VK_ST_INTR, EINTR, "interrupted");
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
        *rc = fail(VK_ST_CONNECT, err, "cannot connect to %s: [Errno %d] %s", where, err,
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
        *rc = fail(VK_ST_PEER, 0, "PE %d is not reachable through hostproxy on rail %d (it "
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
        *rc = fail(VK_ST_CLOSED, 0, "the transport is closed");
        goto out;
    }
    if (!t->host) {
        *rc = fail(VK_ST_PEER, 0, "PE %d is not reachable through hostproxy on rail %d (it "
                   "published no address)", pe, c->rail);
        goto out;
    }
    k = calloc(1, sizeof *k);
    if (!k) {
        *rc = fail(VK_ST_NOMEM, ENOMEM, "out of memory");
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

