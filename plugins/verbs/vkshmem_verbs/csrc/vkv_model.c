/* vkshmem-verbs: a software loopback model of an RDMA provider, for the tests of machines
 * without a device. Included by vkv.c.
 *
 * It is NOT a NIC. It fills the two entries of the ibv_context ops table that the data path
 * calls through libibverbs' inline functions (ibv_post_send, ibv_poll_cq), so vkv_put/get/amo/
 * quiet run unchanged: each posted WR is executed at once on this process's memory (the
 * remote address is a pointer here: every "PE" of a test lives in one process), checked first
 * (opcode, one SGE, lkey of a registration or the staging area, rkey of a registration
 * covering the remote range, 8-byte alignment of atomics), and its completion queued. What it
 * cannot show: the wire, a NIC's ordering and atomicity, real registration, QP state
 * transitions (vkv_qp_connect only records the RTR/RTS attributes it would apply).
 *
 * Registrations are a table shared by every model device of the process (so one PE's model
 * can check the rkey of another's memory). */

#define VKV_MODEL_MRS 256
#define VKV_MODEL_CQ 65536

struct vkv_model {
    struct ibv_context ctx;
    struct ibv_cq cq;
    struct ibv_wc *queue;
    uint32_t head, tail;
    int hold;               /* completions are queued but not returned (a stuck peer) */
    int fail_next;          /* the next WR completes with IBV_WC_REM_ACCESS_ERR */
    uint64_t fences, inlines, last_dest_qpn;
    struct ibv_mr staging_mr;
};

static struct {
    pthread_mutex_t lock;
    struct ibv_mr mrs[VKV_MODEL_MRS];
    int used[VKV_MODEL_MRS];
    uint32_t next_key;
} model_mrs = {PTHREAD_MUTEX_INITIALIZER, {{0}}, {0}, 0x100};

static int model_key_ok(uint32_t key, uint64_t addr, uint64_t len, int remote)
{
    int ok = 0;
    pthread_mutex_lock(&model_mrs.lock);
    for (int i = 0; i < VKV_MODEL_MRS && !ok; i++) {
        struct ibv_mr *m = &model_mrs.mrs[i];
        uintptr_t lo = (uintptr_t)m->addr;
        ok = model_mrs.used[i] && (remote ? m->rkey : m->lkey) == key && addr >= lo &&
             addr + len <= lo + m->length;
    }
    pthread_mutex_unlock(&model_mrs.lock);
    return ok;
}

static void model_complete(struct vkv_model *m, struct ibv_send_wr *wr, int status)
{
    struct ibv_wc *wc = &m->queue[m->tail++ % VKV_MODEL_CQ];
    memset(wc, 0, sizeof *wc);
    wc->wr_id = wr->wr_id;
    wc->status = (enum ibv_wc_status)status;
}

static int model_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct vkv_model *m = (struct vkv_model *)qp->context;
    for (; wr; wr = wr->next) {
        struct ibv_sge *s = wr->sg_list;
        int atomic = wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
                     wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
        uint64_t raddr = atomic ? wr->wr.atomic.remote_addr : wr->wr.rdma.remote_addr;
        uint32_t rkey = atomic ? wr->wr.atomic.rkey : wr->wr.rdma.rkey;
        int inl = wr->opcode == IBV_WR_RDMA_WRITE && (wr->send_flags & IBV_SEND_INLINE);
        if (wr->num_sge != 1 || !(wr->send_flags & IBV_SEND_SIGNALED) ||
            (atomic ? s->length != 8 || (raddr & 7) : wr->opcode != IBV_WR_RDMA_WRITE &&
                                                      wr->opcode != IBV_WR_RDMA_READ)) {
            *bad = wr;
            return EINVAL;
        }
        m->fences += !!(wr->send_flags & IBV_SEND_FENCE);
        m->inlines += inl;
        int status = IBV_WC_SUCCESS;
        if (m->fail_next) {
            m->fail_next = 0;
            status = IBV_WC_REM_ACCESS_ERR;
        } else if (!model_key_ok(rkey, raddr, s->length, 1)) {
            status = IBV_WC_REM_ACCESS_ERR;
        } else if (!inl && !model_key_ok(s->lkey, s->addr, s->length, 0) &&
                   !(s->lkey == m->staging_mr.lkey && s->addr >= (uintptr_t)m->staging_mr.addr
                     && s->addr + s->length <= (uintptr_t)m->staging_mr.addr +
                                               m->staging_mr.length)) {
            status = IBV_WC_LOC_PROT_ERR;
        } else if (wr->opcode == IBV_WR_RDMA_WRITE) {
            memcpy((void *)(uintptr_t)raddr, (void *)(uintptr_t)s->addr, s->length);
        } else if (wr->opcode == IBV_WR_RDMA_READ) {
            memcpy((void *)(uintptr_t)s->addr, (void *)(uintptr_t)raddr, s->length);
        } else {
            uint64_t *w = (uint64_t *)(uintptr_t)raddr, old;
            vkv_cpu_nic(w, wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? VKV_PLAN_FAA
                        : VKV_PLAN_CAS, wr->wr.atomic.compare_add, wr->wr.atomic.swap, &old);
            memcpy((void *)(uintptr_t)s->addr, &old, 8);
        }
        model_complete(m, wr, status);
    }
    return 0;
}

static int model_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    struct vkv_model *m = (struct vkv_model *)cq->context;
    int got = 0;
    while (!m->hold && got < n && m->head != m->tail)
        wc[got++] = m->queue[m->head++ % VKV_MODEL_CQ];
    return got;
}

vkv_dev *vkv_open_model(int depth, int max_inline, uint32_t staging_slot,
                        uint32_t staging_slots)
{
    vkv_dev *d = calloc(1, sizeof *d);
    struct vkv_model *m = calloc(1, sizeof *m);
    size_t bytes = 64 + (size_t)staging_slot * staging_slots;
    if (!d || !m || !(m->queue = calloc(VKV_MODEL_CQ, sizeof *m->queue)) ||
        !(d->slots = calloc(staging_slots, sizeof *d->slots)) ||
        posix_memalign((void **)&d->staging, 4096, bytes)) {
        if (m)
            free(m->queue);
        free(m);
        if (d)
            free(d->slots);
        free(d);
        return NULL;
    }
    pthread_mutex_init(&d->lock, NULL);
    m->ctx.ops.post_send = model_post_send;
    m->ctx.ops.poll_cq = model_poll_cq;
    m->cq.context = &m->ctx;
    m->staging_mr.lkey = 0x5e;
    m->staging_mr.addr = d->staging;
    m->staging_mr.length = bytes;
    d->model = m;
    d->ctx = &m->ctx;
    d->cq = &m->cq;
    d->staging_mr = &m->staging_mr;
    d->depth = depth;
    d->max_inline = max_inline;
    d->slot = staging_slot;
    d->nslots = staging_slots;
    d->port.atomic_cap = IBV_ATOMIC_HCA;
    d->port.lid = 1;
    d->port.port = 1;
    d->port.link_layer = IBV_LINK_LAYER_INFINIBAND;
    d->port.state = IBV_PORT_ACTIVE;
    d->port.active_mtu = IBV_MTU_4096;
    d->port.max_qp_rd_atom = 16;
    return d;
}

/* knobs and counters of a model device: out4 = fences, inline WRs, last RTR dest QPN,
 * completions queued but not yet polled; hold/fail_next set where >= 0 */
void vkv_model_control(vkv_dev *d, int hold, int fail_next, uint64_t *out4)
{
    struct vkv_model *m = d->model;
    pthread_mutex_lock(&d->lock);
    if (hold >= 0)
        m->hold = hold;
    if (fail_next >= 0)
        m->fail_next = fail_next;
    out4[0] = m->fences;
    out4[1] = m->inlines;
    out4[2] = m->last_dest_qpn;
    out4[3] = m->tail - m->head;
    pthread_mutex_unlock(&d->lock);
}

static struct ibv_qp *model_qp_new(vkv_dev *d)
{
    static uint32_t next_qpn = 0x40;
    struct ibv_qp *qp = calloc(1, sizeof *qp);
    if (!qp || !(qp->qp_context = calloc(1, sizeof(int)))) {
        free(qp);
        return NULL;
    }
    qp->context = d->ctx;
    qp->qp_num = __atomic_fetch_add(&next_qpn, 1, __ATOMIC_RELAXED);
    return qp;
}

static struct ibv_mr *model_reg(void *addr, size_t len)
{
    struct ibv_mr *mr = NULL;
    pthread_mutex_lock(&model_mrs.lock);
    for (int i = 0; i < VKV_MODEL_MRS && !mr; i++)
        if (!model_mrs.used[i]) {
            model_mrs.used[i] = 1;
            mr = &model_mrs.mrs[i];
            mr->addr = addr;
            mr->length = len;
            mr->lkey = model_mrs.next_key++;
            mr->rkey = model_mrs.next_key++;
        }
    pthread_mutex_unlock(&model_mrs.lock);
    return mr;
}

static void model_dereg(struct ibv_mr *mr)
{
    pthread_mutex_lock(&model_mrs.lock);
    model_mrs.used[mr - model_mrs.mrs] = 0;
    pthread_mutex_unlock(&model_mrs.lock);
}

static void model_connected(vkv_dev *d, uint32_t dest_qpn)
{
    d->model->last_dest_qpn = dest_qpn;
}

static void model_close(vkv_dev *d)
{
    for (int i = 0; i < d->nmrs; i++)
        model_dereg(d->mrs[i].mr);
    free(d->model->queue);
    free(d->model);
}
