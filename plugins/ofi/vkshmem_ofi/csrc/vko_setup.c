/* vkshmem-ofi: opening and closing the fabric, registrations, endpoints (contexts' parked for reuse).
 * Included by vko.c (one translation unit, so cffi compiles one file). */

static void seterr(char *err, size_t errlen, const char *what, int rc) {
    if (err && errlen)
        snprintf(err, errlen, "%s: %s (%d)", what, fi_strerror(rc < 0 ? -rc : rc), rc);
}

/* Providers whose endpoints bind a network address (an IP address, or an RDMA device's found
 * by its IP address): given the job's host address, they bind that one only (FI_SOURCE). shm
 * (names under /dev/shm) and the others keep their own defaults. */
static int binds_network(const char *prov_name) {
    static const char *const net[] = {"tcp", "sockets", "udp", "verbs", "net"};
    char buf[128];
    snprintf(buf, sizeof buf, "%s", prov_name ? prov_name : "");
    char *save = NULL;
    for (char *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save))
        for (size_t i = 0; i < sizeof net / sizeof *net; i++)
            if (!strcmp(tok, net[i]))
                return 1;
    return 0;
}

/* vko_open's work; rma_event: ask for FI_RMA_EVENT and open the remote-access counter;
 * src_node: the job's address of this host (NULL or "": none). */
static vko_ctx *open_ctx(const char *prov, const char *src_node, int32_t n_pes, uint32_t poll_us,
                         uint32_t idle_poll_us, uint32_t busy_us, uint32_t spin_us,
                         double timeout_s, int rma_event, char *err, size_t errlen) {
    struct fi_info *hints = fi_allocinfo();
    vko_ctx *c = calloc(1, sizeof *c);
    int rc;
    if (!hints || !c || n_pes <= 0) {
        seterr(err, errlen, "out of memory", FI_ENOMEM);
        free(c);
        fi_freeinfo(hints);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_rwlockattr_t rwa;
    pthread_rwlockattr_init(&rwa);
    pthread_rwlockattr_setkind_np(&rwa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&c->cqlock, &rwa);
    pthread_rwlockattr_destroy(&rwa);
    c->n_pes = n_pes;
    c->my_pe = -1;
    c->busy_yield = 1;
    c->poll_us = poll_us ? poll_us : 1;
    c->idle_poll_us = idle_poll_us > c->poll_us ? idle_poll_us : c->poll_us;
    c->busy_us = busy_us;
    c->spin_us = spin_us;
    c->timeout_ns = (uint64_t)(timeout_s * 1e9);
    c->wait_fd = -1;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE |
                  (rma_event ? FI_RMA_EVENT : 0);
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->domain_attr->av_type = FI_AV_TABLE;
    hints->addr_format = FI_FORMAT_UNSPEC;
    if (prov && *prov)
        hints->fabric_attr->prov_name = strdup(prov);
    rc = fi_getinfo(VKO_API, NULL, NULL, 0, hints, &c->info);
    if (rc) {
        fi_freeinfo(hints);
        seterr(err, errlen, "fi_getinfo found no provider with RDM endpoints, RMA and atomics",
               rc);
        c->info = NULL;
        vko_close(c);
        return NULL;
    }
    /* A network provider binds its listener to the job's address of this host only, not to
     * the address it picks itself (the first interface's, or any): ask again for the same
     * provider with that address as the source. No fallback to the provider's choice. */
    if (src_node && *src_node && binds_network(c->info->fabric_attr->prov_name)) {
        free(hints->fabric_attr->prov_name);
        hints->fabric_attr->prov_name = strdup(c->info->fabric_attr->prov_name);
        fi_freeinfo(c->info);
        c->info = NULL;
        rc = fi_getinfo(VKO_API, src_node, NULL, FI_SOURCE, hints, &c->info);
        if (rc) {
            fi_freeinfo(hints);
            char what[VKO_ERRLEN];
            snprintf(what, sizeof what, "fi_getinfo with source address %.64s (the job's "
                     "address of this host)", src_node);
            seterr(err, errlen, what, rc);
            c->info = NULL;
            vko_close(c);
            return NULL;
        }
        snprintf(c->src_node, sizeof c->src_node, "%s", src_node);
    }
    fi_freeinfo(hints);
    if ((rc = fi_fabric(c->info->fabric_attr, &c->fabric, NULL))) {
        seterr(err, errlen, "fi_fabric", rc);
        vko_close(c);
        return NULL;
    }
    if ((rc = fi_domain(c->fabric, c->info, &c->domain, NULL))) {
        seterr(err, errlen, "fi_domain", rc);
        vko_close(c);
        return NULL;
    }
    struct fi_av_attr av = {.type = FI_AV_TABLE, .count = (size_t)n_pes};
    if ((rc = fi_av_open(c->domain, &av, &c->av, NULL))) {
        seterr(err, errlen, "fi_av_open", rc);
        vko_close(c);
        return NULL;
    }
    struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_FD,
                             .size = 0};
    c->waitable = 1;
    if (fi_cq_open(c->domain, &cqa, &c->cq, NULL)) {
        cqa.wait_obj = FI_WAIT_NONE;
        c->waitable = 0;
        if ((rc = fi_cq_open(c->domain, &cqa, &c->cq, NULL))) {
            seterr(err, errlen, "fi_cq_open", rc);
            vko_close(c);
            return NULL;
        }
    }
    c->wait_fd = cq_wait_fd(c);
    if (rma_event) {
        struct fi_cntr_attr ca = {.events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_NONE};
        if ((rc = fi_cntr_open(c->domain, &ca, &c->rcntr, NULL))) {
            c->rcntr = NULL;
            seterr(err, errlen, "fi_cntr_open", rc);
            vko_close(c);
            return NULL;
        }
    }
    c->peers = calloc((size_t)n_pes, sizeof *c->peers);
    if (!c->peers) {
        seterr(err, errlen, "out of memory", FI_ENOMEM);
        vko_close(c);
        return NULL;
    }
    return c; /* the progress thread starts with the root endpoint */
}

vko_ctx *vko_open(const char *prov, const char *src_node, int32_t n_pes, uint32_t poll_us,
                  uint32_t idle_poll_us, uint32_t busy_us, uint32_t spin_us, double timeout_s,
                  char *err, size_t errlen) {
    vko_ctx *c = open_ctx(prov, src_node, n_pes, poll_us, idle_poll_us, busy_us, spin_us, timeout_s, 0,
                          err, errlen);
    if (!c || c->waitable || !busy_us)
        return c;
    /* A polling provider (no CQ wait object: shm): where it offers FI_RMA_EVENT, a counter
     * of the peers' operations tells the progress thread when to busy-poll. */
    char err2[VKO_ERRLEN];
    vko_ctx *c2 = open_ctx(prov, src_node, n_pes, poll_us, idle_poll_us, busy_us, spin_us, timeout_s, 1,
                           err2, sizeof err2);
    if (!c2)
        return c;
    if (c2->waitable || strcmp(c2->info->fabric_attr->prov_name,
                               c->info->fabric_attr->prov_name)) {
        vko_close(c2);
        return c;
    }
    vko_close(c);
    return c2;
}

/* Wait (bounded) for the endpoint's operations, then close it and its own CQ. The caller has
 * taken it off the context's list; a context endpoint closes under cqlock (the progress
 * thread is not reading its CQ), the root one after the thread stopped. */
static void ep_free(vko_ep *e, int wait) {
    vko_ctx *c = e->c;
    int drained = 1;
    if (wait && e->ep) {
        uint64_t t0 = now_ns();
        while (__atomic_load_n(&e->outstanding, __ATOMIC_ACQUIRE) > 0) {
            drain(c, e->cq);
            if (now_ns() - t0 > VKO_CLOSE_NS) {
                drained = 0;
                break;
            }
            sched_yield();
        }
    }
    int own = e->cq && e->cq != c->cq;
    if (own)
        pthread_rwlock_wrlock(&c->cqlock);
    if (e->ep && !e->shared) /* (a shared one's is the root's) */
        fi_close(&e->ep->fid);
    if (own)
        fi_close(&e->cq->fid);
    if (own)
        pthread_rwlock_unlock(&c->cqlock);
    e->ep = NULL;
    e->cq = NULL;
    if (drained) { /* else requests in flight still point at it: leak it */
        free(e->dirty);
        free(e);
    }
}

void vko_close(vko_ctx *c) {
    if (!c)
        return;
    if (c->thread_started) {
        __atomic_store_n(&c->stop, 1, __ATOMIC_RELEASE);
        __atomic_add_fetch(&c->park_seq, 1, __ATOMIC_SEQ_CST); /* a parked thread wakes */
        syscall(SYS_futex, &c->park_seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        pthread_join(c->thread, NULL);
    }
    pthread_mutex_lock(&c->lock);
    vko_ep *e = c->eps;
    c->eps = NULL;
    pthread_mutex_unlock(&c->lock);
    while (e) {
        vko_ep *next = e->next;
        ep_free(e, 1);
        e = next;
    }
    for (size_t i = 0; i < c->n_mrs; i++)
        fi_close(&c->mrs[i]->fid);
    free(c->mrs);
    free(c->keys);
    if (c->cq)
        fi_close(&c->cq->fid);
    if (c->rcntr)
        fi_close(&c->rcntr->fid);
    if (c->av)
        fi_close(&c->av->fid);
    if (c->domain)
        fi_close(&c->domain->fid);
    if (c->fabric)
        fi_close(&c->fabric->fid);
    if (c->info)
        fi_freeinfo(c->info);
    free(c->peers);
    pthread_mutex_destroy(&c->lock);
    pthread_rwlock_destroy(&c->cqlock);
    free(c);
}

int vko_mr_key_size(vko_ctx *c) {
    size_t n = c->info->domain_attr->mr_key_size;
    return n == 0 || n > 8 ? 8 : (int)n; /* 0: not stated; keys are 64-bit in the API */
}

/* A key nobody can guess: vko_mr_key_size() bytes from the kernel's CSPRNG, never 0 and
 * never one this context already requested. VK_ST_RANDOM where getrandom(2) fails. */
static int random_key(vko_ctx *c, uint64_t *out) {
    int bytes = vko_mr_key_size(c);
    uint64_t mask = bytes >= 8 ? UINT64_MAX : (UINT64_C(1) << (8 * bytes)) - 1;
    for (int tries = 0; tries < 64; tries++) {
        uint64_t k = 0;
        ssize_t got;
        do
            got = getrandom(&k, sizeof k, 0);
        while (got < 0 && errno == EINTR);
        if (got != (ssize_t)sizeof k)
            return VK_ST_RANDOM;
        k &= mask;
        int used = k == 0;
        for (size_t i = 0; i < c->n_mrs && !used; i++)
            used = c->keys[i] == k;
        if (!used) {
            *out = k;
            return 0;
        }
    }
    return VK_ST_RANDOM;
}

int vko_mr_reg(vko_ctx *c, uintptr_t addr, uint64_t size, int dmabuf_fd, uint64_t *key,
               uint64_t *remote_base) {
    struct fid_mr *mr = NULL;
    uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    uint64_t want = 0;
    int rc;
    pthread_mutex_lock(&c->lock);
    if (c->n_mrs == c->cap_mrs) {
        size_t cap = c->cap_mrs ? 2 * c->cap_mrs : 8;
        struct fid_mr **m = realloc(c->mrs, cap * sizeof *m);
        if (m)
            c->mrs = m;
        uint64_t *k = m ? realloc(c->keys, cap * sizeof *k) : NULL;
        if (!k) {
            pthread_mutex_unlock(&c->lock);
            return VK_ST_NOMEM;
        }
        c->keys = k;
        c->cap_mrs = cap;
    }
    /* the provider may refuse a key in use elsewhere in its domain (-FI_ENOKEY): draw again */
    for (int attempt = 0; attempt < 8; attempt++) {
        if ((rc = random_key(c, &want)))
            break;
        if (dmabuf_fd >= 0) {
#ifdef FI_MR_DMABUF
            struct fi_mr_dmabuf dmabuf = {.fd = dmabuf_fd, .offset = 0, .len = size,
                                          .base_addr = (void *)addr};
            struct fi_mr_attr attr;
            memset(&attr, 0, sizeof attr);
            attr.dmabuf = &dmabuf;
            attr.iov_count = 1;
            attr.access = access;
            attr.requested_key = want;
            attr.iface = FI_HMEM_SYSTEM;
            rc = fi_mr_regattr(c->domain, &attr, FI_MR_DMABUF, &mr);
#else
            rc = VK_ST_NODMABUF;
#endif
        } else {
            rc = fi_mr_reg(c->domain, (void *)addr, size, access, 0, want, 0, &mr, NULL);
        }
        if (rc != -FI_ENOKEY)
            break;
    }
    if (rc) {
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    c->keys[c->n_mrs] = want;
    c->mrs[c->n_mrs++] = mr;
    pthread_mutex_unlock(&c->lock);
    *key = (c->info->domain_attr->mr_mode & FI_MR_PROV_KEY) ? fi_mr_key(mr) : want;
    *remote_base = (c->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? addr : 0;
    return 0;
}

/* A closed context's endpoint, parked (vko_ep_close) for the next context: libfabric 2.5's shm
 * crashes opening an endpoint on an AV after a same-process endpoint that had sent to this
 * PE's root endpoint closed (its map keeps the closed endpoint's region), so context
 * endpoints are reused rather than closed and reopened. NULL if none is parked. */
static vko_ep *ep_reuse(vko_ctx *c) {
    pthread_mutex_lock(&c->lock);
    vko_ep *e = c->eps;
    while (e && !e->pooled)
        e = e->next;
    if (e) {
        e->pooled = 0;
        e->first_err = 0;
        e->py_held = 0;
        memset(e->dirty, 0, (size_t)c->n_pes);
    }
    pthread_mutex_unlock(&c->lock);
    return e;
}

vko_ep *vko_ep_open(vko_ctx *c, const char *name, char *err, size_t errlen) {
    vko_ep *e = c->root_taken ? ep_reuse(c) : NULL;
    if (e)
        return e;
    e = calloc(1, sizeof *e);
    int rc;
    if (!e || !(e->dirty = calloc((size_t)c->n_pes, 1))) {
        free(e);
        seterr(err, errlen, "out of memory", FI_ENOMEM);
        return NULL;
    }
    e->c = c;
    pthread_mutex_lock(&c->lock);
    int root = c->eps_n == 0 && !c->root_taken;
    c->root_taken = 1;
    if (!root && !c->ctx_own && c->root) { /* on the root's endpoint and CQ: nothing to open */
        e->shared = 1;
        e->ep = c->root->ep;
        e->cq = c->cq;
        e->next = c->eps;
        c->eps = e;
        pthread_mutex_unlock(&c->lock);
        return e;
    }
    pthread_mutex_unlock(&c->lock);
    /* The root endpoint uses the shared CQ the progress thread sleeps on; a context endpoint
     * gets its own CQ, closed with it (libfabric 1.17's rxm crashes reading a CQ with a wait
     * object after one of its endpoints closed). */
    struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE};
    e->cq = root ? c->cq : NULL;
    if (!root && (rc = fi_cq_open(c->domain, &cqa, &e->cq, NULL))) {
        e->cq = NULL;
        seterr(err, errlen, "fi_cq_open", rc);
    } else if ((rc = fi_endpoint(c->domain, c->info, &e->ep, NULL))) {
        e->ep = NULL;
        seterr(err, errlen, "fi_endpoint", rc);
    } else if ((rc = fi_ep_bind(e->ep, &c->av->fid, 0))) {
        seterr(err, errlen, "fi_ep_bind(av)", rc);
    } else if ((rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV))) {
        seterr(err, errlen, "fi_ep_bind(cq)", rc);
    } else if (name && *name && c->info->addr_format == FI_ADDR_STR &&
               (rc = fi_setname(&e->ep->fid, (void *)name, strlen(name) + 1))) {
        seterr(err, errlen, "fi_setname", rc);
    } else if (root && c->rcntr &&
               fi_ep_bind(e->ep, &c->rcntr->fid, FI_REMOTE_WRITE | FI_REMOTE_READ)) {
        fi_close(&c->rcntr->fid); /* no busy-polling window then, nothing worse */
        c->rcntr = NULL;
        rc = fi_enable(e->ep);
        if (rc)
            seterr(err, errlen, "fi_enable", rc);
    } else if ((rc = fi_enable(e->ep))) {
        seterr(err, errlen, "fi_enable", rc);
    }
    if (rc) {
        ep_free(e, 0);
        return NULL;
    }
    pthread_mutex_lock(&c->lock);
    if (!c->valid_done) {
        c->valid = query_valid(e->ep);
        c->valid_done = 1;
    }
    e->next = c->eps;
    c->eps = e;
    c->eps_n++;
    if (root)
        c->root = e;
    pthread_mutex_unlock(&c->lock);
    if (root && (rc = pthread_create(&c->thread, NULL, progress_main, c))) {
        seterr(err, errlen, "cannot start the progress thread", -rc);
        pthread_mutex_lock(&c->lock);
        c->eps = e->next;
        c->eps_n--;
        c->root = NULL;
        pthread_mutex_unlock(&c->lock);
        ep_free(e, 0);
        return NULL;
    }
    if (root)
        c->thread_started = 1;
    return e;
}

void vko_ep_close(vko_ep *e) {
    vko_ctx *c = e->c;
    if (e == c->root) /* the root endpoint closes with the context (vko_close) */
        return;
    uint64_t t0 = now_ns(); /* its operations done, it is parked for the next context */
    while (__atomic_load_n(&e->outstanding, __ATOMIC_ACQUIRE) > 0 &&
           now_ns() - t0 < VKO_CLOSE_NS) {
        drain(c, e->cq);
        sched_yield();
    }
    if (__atomic_load_n(&e->outstanding, __ATOMIC_ACQUIRE) <= 0) {
        pthread_mutex_lock(&c->lock);
        e->pooled = 1;
        pthread_mutex_unlock(&c->lock);
        return;
    }
    pthread_mutex_lock(&c->lock);
    for (vko_ep **p = &c->eps; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            c->eps_n -= !e->shared;
            break;
        }
    pthread_mutex_unlock(&c->lock);
    ep_free(e, 1);
}

void vko_set_context_endpoints(vko_ctx *c, int own) { c->ctx_own = own; }

int vko_ep_name(vko_ep *e, void *buf, size_t *len) {
    size_t cap = *len;
    int rc = fi_getname(&e->ep->fid, buf, len);
    if (rc == -FI_ETOOSMALL || *len > cap)
        return VK_ST_TOOBIG;
    return rc;
}
