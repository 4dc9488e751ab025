/* vkshmem-ucx native helper, continued: the start-up self-test and the core's compiled hot path (one translation unit with vku.c: the
 * build concatenates vku.c, vku_ctx.c, vku_worker.c, vku_ops.c and vku_native.c). */

/* -- the start-up self-test --------------------------------------------------------------- */

int vku_selftest(vku_ctx *c, uint32_t *bad_mask, char *err, size_t errlen)
{
    /* Worker a applies each op to memory reached through worker b (UCX's shared memory or
     * network transports between workers) and through a itself (UCX's "self" transport, where
     * 1.13.1 writes wrong values for fetching AND/OR/XOR). */
    static const int ops[3] = {VK_AND, VK_OR, VK_XOR};
    static const uint64_t old8 = 0xF0F0A5A5C3C3FF00ull, arg8 = 0x0FF0FF0033CC0F0Full;
    *bad_mask = 0;
    vku_worker *a = vku_worker_create(c, 2, err, errlen);
    vku_worker *b = a ? vku_worker_create(c, 1, err, errlen) : NULL;
    uint64_t *mem = aligned_alloc(64, 4096);
    int rc = (a && b && mem) ? 0 : VK_ST_NOMEM;
    char blob[VKU_RKEY_MAX];
    size_t len = sizeof(blob);
    if (rc == 0) {
        memset(mem, 0, 4096);
        rc = vku_worker_address(b, blob, &len);
        if (rc == 0)
            rc = vku_peer_set(a, 0, blob, len);
        len = sizeof(blob);
        if (rc == 0)
            rc = vku_worker_address(a, blob, &len);
        if (rc == 0)
            rc = vku_peer_set(a, 1, blob, len);
        len = sizeof(blob);
        int no = 0;
        if (rc == 0)
            rc = vku_mem_map(c, (uintptr_t)mem, 4096, -1, 0, &no, blob, &len);
        for (int32_t pe = 0; rc == 0 && pe < 2; pe++)
            rc = vku_peer_seg(a, pe, 0, (uint64_t)(uintptr_t)mem, 4096, 0, blob, len);
        if (rc)
            set_err(err, errlen, "set-up: %s", vku_status_string(rc));
    }
    for (int32_t pe = 0; rc == 0 && pe < 2; pe++) {
        for (int width = 4; rc == 0 && width <= 8; width += 4) {
            uint64_t mask = width == 4 ? 0xFFFFFFFFull : ~0ull;
            for (int i = 0; rc == 0 && i < 3; i++) {
                for (int fetch = 0; rc == 0 && fetch < 2; fetch++) {
                    int op = ops[i];
                    size_t slot = (size_t)(32 * pe + 8 * (width / 4 - 1) + 2 * i + fetch);
                    uint64_t old = old8 & mask, arg = arg8 & mask, got = ~0ull;
                    if (width == 4)
                        ((uint32_t *)mem)[2 * slot] = (uint32_t)old;
                    else
                        mem[slot] = old;
                    vku_peer *p;
                    ucp_rkey_h rkey;
                    uint64_t raddr;
                    pthread_mutex_lock(&a->lock);
                    rc = target(a, pe, 0, slot * 8, (uint64_t)width, &p, &rkey, &raddr,
                                NULL);
                    if (rc == 0)
                        rc = amo_locked(a, p, rkey, raddr, op, width, arg, 0, fetch, 0, &got);
                    pthread_mutex_unlock(&a->lock);
                    if (rc == 0 && !fetch)
                        rc = vku_quiet(a);
                    if (rc) {
                        set_err(err, errlen, "op %d width %d: %s", op, width,
                                vku_status_string(rc));
                        break;
                    }
                    uint64_t now = width == 4 ? ((uint32_t *)mem)[2 * slot] : mem[slot];
                    if (now != apply(op, old, arg, mask) || (fetch && got != old))
                        *bad_mask |= 1u << (op + (fetch ? 0 : VKU_EMU_NONFETCH));
                }
            }
        }
    }
    if (a) /* first: its endpoints to b close while b is still served */
        vku_worker_destroy(a, 1);
    if (b)
        vku_worker_destroy(b, 1);
    if (mem) {
        pthread_mutex_lock(&c->mem_lock);
        for (int i = 0; i < c->nlocal; i++) {
            if (c->locals[i].addr == (uintptr_t)mem) {
                unmap_local(c, &c->locals[i]);
                c->locals[i] = c->locals[--c->nlocal];
                break;
            }
        }
        pthread_mutex_unlock(&c->mem_lock);
        free(mem);
    }
    return rc;
}

/* -- the core's compiled hot path (struct vk_native_ops) ------------------------------------ */

static int native_put(void *w, int32_t pe, uint32_t seg, uint64_t off, const void *src,
                      size_t n, int nbi) {
    return vku_put(w, pe, seg, off, src, n, nbi);
}

static int native_get(void *w, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n,
                      int nbi) {
    return vku_get(w, pe, seg, off, dst, n, nbi);
}

static int native_amo(void *w, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
                      uint64_t operand, uint64_t compare, int fetch, uint64_t *result) {
    return vku_amo(w, pe, seg, off, op, width, operand, compare, fetch, result);
}

/* A try-quiet or try-fence: done (a memory fence) when the worker has nothing to flush or
 * order, else VK_NATIVE_AGAIN (also while another thread holds the worker). */
static int try_settled(vku_worker *w) {
    if (lock_worker(w, 1))
        return VK_NATIVE_AGAIN;
    int rc = settled(w) ? 0 : VK_NATIVE_AGAIN;
    pthread_mutex_unlock(&w->lock);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return rc;
}

/* VK_NATIVE_PYTHON ("call the Python quiet") while Python holds buffers it must release after the
 * flush */
static int native_quiet(void *w, int mode) {
    if (((vku_worker *)w)->py_held)
        return VK_NATIVE_PYTHON;
    return mode == VK_NATIVE_TRY ? try_settled(w) : vku_quiet(w);
}

static int native_fence(void *w, int mode) {
    return mode == VK_NATIVE_TRY ? try_settled(w) : vku_fence(w);
}

void vku_native_ops(vku_worker *w, struct vk_native_ops *ops) {
    ops->self = w;
    ops->put = native_put;
    ops->get = native_get;
    ops->amo = native_amo;
    ops->quiet = native_quiet;
    ops->fence = native_fence;
    ops->flags = VK_NATIVE_CAN_TRY;
}

int *vku_held_flag(vku_worker *w) { return &w->py_held; }
