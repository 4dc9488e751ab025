/* vkshmem-ofi: the data path offered to vkshmem's compiled hot path (Transport.native_ops;
 * vkshmem/plugin.h). Included by vko.c.
 *
 * The core calls these for the default context's put/get/AMOs on the host heap (segment 0)
 * and for quiet/fence, instead of the Python methods: the same vko_put/vko_get/vko_amo/
 * vko_quiet/vko_fence, without Python and cffi in between. First, with the GIL held, as a
 * VK_NATIVE_TRY call, which does only what completes without waiting and keeps no pointer:
 *   put   up to VKO_BOUNCE bytes (copied into the request) posted at once;
 *   amo   a non-fetching native AMO (fi_inject_atomic or fi_atomicmsg with the operand in the
 *         request) while no put of this endpoint is in flight;
 *   quiet/fence  nothing outstanding (nothing to flush): a memory fence;
 * and VK_NATIVE_AGAIN, nothing done, for the rest (gets and fetching AMOs always wait for their
 * completion), which the core repeats as a blocking call with the GIL released.
 * Statuses are 0, VK_NATIVE_AGAIN/VK_NATIVE_PYTHON, or the negative VKO_E* / -FI_* codes the Python
 * methods turn into exceptions (OfiTransport.native_error). */

/* A put to this PE completes before it returns: the core applies AMOs on this PE's own words
 * with CPU atomics, which must see the put (as the Python amo's vko_settle_puts ensures). */
static int native_put(void *self, int32_t pe, uint32_t seg, uint64_t off, const void *src,
                      size_t n, int nbi) {
    vko_ep *e = self;
    vko_ctx *c = e->c;
    int try_ = nbi & VK_NATIVE_TRY;
    if (!e->ep)
        return VK_ST_CLOSED;
    if (try_ && pe == c->my_pe)
        return VK_NATIVE_AGAIN;
    __atomic_add_fetch(&c->n_native, 1, __ATOMIC_RELAXED);
    int rc = put_impl(e, pe, seg, off, src, n, 0, try_);
    if (rc == -FI_EAGAIN && try_)
        return VK_NATIVE_AGAIN;
    if (!rc && pe == c->my_pe)
        rc = vko_settle_puts(e);
    return rc;
}

static int native_get(void *self, int32_t pe, uint32_t seg, uint64_t off, void *dst, size_t n,
                      int nbi) {
    vko_ep *e = self;
    if (nbi & VK_NATIVE_TRY)
        return VK_NATIVE_AGAIN; /* a get waits for its completion */
    __atomic_add_fetch(&e->c->n_native, 1, __ATOMIC_RELAXED);
    return vko_get(e, pe, seg, off, dst, n, 0);
}

static int native_amo(void *self, int32_t pe, uint32_t seg, uint64_t off, int op, int width,
                      uint64_t operand, uint64_t compare, int fetch, uint64_t *result) {
    vko_ep *e = self;
    int try_ = fetch & VK_NATIVE_TRY;
    uint64_t out = 0;
    __atomic_add_fetch(&e->c->n_native, 1, __ATOMIC_RELAXED);
    int rc = amo_impl(e, pe, seg, off, op, width, operand, compare, fetch & 1, &out, try_);
    if (rc == -FI_EAGAIN && try_)
        return VK_NATIVE_AGAIN;
    *result = out;
    return rc;
}

/* Nothing this endpoint issued is outstanding (for a fence: nothing it must wait for), no
 * injected AMO awaits its flush and no error awaits its report. */
static int settled(vko_ep *e, int fence) {
    int64_t *count = !fence ? &e->outstanding
                     : e->c->puts_ordered ? &e->amos : &e->writes;
    if (__atomic_load_n(count, __ATOMIC_ACQUIRE) > 0 ||
        __atomic_load_n(&e->first_err, __ATOMIC_ACQUIRE))
        return 0;
    if (e->c->inject_amo)
        for (int32_t pe = 0; pe < e->c->n_pes; pe++)
            if (__atomic_load_n(&e->dirty[pe], __ATOMIC_ACQUIRE))
                return 0;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return 1;
}

static int native_quiet(void *self, int mode) {
    vko_ep *e = self;
    if (!e->ep)
        return VK_ST_CLOSED;
    if (__atomic_load_n(&e->py_held, __ATOMIC_ACQUIRE))
        return VK_NATIVE_PYTHON;
    __atomic_add_fetch(&e->c->n_native, 1, __ATOMIC_RELAXED);
    if (mode & VK_NATIVE_TRY)
        return settled(e, 0) ? 0 : VK_NATIVE_AGAIN;
    return vko_quiet(e);
}

static int native_fence(void *self, int mode) {
    vko_ep *e = self;
    if (!e->ep)
        return VK_ST_CLOSED;
    __atomic_add_fetch(&e->c->n_native, 1, __ATOMIC_RELAXED);
    if (mode & VK_NATIVE_TRY)
        return settled(e, 1) ? 0 : VK_NATIVE_AGAIN;
    return vko_fence(e);
}

/* A wait of the core stopped spinning (vk_watch, vkshmem/plugin.h): poke its wake
 * board after every CQ read from now on (vko.c: drain), and serve peers without the caller,
 * who no longer reads the CQ: a progress thread parked for the caller's loop of operations
 * (vko_progress.c: park) wakes and sleeps on the wait fd again. */
static void native_watch(void *self, struct vk_watch *w) {
    vko_ctx *c = ((vko_ep *)self)->c;
    __atomic_store_n(&c->watch, w, __ATOMIC_RELEASE);
    __atomic_store_n(&c->drive_short, 0, __ATOMIC_SEQ_CST); /* no loop now */
    if (__atomic_load_n(&c->parked, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&c->park_seq, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, &c->park_seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    }
}

/* The table; watch is offered where every peer's write and AMO landing here is applied by a
 * CQ read of this process (manual data progress: tcp;ofi_rxm, shm; not sockets, whose own
 * thread applies them). */
uintptr_t vko_native_ops(vko_ep *e) {
    int manual = e->c->info->domain_attr->data_progress == FI_PROGRESS_MANUAL;
    e->nops = (struct vk_native_ops){e, native_put, native_get, native_amo, native_quiet,
                                 native_fence, VK_NATIVE_CAN_TRY | (manual ? VK_NATIVE_CAN_WATCH : 0),
                                 native_watch};
    return (uintptr_t)&e->nops;
}

int *vko_held_flag(vko_ep *e) { return &e->py_held; }

uint64_t vko_native_calls(vko_ctx *c) { return __atomic_load_n(&c->n_native, __ATOMIC_RELAXED); }

void vko_set_self(vko_ctx *c, int32_t my_pe, uintptr_t liveness_words) {
    c->my_pe = my_pe;
    c->failed = (volatile uint64_t *)liveness_words;
}
