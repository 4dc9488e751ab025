/* vkshmem-verbs: the data path (post, poll, put, get, AMOs, fence, quiet). Included by vkv.c.
 * The caller holds d->lock in every static function here. Every WR is signaled: the CQ's
 * completions count d->outstanding down (quiet waits for zero). A WR's wr_id is 0 (nothing
 * waits for it), a staging slot's request (heap memory that lives until vkv_close), or
 * SYNC_TAG | sequence number for the one blocking operation in progress (never a pointer to
 * the stack: a WR that timed out may still complete later, and then only a stale sequence
 * number arrives). Where this was written (no RDMA device) it ran only against the software
 * model of a provider (vkv_model.c). */

#define SYNC_TAG (1ULL << 63)

/* A fresh wr_id for the blocking operation about to be posted (d->sync waits for it). */
static uint64_t sync_id(vkv_dev *d)
{
    d->sync_seq = (d->sync_seq + 1) & ~SYNC_TAG;
    d->sync.done = 0;
    d->sync.status = 0;
    return SYNC_TAG | d->sync_seq;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int poll_cq(vkv_dev *d)
{
    struct ibv_wc wc[16];
    int n = ibv_poll_cq(d->cq, 16, wc);
    if (n < 0)
        return -EIO;
    for (int i = 0; i < n; i++) {
        d->outstanding--;
        d->completed++;
        if (wc[i].status != IBV_WC_SUCCESS && !d->failed) {
            d->failed = 1;
            snprintf(d->error, VKV_ERRLEN, "work completion %s (vendor error 0x%x, QP %u)",
                     ibv_wc_status_str(wc[i].status), wc[i].vendor_err, wc[i].qp_num);
        }
        uint64_t id = wc[i].wr_id;
        struct vkv_req *r = !(id & SYNC_TAG) ? (struct vkv_req *)(uintptr_t)id
                            : (id & ~SYNC_TAG) == d->sync_seq ? &d->sync : NULL;
        if (r) {
            r->status = wc[i].status;
            r->done = 1;
        }
    }
    return n;
}

/* Poll until cond(arg) holds (or timeout_ms passed). */
static int wait_for(vkv_dev *d, int (*cond)(vkv_dev *, void *), void *arg, int timeout_ms)
{
    double end = 0;
    for (unsigned spins = 0; !cond(d, arg); spins++) {
        int n = poll_cq(d);
        if (n < 0)
            return n;
        if (n == 0 && (spins & 1023) == 1023) {
            if (end == 0)
                end = now_ms() + timeout_ms;
            else if (now_ms() > end) {
                /* a WR may still complete later (into a staging slot reused by then): the
                 * rail refuses every later operation */
                d->failed = 1;
                snprintf(d->error, VKV_ERRLEN, "an earlier operation had no completion within "
                         "%d ms; this rail is unusable since", timeout_ms);
                return VK_ST_TIMEDOUT;
            }
            sched_yield();
        }
    }
    return 0;
}

static int req_done(vkv_dev *d, void *arg) { return ((struct vkv_req *)arg)->done; }
static int room(vkv_dev *d, void *arg) { return d->outstanding < d->depth; }
static int drained(vkv_dev *d, void *arg) { return d->outstanding == 0; }
static int slot_free(vkv_dev *d, void *arg)
{
    struct vkv_slot *s = arg;
    return !s->busy || s->req.done;
}

static int post(vkv_dev *d, struct ibv_qp *qp, struct ibv_send_wr *wr, int timeout_ms)
{
    int rc = wait_for(d, room, NULL, timeout_ms);
    if (rc)
        return rc;
    int *fence = qp->qp_context;
    if (*fence) {
        wr->send_flags |= IBV_SEND_FENCE;
        *fence = 0;
    }
    struct ibv_send_wr *bad = NULL;
    if ((rc = ibv_post_send(qp, wr, &bad))) {
        snprintf(d->error, VKV_ERRLEN, "ibv_post_send: %s", strerror(rc));
        return -rc;
    }
    d->outstanding++;
    d->posted++;
    return 0;
}

static int wait_req(vkv_dev *d, struct vkv_req *r, int timeout_ms)
{
    int rc = wait_for(d, req_done, r, timeout_ms);
    if (rc == 0 && r->status != IBV_WC_SUCCESS)
        rc = VK_ST_COMPLETION;
    return rc;
}

/* The lkey of a registered host range holding [p, p+n), or -1. */
static int64_t lkey_of(vkv_dev *d, const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < d->nmrs; i++)
        if (a >= d->mrs[i].lo && a + n <= d->mrs[i].hi)
            return d->mrs[i].lkey;
    return -1;
}

static struct vkv_slot *next_slot(vkv_dev *d, uint8_t **buf, int timeout_ms, int *rc)
{
    uint32_t i = d->next_slot;
    d->next_slot = (i + 1) % d->nslots;
    struct vkv_slot *s = &d->slots[i];
    if ((*rc = wait_for(d, slot_free, s, timeout_ms)))
        return NULL;
    s->busy = 1;
    s->req.done = 0;
    s->req.status = 0;
    *buf = d->staging + 64 + (size_t)i * d->slot;
    return s;
}

static int put_locked(vkv_dev *d, struct ibv_qp *qp, uint64_t raddr, uint32_t rkey,
                      const uint8_t *src, size_t n, int nbi, int timeout_ms)
{
    struct ibv_send_wr wr;
    struct ibv_sge sge;
    int rc;
    if (n <= (size_t)d->max_inline) { /* the NIC copies the data at post: reusable at once */
        vkv_wr_rdma(&wr, &sge, IBV_WR_RDMA_WRITE, nbi ? 0 : sync_id(d), (uintptr_t)src,
                    (uint32_t)n, 0, raddr, rkey, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
        if ((rc = post(d, qp, &wr, timeout_ms)))
            return rc;
        return nbi ? 0 : wait_req(d, &d->sync, timeout_ms);
    }
    int64_t lkey = lkey_of(d, src, n);
    if (lkey >= 0) { /* the source lies in a registered segment: no copy */
        vkv_wr_rdma(&wr, &sge, IBV_WR_RDMA_WRITE, nbi ? 0 : sync_id(d), (uintptr_t)src,
                    (uint32_t)n, (uint32_t)lkey, raddr, rkey, IBV_SEND_SIGNALED);
        if ((rc = post(d, qp, &wr, timeout_ms)))
            return rc;
        return nbi ? 0 : wait_req(d, &d->sync, timeout_ms);
    }
    struct vkv_slot *last = NULL;
    for (size_t done = 0; done < n;) { /* through the staging area, slot by slot */
        size_t piece = n - done < d->slot ? n - done : d->slot;
        uint8_t *buf;
        struct vkv_slot *s = next_slot(d, &buf, timeout_ms, &rc);
        if (!s)
            return rc;
        memcpy(buf, src + done, piece);
        vkv_wr_rdma(&wr, &sge, IBV_WR_RDMA_WRITE, (uintptr_t)&s->req, (uintptr_t)buf,
                    (uint32_t)piece, d->staging_mr->lkey, raddr + done, rkey,
                    IBV_SEND_SIGNALED);
        if ((rc = post(d, qp, &wr, timeout_ms))) {
            s->busy = 0;
            return rc;
        }
        d->staged += piece;
        done += piece;
        last = s;
    }
    /* a blocking put waits for its last piece (an RC QP completes WRITEs in order) */
    return nbi || !last ? 0 : wait_req(d, &last->req, timeout_ms);
}

int vkv_put(vkv_dev *d, struct ibv_qp *qp, uint64_t raddr, uint32_t rkey, const void *src,
            size_t n, int nbi, int timeout_ms)
{
    pthread_mutex_lock(&d->lock);
    int rc = d->failed ? VK_ST_COMPLETION : put_locked(d, qp, raddr, rkey, src, n, nbi, timeout_ms);
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static int get_locked(vkv_dev *d, struct ibv_qp *qp, uint64_t raddr, uint32_t rkey,
                      uint8_t *dst, size_t n, int timeout_ms)
{
    struct ibv_send_wr wr;
    struct ibv_sge sge;
    int rc;
    int64_t lkey = lkey_of(d, dst, n);
    if (lkey >= 0) {
        vkv_wr_rdma(&wr, &sge, IBV_WR_RDMA_READ, sync_id(d), (uintptr_t)dst, (uint32_t)n,
                    (uint32_t)lkey, raddr, rkey, IBV_SEND_SIGNALED);
        if ((rc = post(d, qp, &wr, timeout_ms)))
            return rc;
        return wait_req(d, &d->sync, timeout_ms);
    }
    for (size_t done = 0; done < n;) {
        size_t piece = n - done < d->slot ? n - done : d->slot;
        uint8_t *buf;
        struct vkv_slot *s = next_slot(d, &buf, timeout_ms, &rc);
        if (!s)
            return rc;
        vkv_wr_rdma(&wr, &sge, IBV_WR_RDMA_READ, (uintptr_t)&s->req, (uintptr_t)buf,
                    (uint32_t)piece, d->staging_mr->lkey, raddr + done, rkey,
                    IBV_SEND_SIGNALED);
        if ((rc = post(d, qp, &wr, timeout_ms)) || (rc = wait_req(d, &s->req, timeout_ms))) {
            s->busy = 0;
            return rc;
        }
        memcpy(dst + done, buf, piece);
        s->busy = 0;
        done += piece;
    }
    return 0;
}

int vkv_get(vkv_dev *d, struct ibv_qp *qp, uint64_t raddr, uint32_t rkey, void *dst,
            size_t n, int timeout_ms)
{
    pthread_mutex_lock(&d->lock);
    int rc = d->failed ? VK_ST_COMPLETION : get_locked(d, qp, raddr, rkey, dst, n, timeout_ms);
    pthread_mutex_unlock(&d->lock);
    return rc;
}

struct nic_call {
    vkv_dev *d;
    struct ibv_qp *qp;
    uint64_t raddr;
    uint32_t rkey;
    int timeout_ms;
};

/* One NIC atomic on the enclosing 8 bytes, waited for (vkv_nic_fn for vkv_amo_run). */
static int nic_atomic(void *ctx, int plan, uint64_t compare_add, uint64_t swap, uint64_t *old)
{
    struct nic_call *c = ctx;
    vkv_dev *d = c->d;
    struct ibv_send_wr wr;
    struct ibv_sge sge;
    uint64_t *result = (uint64_t *)d->staging;
    int opcode = plan == VKV_PLAN_FAA ? IBV_WR_ATOMIC_FETCH_AND_ADD : IBV_WR_ATOMIC_CMP_AND_SWP;
    vkv_wr_atomic(&wr, &sge, opcode, sync_id(d), (uintptr_t)result, d->staging_mr->lkey,
                  c->raddr, c->rkey, compare_add, swap, IBV_SEND_SIGNALED);
    int rc = post(d, c->qp, &wr, c->timeout_ms);
    if (rc == 0)
        rc = wait_req(d, &d->sync, c->timeout_ms);
    *old = *(volatile uint64_t *)result;
    return rc;
}

int vkv_amo(vkv_dev *d, struct ibv_qp *qp, uint64_t raddr, uint32_t rkey, int op, int width,
            uint64_t operand, uint64_t compare, int timeout_ms, uint64_t *result)
{
    /* little-endian: a 4-byte word at byte 4 of its 8 is their upper half */
    int shift = (int)(raddr & 7) * 8;
    struct nic_call c = {d, qp, raddr & ~(uint64_t)7, rkey, timeout_ms};
    pthread_mutex_lock(&d->lock);
    int rc = d->failed ? VK_ST_COMPLETION : d->port.atomic_cap == IBV_ATOMIC_NONE ? VK_ST_AMO
             : vkv_amo_run(nic_atomic, &c, op, width, shift, operand, compare, result);
    pthread_mutex_unlock(&d->lock);
    return rc;
}

void vkv_fence(vkv_dev *d, struct ibv_qp *qp)
{
    pthread_mutex_lock(&d->lock);
    *(int *)qp->qp_context = 1;
    pthread_mutex_unlock(&d->lock);
}

int vkv_quiet(vkv_dev *d, int timeout_ms)
{
    pthread_mutex_lock(&d->lock);
    int rc = wait_for(d, drained, NULL, timeout_ms);
    if (rc == 0 && d->failed)
        rc = VK_ST_COMPLETION;
    pthread_mutex_unlock(&d->lock);
    return rc;
}
