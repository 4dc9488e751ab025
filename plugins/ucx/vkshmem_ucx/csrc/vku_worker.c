/* vkshmem-ucx native helper, continued: workers and their peers (one translation unit with vku.c: the
 * build concatenates vku.c, vku_ctx.c, vku_worker.c, vku_ops.c and vku_native.c). */

/* -- workers ------------------------------------------------------------------------------ */

vku_worker *vku_worker_create(vku_ctx *c, int32_t n_pes, char *err, size_t errlen)
{
    vku_worker *w = calloc(1, sizeof(*w));
    if (!w || n_pes < 0) {
        free(w);
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    w->ctx = c;
    w->npes = n_pes;
    w->epoch = 1;
    w->efd = -1;
    w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    w->peers = calloc(n_pes ? (size_t)n_pes : 1, sizeof(vku_peer));
    if (!w->peers) {
        free(w);
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&w->lock, NULL);
    if (w->wakefd < 0) {
        set_err(err, errlen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucs_status_t st = ucp_worker_create(c->context, &wp, &w->worker);
    if (st != UCS_OK) {
        set_err(err, errlen, "ucp_worker_create: %s", ucs_status_string(st));
        goto fail;
    }
    st = ucp_worker_get_efd(w->worker, &w->efd);
    if (st != UCS_OK) {
        set_err(err, errlen, "ucp_worker_get_efd: %s", ucs_status_string(st));
        goto fail;
    }
    ucp_worker_arm(w->worker);
    pthread_mutex_lock(&c->list_lock);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, w->efd, &ev) != 0) {
        pthread_mutex_unlock(&c->list_lock);
        set_err(err, errlen, "epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    w->next = c->workers;
    c->workers = w;
    w->listed = 1;
    pthread_mutex_unlock(&c->list_lock);
    return w;
fail:
    if (w->worker)
        ucp_worker_destroy(w->worker);
    if (w->wakefd >= 0)
        close(w->wakefd);
    pthread_mutex_destroy(&w->lock);
    free(w->peers);
    free(w);
    return NULL;
}

static void close_peer(vku_worker *w, vku_peer *p, uint64_t deadline, int force)
{
    for (int s = 0; s < VKU_MAX_SEGS; s++) {
        if (p->segs[s].rkey)
            ucp_rkey_destroy(p->segs[s].rkey);
        free(p->segs[s].packed);
        memset(&p->segs[s], 0, sizeof(p->segs[s]));
    }
    if (p->ep) {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = (p->failed || force) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        void *req = ucp_ep_close_nbx(p->ep, &prm);
        uint64_t now = now_ns();
        int rc = wait_req(w, req, now < deadline ? deadline - now : 0);
        (void)rc;
        p->ep = NULL;
    }
    free(p->addr);
    p->addr = NULL;
}

void vku_worker_destroy(vku_worker *w, int force)
{
    vku_ctx *c = w->ctx;
    pthread_mutex_lock(&c->list_lock);
    if (w->listed) {
        for (vku_worker **pp = &c->workers; *pp; pp = &(*pp)->next) {
            if (*pp == w) {
                *pp = w->next;
                break;
            }
        }
        epoll_ctl(c->epfd, EPOLL_CTL_DEL, w->efd, NULL);
        w->listed = 0;
    }
    pthread_mutex_unlock(&c->list_lock);
    pthread_mutex_lock(&w->lock);
    finish_pending(w, VKU_CLOSE_TIMEOUT_NS, 0);
    free(w->reply);
    w->reply = NULL;
    free(w->pend);
    w->pend = NULL;
    w->cap = 0;
    uint64_t deadline = now_ns() + VKU_CLOSE_TIMEOUT_NS;
    for (int32_t pe = 0; pe < w->npes; pe++)
        close_peer(w, &w->peers[pe], deadline, force);
    ucp_worker_destroy(w->worker);
    pthread_mutex_unlock(&w->lock);
    pthread_mutex_destroy(&w->lock);
    close(w->wakefd);
    free(w->peers);
    free(w);
}

int vku_worker_address(vku_worker *w, void *buf, size_t *len)
{
    ucp_worker_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    pthread_mutex_lock(&w->lock);
    ucs_status_t st = ucp_worker_query(w->worker, &attr);
    pthread_mutex_unlock(&w->lock);
    if (st != UCS_OK)
        return st;
    int rc = 0;
    if (attr.address_length > *len)
        rc = VK_ST_TOOBIG;
    else
        memcpy(buf, attr.address, attr.address_length);
    *len = attr.address_length;
    ucp_worker_release_address(w->worker, attr.address);
    return rc;
}

int vku_peer_set(vku_worker *w, int32_t pe, const void *addr, size_t len)
{
    if (pe < 0 || pe >= w->npes)
        return VK_ST_PEER;
    if (len == 0 || len > VKU_RKEY_MAX)
        return VK_ST_TOOBIG;
    int rc = 0;
    pthread_mutex_lock(&w->lock);
    vku_peer *p = &w->peers[pe];
    if (p->addr) {
        if (p->addr_len != len || memcmp(p->addr, addr, len) != 0)
            rc = VK_ST_PEER; /* a PE's worker address never changes */
    } else if ((p->addr = malloc(len)) == NULL) {
        rc = VK_ST_NOMEM;
    } else {
        memcpy(p->addr, addr, len);
        p->addr_len = len;
    }
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int vku_peer_seg(vku_worker *w, int32_t pe, uint32_t seg, uint64_t base, uint64_t size,
                 int device, const void *rkey, size_t len)
{
    if (pe < 0 || pe >= w->npes)
        return VK_ST_PEER;
    if (seg >= VKU_MAX_SEGS)
        return VK_ST_SEG;
    if (len == 0 || len > VKU_RKEY_MAX)
        return VK_ST_TOOBIG;
    int rc = 0;
    pthread_mutex_lock(&w->lock);
    vku_rseg *s = &w->peers[pe].segs[seg];
    if (s->packed && s->packed_len == len && memcmp(s->packed, rkey, len) == 0 &&
        s->base == base && s->size == size && s->device == device)
        goto out; /* the same key again */
    void *copy = malloc(len);
    if (!copy) {
        rc = VK_ST_NOMEM;
        goto out;
    }
    memcpy(copy, rkey, len);
    if (s->rkey)
        ucp_rkey_destroy(s->rkey);
    free(s->packed);
    s->rkey = NULL;
    s->packed = copy;
    s->packed_len = len;
    s->base = base;
    s->size = size;
    s->device = device;
out:
    pthread_mutex_unlock(&w->lock);
    return rc;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    vku_peer *p = arg;
    p->failed = status;
}

/* Resolve (pe, seg, off, n) to an endpoint, rkey and remote address (w->lock held). */
static int target(vku_worker *w, int32_t pe, uint32_t seg, uint64_t off, uint64_t n,
                  vku_peer **pp, ucp_rkey_h *rkey, uint64_t *raddr, char **local)
{
    if (!w->worker)
        return VK_ST_CLOSED;
    if (pe < 0 || pe >= w->npes || !w->peers[pe].addr)
        return VK_ST_PEER;
    vku_peer *p = &w->peers[pe];
    if (seg >= VKU_MAX_SEGS || !p->segs[seg].packed)
        return VK_ST_SEG;
    vku_rseg *s = &p->segs[seg];
    if (off > s->size || n > s->size - off)
        return VK_ST_BOUNDS;
    if (p->failed)
        return p->failed;
    if (!p->ep) {
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof(ep));
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.address = p->addr;
        ep.err_mode = w->ctx->err_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
        if (w->ctx->err_peer) {
            ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep.err_handler.cb = on_ep_error;
            ep.err_handler.arg = p;
        }
        ucs_status_t st = ucp_ep_create(w->worker, &ep, &p->ep);
        if (st != UCS_OK) {
            p->ep = NULL;
            return st;
        }
    }
    if (!s->rkey) {
        ucs_status_t st = ucp_ep_rkey_unpack(p->ep, s->packed, &s->rkey);
        if (st != UCS_OK) {
            s->rkey = NULL;
            return st;
        }
        /* UCX's shared memory maps memory it allocated (heap=ucx) into this process: loads,
         * stores and CPU atomics reach it directly (as UCX's own posix transport does) */
        void *lp;
        if (!s->device && w->ctx->direct && ucp_rkey_ptr(s->rkey, s->base, &lp) == UCS_OK)
            s->ptr = lp;
    }
    *pp = p;
    *rkey = s->rkey;
    *raddr = s->base + off;
    if (local)
        *local = s->ptr ? s->ptr + off : NULL;
    return 0;
}
