/* vkshmem-ofi: the peers' addresses and segment keys, and the data path (put, get, AMOs,
 * fence, quiet). Included by vko.c.
 * fence: where the provider grants write-after-write ordering on both sides, only the
 * outstanding AMOs are waited for (puts stay in flight); elsewhere all outstanding writes.
 *
 * Ordering extras: a get or a fetching AMO first waits for this endpoint's outstanding writes
 * (puts and non-fetching AMOs), so it observes them; a non-fetching AMO waits for the
 * outstanding puts (AMO-after-AMO the providers order themselves). No provider here grants
 * read-after-write or put-then-AMO ordering across RMA and atomics. fence waits for the outstanding writes (fence = quiet of
 * writes): tcp;ofi_rxm orders put-after-put and AMO-after-AMO but not put-then-AMO. */

int vko_peer_set(vko_ctx *c, int32_t pe, const void *addr, size_t len) {
    if (pe < 0 || pe >= c->n_pes || len == 0)
        return VK_ST_PEER;
    if (len > VKO_ADDR_MAX)
        return VK_ST_TOOBIG;
    vko_peer *p = &c->peers[pe];
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    if (!(p->valid && p->namelen == len && !memcmp(p->name, addr, len))) {
        fi_addr_t fa = FI_ADDR_NOTAVAIL;
        int n = fi_av_insert(c->av, addr, 1, &fa, 0, NULL);
        if (n != 1) {
            rc = n < 0 ? n : -FI_EINVAL;
        } else {
            memcpy(p->name, addr, len);
            p->namelen = len;
            p->fa = fa;
            __atomic_store_n(&p->valid, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int vko_peer_seg(vko_ctx *c, int32_t pe, uint32_t seg, uint64_t base, uint64_t size,
                 uint64_t key) {
    if (pe < 0 || pe >= c->n_pes)
        return VK_ST_PEER;
    if (seg >= VKO_MAX_SEGS)
        return VK_ST_SEG;
    vko_rseg *s = &c->peers[pe].segs[seg];
    pthread_mutex_lock(&c->lock);
    __atomic_store_n(&s->valid, 0, __ATOMIC_RELEASE);
    s->base = base;
    s->size = size;
    s->key = key;
    __atomic_store_n(&s->valid, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

/* The peer's segment for [off, off+n), or an error code. */
static int target(vko_ctx *c, int32_t pe, uint32_t seg, uint64_t off, uint64_t n,
                  fi_addr_t *fa, uint64_t *raddr, uint64_t *key) {
    if (pe < 0 || pe >= c->n_pes || !__atomic_load_n(&c->peers[pe].valid, __ATOMIC_ACQUIRE))
        return VK_ST_PEER;
    if (seg >= VKO_MAX_SEGS)
        return VK_ST_SEG;
    vko_rseg *s = &c->peers[pe].segs[seg];
    if (!__atomic_load_n(&s->valid, __ATOMIC_ACQUIRE))
        return VK_ST_SEG;
    if (off > s->size || n > s->size - off)
        return VK_ST_BOUNDS;
    *fa = c->peers[pe].fa;
    *raddr = s->base + off;
    *key = s->key;
    return 0;
}

static int flush_injects(vko_ep *e, int32_t only);

/* Writes issued so far (and injected atomics) are complete at their targets. */
static int settle_writes(vko_ep *e, int32_t pe) {
    int rc = flush_injects(e, pe);
    if (rc)
        return rc;
    return wait_zero(e, &e->writes);
}

/* vko_put; try_: only a put that is copied (the source is not kept) and posts at once, else
 * -FI_EAGAIN with nothing done. */
static int put_impl(vko_ep *e, int32_t pe, uint32_t seg, uint64_t off, const void *src,
                    size_t n, int nbi, int try_) {
    vko_ctx *c = e->c;
    fi_addr_t fa;
    uint64_t raddr, key;
    if (!e->ep)
        return VK_ST_CLOSED;
    int rc = target(c, pe, seg, off, n, &fa, &raddr, &key);
    if (rc || n == 0)
        return rc;
    if (try_ && n > VKO_BOUNCE)
        return -FI_EAGAIN;
    size_t max = c->info->ep_attr->max_msg_size ? c->info->ep_attr->max_msg_size : n;
    const char *p = src;
    while (n) {
        size_t len = n < max ? n : max;
        int small = len <= VKO_BOUNCE;
        vko_req *r = new_req(e, VKO_W_PUT, small || nbi);
        if (!r)
            return VK_ST_NOMEM;
        if (small)
            memcpy(r->bounce, p, len);
        struct iovec iov = {.iov_base = small ? r->bounce : (void *)p, .iov_len = len};
        struct fi_rma_iov rma = {.addr = raddr, .len = len, .key = key};
        struct fi_msg_rma msg = {.msg_iov = &iov, .iov_count = 1, .addr = fa,
                                 .rma_iov = &rma, .rma_iov_count = 1, .context = r};
        rc = POST(e, try_, fi_writemsg(e->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE));
        if (rc) {
            drop_req(r);
            return rc;
        }
        if (!small && !nbi && (rc = wait_req(e, r, NULL)))
            return rc;
        p += len;
        raddr += len;
        n -= len;
    }
    return 0;
}

int vko_put(vko_ep *e, int32_t pe, uint32_t seg, uint64_t off, const void *src, size_t n,
            int nbi) {
    return put_impl(e, pe, seg, off, src, n, nbi, 0);
}

int vko_get(vko_ep *e, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n, int nbi) {
    vko_ctx *c = e->c;
    fi_addr_t fa;
    uint64_t raddr, key;
    if (!e->ep)
        return VK_ST_CLOSED;
    int rc = target(c, pe, seg, off, n, &fa, &raddr, &key);
    if (rc || n == 0)
        return rc;
    if ((rc = settle_writes(e, pe)))
        return rc;
    size_t max = c->info->ep_attr->max_msg_size ? c->info->ep_attr->max_msg_size : n;
    char *p = dst;
    while (n) {
        size_t len = n < max ? n : max;
        vko_req *r = new_req(e, 0, nbi);
        if (!r)
            return VK_ST_NOMEM;
        struct iovec iov = {.iov_base = p, .iov_len = len};
        struct fi_rma_iov rma = {.addr = raddr, .len = len, .key = key};
        struct fi_msg_rma msg = {.msg_iov = &iov, .iov_count = 1, .addr = fa,
                                 .rma_iov = &rma, .rma_iov_count = 1, .context = r};
        rc = POST(e, 0, fi_readmsg(e->ep, &msg, FI_COMPLETION));
        if (rc) {
            drop_req(r);
            return rc;
        }
        if (!nbi && (rc = wait_req(e, r, NULL)))
            return rc;
        p += len;
        raddr += len;
        n -= len;
    }
    return 0;
}

/* One native AMO: fetch=0 posts and returns (the operand lives in the request). */
static int amo1(vko_ep *e, fi_addr_t fa, uint64_t raddr, uint64_t key, int op, int width,
                uint64_t operand, uint64_t compare, int fetch, uint64_t *result, int try_) {
    vko_ctx *c = e->c;
    enum fi_datatype dt = width == 8 ? FI_UINT64 : FI_UINT32;
    int rc;
    if (!fetch && c->inject_amo) {
        __atomic_add_fetch(&c->n_issued, 1, __ATOMIC_RELAXED);
        rc = POST(e, try_, fi_inject_atomic(e->ep, &operand, 1, fa, raddr, key, dt, FIOP[op]));
        return rc;
    }
    vko_req *r = new_req(e, !fetch, !fetch);
    if (!r)
        return VK_ST_NOMEM;
    r->operand = operand;
    r->compare = compare;
    struct fi_ioc ioc = {.addr = &r->operand, .count = 1};
    struct fi_rma_ioc rioc = {.addr = raddr, .count = 1, .key = key};
    struct fi_msg_atomic m = {.msg_iov = &ioc, .iov_count = 1, .addr = fa, .rma_iov = &rioc,
                              .rma_iov_count = 1, .datatype = dt, .op = FIOP[op],
                              .context = r};
    struct fi_ioc res = {.addr = &r->result, .count = 1};
    struct fi_ioc cmp = {.addr = &r->compare, .count = 1};
    if (!fetch)
        rc = POST(e, try_, fi_atomicmsg(e->ep, &m, FI_COMPLETION | FI_DELIVERY_COMPLETE));
    else if (op == VK_CSWAP)
        rc = POST(e, try_, fi_compare_atomicmsg(e->ep, &m, &cmp, NULL, 1, &res, NULL, 1,
                                          FI_COMPLETION));
    else
        rc = POST(e, try_, fi_fetch_atomicmsg(e->ep, &m, &res, NULL, 1, FI_COMPLETION));
    if (rc) {
        drop_req(r);
        return rc;
    }
    if (!fetch)
        return 0;
    uint64_t out = 0;
    rc = wait_req(e, r, &out);
    *result = width == 8 ? out : (out & 0xffffffffu);
    return rc;
}

static uint64_t apply(int op, uint64_t old, uint64_t x, uint64_t mask) {
    switch (op) {
    case VK_SET: case VK_SWAP: return x & mask;
    case VK_ADD: return (old + x) & mask;
    case VK_AND: return old & x;
    case VK_OR: return (old | x) & mask;
    case VK_XOR: return (old ^ x) & mask;
    default: return old;
    }
}

/* vko_amo; try_: only a non-fetching native AMO that needs no wait before it and posts at
 * once, else -FI_EAGAIN with nothing done. */
static int amo_impl(vko_ep *e, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
                    uint64_t operand, uint64_t compare, int fetch, uint64_t *result,
                    int try_) {
    vko_ctx *c = e->c;
    fi_addr_t fa;
    uint64_t raddr, key, mask = width == 8 ? ~0ull : 0xffffffffull;
    if (!e->ep)
        return VK_ST_CLOSED;
    if ((width != 4 && width != 8) || op < 0 || op > 7)
        return VK_ST_AMO;
    int rc = target(c, pe, seg, off, (uint64_t)width, &fa, &raddr, &key);
    if (rc)
        return rc;
    if (off % (uint64_t)width)
        return VK_ST_ALIGN;
    operand &= mask;
    compare &= mask;
    if (op == VK_FETCH || op == VK_SWAP || op == VK_CSWAP)
        fetch = 1;
    *result = 0;
    uint32_t bit = 1u << (op + (width == 8 ? VKO_AMO_W8 : 0) + (fetch ? VKO_AMO_FETCH : 0));
    uint32_t cas = 1u << (VK_CSWAP + (width == 8 ? VKO_AMO_W8 : 0) + VKO_AMO_FETCH);
    int native = (c->valid & bit) && !(c->emulate & bit);
    if (try_ && (fetch || !native || __atomic_load_n(&e->puts, __ATOMIC_ACQUIRE) > 0))
        return -FI_EAGAIN;
    if ((rc = fetch ? settle_writes(e, pe) : vko_settle_puts(e)))
        return rc;
    if (native) {
        rc = amo1(e, fa, raddr, key, op, width, operand, compare, fetch, result, try_);
        if (!rc && !fetch && c->inject_amo)
            __atomic_store_n(&e->dirty[pe], 1, __ATOMIC_RELEASE);
        return rc;
    }
    if (!(c->valid & cas))
        return VK_ST_AMO;
    /* Emulation with compare-and-swap: read the word (CSWAP 0 -> 0 changes nothing), then
     * swap in the new value until no other write came in between. */
    if (!fetch && (rc = settle_writes(e, pe)))
        return rc;
    __atomic_add_fetch(&c->n_emulated, 1, __ATOMIC_RELAXED);
    uint64_t old = 0, got = 0;
    if ((rc = amo1(e, fa, raddr, key, VK_CSWAP, width, 0, 0, 1, &old, 0)))
        return rc;
    for (;;) {
        if (op == VK_FETCH)
            break;
        uint64_t want = apply(op, old, operand, mask);
        if ((rc = amo1(e, fa, raddr, key, VK_CSWAP, width, want, old, 1, &got, 0)))
            return rc;
        if (got == old)
            break;
        old = got;
    }
    *result = old;
    return 0;
}

int vko_amo(vko_ep *e, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
            uint64_t operand, uint64_t compare, int fetch, uint64_t *result) {
    return amo_impl(e, pe, seg, off, op, width, operand, compare, fetch, result, 0);
}

/* For providers whose non-fetching AMOs are injected: a fetching read of the word at offset 0
 * of the PE's first segment, which the target serves after the injected ones (one queue). */
static int flush_injects(vko_ep *e, int32_t only) {
    vko_ctx *c = e->c;
    if (!c->inject_amo)
        return 0;
    for (int32_t pe = only >= 0 ? only : 0; pe < (only >= 0 ? only + 1 : c->n_pes); pe++) {
        if (!__atomic_exchange_n(&e->dirty[pe], 0, __ATOMIC_ACQ_REL))
            continue;
        for (uint32_t s = 0; s < VKO_MAX_SEGS; s++) {
            vko_rseg *rs = &c->peers[pe].segs[s];
            if (!__atomic_load_n(&rs->valid, __ATOMIC_ACQUIRE) || rs->size < 8)
                continue;
            uint64_t out;
            int rc = amo1(e, c->peers[pe].fa, rs->base, rs->key, VK_FETCH, 8, 0, 0, 1, &out,
                          0);
            if (rc)
                return rc;
            break;
        }
    }
    return 0;
}

int vko_settle_puts(vko_ep *e) {
    if (!e->ep)
        return VK_ST_CLOSED;
    return __atomic_load_n(&e->puts, __ATOMIC_ACQUIRE) > 0 ? wait_zero(e, &e->puts) : 0;
}

int vko_fence(vko_ep *e) {
    if (!e->ep)
        return VK_ST_CLOSED;
    if (!e->c->puts_ordered)
        return settle_writes(e, -1);
    /* The provider orders write after write (tx and rx msg_order FI_ORDER_WAW or
     * FI_ORDER_RMA_WAW): a later put lands after the earlier ones, a later AMO or get waits
     * for them itself (see above); only the AMOs need to be complete. */
    int rc = flush_injects(e, -1);
    return rc ? rc : wait_zero(e, &e->amos);
}


int vko_quiet(vko_ep *e) {
    if (!e->ep)
        return VK_ST_CLOSED;
    int rc = flush_injects(e, -1);
    if (!rc)
        rc = wait_zero(e, &e->outstanding);
    int first = __atomic_exchange_n(&e->first_err, 0, __ATOMIC_ACQ_REL);
    return rc ? rc : first;
}
