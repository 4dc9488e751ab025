/* vkshmem-hostproxy server, continued: reading and serving connections, the epoll loop, and
 * the server's lifetime (one translation unit with hp_server.c: _server_build.py
 * concatenates them). */

/* recv() result handling shared by the reads below. 1: retry; 0: wait for more; -1: drop. */
static int read_result(hp_server *s, hp_conn *c, ssize_t r) {
    /* A stranger's failures (not authenticated) are counted when it is dropped, not recorded. */
    int mid = c->auth == AU_OK && (c->state == ST_PAYLOAD || c->rx_len > c->rx_pos);
    if (r == 0) {
        if (mid)
            hp_error(s, "PE %d closed its connection in the middle of a request", c->peer_pe);
        return -1;
    }
    if (errno == EINTR) return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (mid) {
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
        c->accepted = c->since = now_ns();
        c->state = ST_HDR;
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        s->n_pending++;
        COUNT(s->n_accepted, 1);
        COUNT(s->n_open, 1);
    }
}

/* Drop connections that did not authenticate within auth_ns of being accepted (a hard
 * deadline: bytes trickling in do not extend it), or whose begun request (or pending reply)
 * made no progress within the request timeout. Called outside an event batch. */
static void server_sweep(hp_server *s) {
    hp_conn *next;
    for (hp_conn *c = s->conns; c; c = next) {
        next = c->next;
        if (c->auth != AU_OK) {
            if (s->now > c->accepted && s->now - c->accepted > s->auth_ns) {
                COUNT(s->n_refused, 1);
                conn_close(s, c);
            }
            continue;
        }
        uint64_t idle = s->now > c->since ? s->now - c->since : 0;
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
            if (rc < 0) {
                if (c->auth != AU_OK) COUNT(s->n_refused, 1); /* a stranger, failed or gone */
                conn_close(s, c);
            }
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
    if (seg >= HP_MAX_SEGS) return VK_ST_SEG;
    hp_seg *g = &s->segs[seg];
    if (__atomic_load_n(&g->valid, __ATOMIC_ACQUIRE))
        return g->base == base && g->size == size ? 0 : VK_ST_BUSY;
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
