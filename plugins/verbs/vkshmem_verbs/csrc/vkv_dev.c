/* vkshmem-verbs: the device, its QPs and registrations, and the data path. Included by vkv.c.
 * Where this was written (no RDMA device) only what needs none ran: vkv_device_names failing
 * (ENOSYS), and the software model's branches (d->model). */

#define VKV_MAX_MRS 64

/* the software model of vkv_model.c (tests only) */
struct vkv_model;
static struct ibv_qp *model_qp_new(vkv_dev *d);
static void model_connected(vkv_dev *d, uint32_t dest_qpn);
static struct ibv_mr *model_reg(void *addr, size_t len);
static void model_dereg(struct ibv_mr *mr);
static void model_close(vkv_dev *d);

struct vkv_req {
    volatile int done;
    int status;
};

struct vkv_slot { /* one piece of the staging area, reused once its WR completed */
    struct vkv_req req;
    int busy;
};

struct vkv_dev {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    pthread_mutex_t lock;
    struct vkv_port port;
    int depth, max_inline, outstanding, failed;
    uint8_t *staging;           /* amo result (64 bytes), then staging_slots * slot bytes */
    struct ibv_mr *staging_mr;
    uint32_t slot, nslots, next_slot;
    struct vkv_slot *slots;
    struct vkv_req sync;        /* the blocking operation in progress (see vkv_data.c) */
    uint64_t sync_seq;
    struct { uintptr_t lo, hi; uint32_t lkey; struct ibv_mr *mr; } mrs[VKV_MAX_MRS];
    int nmrs;
    uint64_t posted, completed, staged;
    char error[VKV_ERRLEN];
    struct vkv_model *model;    /* not NULL: a software model, no device (vkv_model.c) */
};

static void say(char *err, const char *what, int e)
{
    if (err)
        snprintf(err, VKV_ERRLEN, "%s: %s", what, strerror(e ? e : EIO));
}

int vkv_device_names(char *out, size_t cap)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list)
        return -(errno ? errno : ENODEV);
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        const char *name = ibv_get_device_name(list[i]);
        size_t len = strlen(name);
        if (used + len + 2 > cap)
            break;
        memcpy(out + used, name, len);
        used += len;
        out[used++] = '\n';
        out[used] = 0;
    }
    ibv_free_device_list(list);
    return n;
}

vkv_dev *vkv_open(const char *name, int port, int gid_index, int depth, int max_inline,
                  uint32_t staging_slot, uint32_t staging_slots, char *err)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list) {
        say(err, "ibv_get_device_list", errno);
        return NULL;
    }
    struct ibv_device *dev = NULL;
    for (int i = 0; i < n && !dev; i++)
        if (!strcmp(ibv_get_device_name(list[i]), name))
            dev = list[i];
    vkv_dev *d = calloc(1, sizeof *d);
    if (!dev || !d) {
        snprintf(err, VKV_ERRLEN, dev ? "out of memory" : "no RDMA device named %s", name);
        ibv_free_device_list(list);
        free(d);
        return NULL;
    }
    pthread_mutex_init(&d->lock, NULL);
    d->depth = depth;
    d->max_inline = max_inline;
    d->ctx = ibv_open_device(dev);
    ibv_free_device_list(list);
    if (!d->ctx) {
        say(err, "ibv_open_device", errno);
        goto fail;
    }
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    union ibv_gid gid;
    int rc = ibv_query_device(d->ctx, &da);
    if (rc) {
        say(err, "ibv_query_device", rc);
        goto fail;
    }
    rc = ibv_query_port(d->ctx, (uint8_t)port, &pa);
    if (rc) {
        snprintf(err, VKV_ERRLEN, "ibv_query_port(%d): %s (the device has %d ports)", port,
                 strerror(rc), da.phys_port_cnt);
        goto fail;
    }
    memset(&gid, 0, sizeof gid);
    if ((gid_index >= 0 || pa.link_layer == IBV_LINK_LAYER_ETHERNET) &&
        (rc = ibv_query_gid(d->ctx, (uint8_t)port, gid_index < 0 ? 0 : gid_index, &gid))) {
        snprintf(err, VKV_ERRLEN, "ibv_query_gid(port %d, index %d): %s (the port has %d GIDs)",
                 port, gid_index, strerror(rc ? rc : EINVAL), pa.gid_tbl_len);
        goto fail;
    }
    d->port.max_mr_size = da.max_mr_size;
    d->port.gid_index = gid_index < 0 ? 0 : gid_index;
    d->port.max_qp_rd_atom = da.max_qp_rd_atom;
    d->port.atomic_cap = da.atomic_cap;
    d->port.lid = pa.lid;
    d->port.port = (uint8_t)port;
    d->port.link_layer = pa.link_layer;
    d->port.state = pa.state;
    d->port.active_mtu = pa.active_mtu;
    memcpy(d->port.gid, gid.raw, 16);
    if (!(d->pd = ibv_alloc_pd(d->ctx))) {
        say(err, "ibv_alloc_pd", errno);
        goto fail;
    }
    if (!(d->cq = ibv_create_cq(d->ctx, depth * 2, NULL, NULL, 0))) {
        say(err, "ibv_create_cq", errno);
        goto fail;
    }
    d->slot = staging_slot;
    d->nslots = staging_slots;
    size_t bytes = 64 + (size_t)staging_slot * staging_slots;
    d->slots = calloc(staging_slots, sizeof *d->slots);
    if (!d->slots || posix_memalign((void **)&d->staging, 4096, bytes)) {
        snprintf(err, VKV_ERRLEN, "out of memory for %zu staging bytes", bytes);
        goto fail;
    }
    if (!(d->staging_mr = ibv_reg_mr(d->pd, d->staging, bytes, IBV_ACCESS_LOCAL_WRITE))) {
        say(err, "ibv_reg_mr (staging area)", errno);
        goto fail;
    }
    return d;
fail:
    vkv_close(d);
    return NULL;
}

int vkv_query(vkv_dev *d, struct vkv_port *out)
{
    *out = d->port;
    return 0;
}

const char *vkv_last_error(vkv_dev *d) { return d->error; }

void vkv_stats(vkv_dev *d, uint64_t *out4)
{
    out4[0] = d->posted;
    out4[1] = d->completed;
    out4[2] = d->staged;
    out4[3] = (uint64_t)d->outstanding;
}

void vkv_close(vkv_dev *d)
{
    if (!d)
        return;
    if (d->model) {
        model_close(d);
    } else {
        for (int i = 0; i < d->nmrs; i++)
            if (d->mrs[i].mr)
                ibv_dereg_mr(d->mrs[i].mr);
        if (d->staging_mr)
            ibv_dereg_mr(d->staging_mr);
        if (d->cq)
            ibv_destroy_cq(d->cq);
        if (d->pd)
            ibv_dealloc_pd(d->pd);
        if (d->ctx)
            ibv_close_device(d->ctx);
    }
    free(d->staging);
    free(d->slots);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

struct ibv_qp *vkv_qp_new(vkv_dev *d, char *err)
{
    if (d->model) {
        struct ibv_qp *qp = model_qp_new(d);
        if (!qp)
            snprintf(err, VKV_ERRLEN, "out of memory");
        return qp;
    }
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = d->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = (uint32_t)d->depth;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = (uint32_t)d->max_inline;
    ia.qp_context = calloc(1, sizeof(int)); /* the pending-fence flag */
    struct ibv_qp *qp = ia.qp_context ? ibv_create_qp(d->pd, &ia) : NULL;
    if (!qp) {
        say(err, "ibv_create_qp (check the depth and max_inline options)", errno);
        free(ia.qp_context);
    }
    return qp;
}

uint32_t vkv_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

int vkv_qp_connect(vkv_dev *d, struct ibv_qp *qp, const struct vkv_path *p, char *err)
{
    struct ibv_qp_attr a;
    int mask, rc;
    if (d->model) { /* builds what a device would get, applies nothing */
        vkv_init_attr(&a, &mask, p->port);
        vkv_rtr_attr(&a, &mask, p);
        model_connected(d, a.dest_qp_num);
        vkv_rts_attr(&a, &mask, p);
        return 0;
    }
    vkv_init_attr(&a, &mask, p->port);
    if ((rc = ibv_modify_qp(qp, &a, mask))) {
        say(err, "ibv_modify_qp to INIT", rc);
        return -rc;
    }
    vkv_rtr_attr(&a, &mask, p);
    if ((rc = ibv_modify_qp(qp, &a, mask))) {
        say(err, "ibv_modify_qp to RTR (check the port, gid_index and MTU)", rc);
        return -rc;
    }
    vkv_rts_attr(&a, &mask, p);
    if ((rc = ibv_modify_qp(qp, &a, mask))) {
        say(err, "ibv_modify_qp to RTS", rc);
        return -rc;
    }
    return 0;
}

void vkv_qp_free(vkv_dev *d, struct ibv_qp *qp)
{
    void *fence = qp->qp_context;
    if (d->model)
        free(qp);
    else
        ibv_destroy_qp(qp);
    free(fence);
}

struct ibv_mr *vkv_reg(vkv_dev *d, void *addr, size_t len, int dmabuf_fd, char *err)
{
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                 IBV_ACCESS_REMOTE_ATOMIC;
    if (d->nmrs == VKV_MAX_MRS) {
        snprintf(err, VKV_ERRLEN, "more than %d registrations", VKV_MAX_MRS);
        return NULL;
    }
    struct ibv_mr *mr = d->model ? (dmabuf_fd >= 0 ? (errno = ENOTSUP, NULL)
                                                    : model_reg(addr, len))
                        : dmabuf_fd >= 0 ? ibv_reg_dmabuf_mr(d->pd, 0, len, 0, dmabuf_fd, access)
                        : ibv_reg_mr(d->pd, addr, len, access);
    if (!mr) {
        say(err, dmabuf_fd >= 0 ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr", errno);
        return NULL;
    }
    pthread_mutex_lock(&d->lock);
    d->mrs[d->nmrs].lo = dmabuf_fd >= 0 ? 0 : (uintptr_t)addr; /* device memory: no zero-copy */
    d->mrs[d->nmrs].hi = dmabuf_fd >= 0 ? 0 : (uintptr_t)addr + len;
    d->mrs[d->nmrs].lkey = mr->lkey;
    d->mrs[d->nmrs++].mr = mr;
    pthread_mutex_unlock(&d->lock);
    return mr;
}

uint32_t vkv_mr_rkey(struct ibv_mr *mr) { return mr->rkey; }
uint64_t vkv_mr_base(struct ibv_mr *mr, int dmabuf) { return dmabuf ? 0 : (uintptr_t)mr->addr; }

void vkv_dereg(vkv_dev *d, struct ibv_mr *mr)
{
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->nmrs; i++)
        if (d->mrs[i].mr == mr) {
            d->mrs[i] = d->mrs[--d->nmrs];
            break;
        }
    pthread_mutex_unlock(&d->lock);
    if (d->model)
        model_dereg(mr);
    else
        ibv_dereg_mr(mr);
}
