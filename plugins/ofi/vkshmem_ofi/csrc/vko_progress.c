/* vkshmem-ofi: the progress thread (one per vko_ctx; no GIL, signals blocked). Included by
 * vko.c.
 *
 * It reads the root CQ (and the contexts' own CQs) in one of three ways:
 *
 * - fd (tcp;ofi_rxm): the CQ has a wait fd (FI_GETWAIT). The thread sleeps in poll() on it
 *   (after fi_trywait said nothing is pending) until a socket of the domain has data. When
 *   that wakes it while this PE has issued nothing for VKO_SELF_NS (so the data is a
 *   peer's request, not a reply to this PE's caller, who reads the CQ itself while it waits),
 *   it reads the CQ without sleeping for busy_us (the busy window: spinning, or yielding the
 *   CPU between reads where the node has more PEs than CPUs), so a peer's next request is
 *   served within a read, as by a target spinning on its CQ; data seen on the fd during the
 *   window (a poll() with timeout 0 after each read) extends it, and this PE issuing
 *   something closes it. While this PE's caller waits on the root CQ itself in a loop (quiet,
 *   blocking put/get/AMO, one after the other: it reads the CQ without sleeping, which
 *   progresses peers' requests as well), the thread parks on a futex instead (park() below;
 *   vko.c's drive_enter/leave).
 * - sread: a wait object without an fd: fi_cq_sread (the provider's own wait), no window.
 * - polling (shm: no wait object, manual progress): fi_cq_read every poll_us, every
 *   idle_poll_us once this PE was idle for a second, and without sleeping for busy_us after
 *   the remote-access counter (FI_RMA_EVENT) showed that a peer's operation was served here.
 *
 * Every sleep is bounded (VKO_IDLE_MS at most, 1 ms while contexts' CQs need reading) and the
 * stop flag is read each round, so vko_close never waits long; nothing spins once the peers
 * stop sending (a window ends busy_us after the last activity seen).
 */

/* One round over the contexts' own CQs (the caller holds cqlock for reading). */
static int drain_contexts(vko_ctx *c) {
    int n = 0;
    pthread_mutex_lock(&c->lock);
    for (vko_ep *e = c->eps; e; e = e->next)
        if (e->cq != c->cq)
            n += drain(c, e->cq);
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* The remote-access counter's value (peers' operations served here), or the last one seen. */
static uint64_t remote_count(vko_ctx *c, uint64_t last) {
    if (!c->rcntr)
        return last;
    uint64_t v = fi_cntr_read(c->rcntr);
    return v + fi_cntr_readerr(c->rcntr);
}

/* Between two polls of a busy window: yield the CPU where the node has more PEs than CPUs,
 * else spin. */
static void busy_pause(vko_ctx *c) {
    if (__atomic_load_n(&c->busy_yield, __ATOMIC_RELAXED))
        sched_yield();
#if defined(__x86_64__) || defined(__i386__)
    else
        __builtin_ia32_pause();
#endif
}

/* Open (counted in n_busy) or extend the busy window to t + busy_us. */
static void busy_extend(vko_ctx *c, uint64_t t, uint64_t *busy_until) {
    if (t >= *busy_until)
        __atomic_add_fetch(&c->n_busy, 1, __ATOMIC_RELAXED);
    *busy_until = t + (uint64_t)c->busy_us * 1000;
}

/* The CQ's wait fd, where the provider gives one (else -1: the thread uses fi_cq_sread). */
static int cq_wait_fd(vko_ctx *c) {
    int fd = -1;
    if (!c->waitable || fi_control(&c->cq->fid, FI_GETWAIT, &fd) || fd < 0)
        return -1;
    return fd;
}

/* One round of the fd regime; last_issue: when this PE's caller last issued something (within
 * VKO_SELF_NS the fd's data is likely its own replies, and the caller makes progress itself
 * while it waits: no window). Returns completions. */
#define VKO_SELF_NS 1000000ull /* this PE counts as issuing for 1 ms after it issued */

static int fd_round(vko_ctx *c, uint64_t *busy_until, uint64_t last_issue) {
    struct fid *cqfid = &c->cq->fid;
    struct pollfd p = {.fd = c->wait_fd, .events = POLLIN};
    pthread_rwlock_rdlock(&c->cqlock);
    int got = drain(c, c->cq) + drain_contexts(c);
    uint64_t t = now_ns();
    int self = t - last_issue < VKO_SELF_NS; /* its caller reads the CQ itself meanwhile */
    int window = t < *busy_until && !self;
    /* fi_trywait also resets the wait set's signal fds (else a completion signalled once
     * would keep the fd readable: the window would never end) */
    int quiet = !got && fi_trywait(c->fabric, &cqfid, 1) == FI_SUCCESS;
    pthread_rwlock_unlock(&c->cqlock);
    if (window) {
        if (!quiet || poll(&p, 1, 0) > 0) /* data pending or arrived: more may follow */
            busy_extend(c, t, busy_until);
        busy_pause(c);
    } else if (quiet) {
        int n = poll(&p, 1, c->eps_n > 1 ? 1 : VKO_IDLE_MS);
        if (n > 0 && c->busy_us && !self &&
            __atomic_load_n(&c->n_issued, __ATOMIC_RELAXED) == c->seen_issued)
            busy_extend(c, now_ns(), busy_until);
    }
    return got;
}

/* The fd regime during a loop of the caller's waits on the root CQ (vko.c: drive_enter): park
 * on a futex, not on the wait fd (the replies to the caller's operations would wake the thread
 * once per operation), for VKO_PARK_US at first, twice as long at each park of the same loop
 * up to VKO_PARK_MAX_US (each look preempts the caller or a peer's busy thread on a node with
 * as many PEs as CPUs); 1 if it parked. vko_close wakes it, and so does a wait of the core
 * that stops spinning (vko_native.c: native_watch): the caller then waits on its memory, not
 * on the CQ, and peers' requests must be served meanwhile. */
#define VKO_PARK_US 200
#define VKO_PARK_MAX_US 2000

static int driven(vko_ctx *c) {
    if (__builtin_popcount(__atomic_load_n(&c->drive_short, __ATOMIC_RELAXED) & 0xff) < 5)
        return 0; /* no loop */
    return __atomic_load_n(&c->n_driving, __ATOMIC_SEQ_CST) ||
           now_ns() - __atomic_load_n(&c->drive_end, __ATOMIC_RELAXED) < VKO_TIGHT_NS;
}

static int park(vko_ctx *c, uint32_t *park_us) {
    if (!driven(c)) {
        *park_us = VKO_PARK_US;
        return 0;
    }
    /* parked first, then the checks: native_watch either sees it or is seen */
    __atomic_store_n(&c->parked, 1, __ATOMIC_SEQ_CST);
    uint32_t seq = __atomic_load_n(&c->park_seq, __ATOMIC_SEQ_CST);
    if (driven(c) && !__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, *park_us * 1000L};
        __atomic_add_fetch(&c->n_parks, 1, __ATOMIC_RELAXED);
        syscall(SYS_futex, &c->park_seq, FUTEX_WAIT_PRIVATE, seq, &ts, NULL, 0);
        *park_us = *park_us * 2 < VKO_PARK_MAX_US ? *park_us * 2 : VKO_PARK_MAX_US;
    }
    __atomic_store_n(&c->parked, 0, __ATOMIC_RELAXED);
    if (c->eps_n > 1) { /* the caller reads the root CQ only: the contexts' are the thread's */
        pthread_rwlock_rdlock(&c->cqlock);
        drain_contexts(c);
        pthread_rwlock_unlock(&c->cqlock);
    }
    return 1;
}

/* One round of the sread regime (a wait object without an fd). */
static int sread_round(vko_ctx *c) {
    struct fi_cq_entry ent[16];
    int got = 0;
    pthread_rwlock_rdlock(&c->cqlock);
    ssize_t n = fi_cq_sread(c->cq, ent, 16, NULL, c->eps_n > 1 ? 1 : VKO_IDLE_MS);
    if (n > 0) {
        for (ssize_t i = 0; i < n; i++)
            complete(c, (vko_req *)ent[i].op_context, 0);
        got = (int)n;
    } else if (n == -FI_EAVAIL) {
        got = drain(c, c->cq);
    }
    poke(c);
    got += drain_contexts(c);
    pthread_rwlock_unlock(&c->cqlock);
    return got;
}

static void *progress_main(void *arg) {
    vko_ctx *c = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* poll_us means poll_us, not +50 us */
    struct timespec nap = {0, (long)c->poll_us * 1000};
    struct timespec idle_nap = {0, (long)c->idle_poll_us * 1000};
    uint64_t last_active = now_ns(), busy_until = 0, rseen = remote_count(c, 0);
    uint64_t last_issue = 0;
    uint32_t park_us = VKO_PARK_US;
    uint64_t busy_ns = (uint64_t)c->busy_us * 1000;
    c->seen_issued = 0;
    while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
        uint64_t issued = __atomic_load_n(&c->n_issued, __ATOMIC_RELAXED);
        int active = issued != c->seen_issued, got;
        c->seen_issued = issued;
        if (active)
            last_issue = now_ns();
        if (c->wait_fd >= 0) {
            got = park(c, &park_us) ? 0 : fd_round(c, &busy_until, last_issue);
        } else if (c->waitable) {
            got = sread_round(c);
        } else {
            pthread_rwlock_rdlock(&c->cqlock);
            got = drain(c, c->cq) + drain_contexts(c);
            pthread_rwlock_unlock(&c->cqlock);
        }
        __atomic_add_fetch(&c->n_rounds, 1, __ATOMIC_RELAXED);
        if (got)
            __atomic_add_fetch(&c->n_wakeups, 1, __ATOMIC_RELAXED);
        if (c->waitable)
            continue;
        uint64_t remote = remote_count(c, rseen);
        int peer = remote != rseen;
        if (peer) {
            /* a peer's operation was served here: more are likely to follow at once, and
             * each waits for this thread (the provider's progress is manual), so poll
             * without sleeping for busy_us */
            __atomic_add_fetch(&c->n_remote, remote - rseen, __ATOMIC_RELAXED);
            rseen = remote;
            if (busy_ns)
                busy_extend(c, now_ns(), &busy_until);
        }
        if (got || active || peer) {
            last_active = now_ns();
        } else {
            /* polls without sleeping within busy_us of a peer's operation, then every
             * poll_us while this PE was active in the last VKO_IDLE_AFTER_NS, then every
             * idle_poll_us (peers' requests then wait up to that long) */
            uint64_t t = now_ns();
            if (t < busy_until) {
                last_active = t;
                busy_pause(c);
            } else {
                nanosleep(t - last_active > VKO_IDLE_AFTER_NS ? &idle_nap : &nap, NULL);
            }
        }
    }
    return NULL;
}
