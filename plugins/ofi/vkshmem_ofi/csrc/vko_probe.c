/* vkshmem-ofi: timing the steps of the data path in C, without Python (vko_probe, for
 * tools/probe_ofi.py: where an operation's microseconds go). Included by vko.c. */

static int probe_step(vko_ep *e, int32_t pe, int what) {
    vko_ctx *c = e->c;
    uint64_t out = 0, one = 1;
    switch (what) {
    case 0:
        drain(c, e->cq);
        return 0;
    case 1:
        if (!c->rcntr)
            return -FI_ENOSYS;
        (void)(fi_cntr_read(c->rcntr) + fi_cntr_readerr(c->rcntr));
        return 0;
    case 2: {
        int rc = put_impl(e, pe, 0, 0, &one, 8, 0, 0);
        return rc ? rc : vko_quiet(e);
    }
    case 3:
        return put_impl(e, pe, 0, 0, &one, 8, 0, 0);
    case 4:
        return vko_get(e, pe, 0, 0, &out, 8, 0);
    case 5:
        return amo_impl(e, pe, 0, 0, VK_ADD, 8, 1, 0, 1, &out, 0);
    case 6: {
        int rc = amo_impl(e, pe, 0, 0, VK_ADD, 8, 1, 0, 0, &out, 0);
        return rc ? rc : vko_quiet(e);
    }
    }
    return VK_ST_AMO;
}

int vko_probe(vko_ep *e, int32_t pe, int what, int n, uint64_t *out) {
    vko_ctx *c = e->c;
    if (!e->ep)
        return VK_ST_CLOSED;
    uint64_t polls = __atomic_load_n(&e->n_polls, __ATOMIC_RELAXED);
    uint64_t rounds = __atomic_load_n(&c->n_rounds, __ATOMIC_RELAXED);
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
        int rc = probe_step(e, pe, what);
        if (rc)
            return rc;
    }
    out[0] = now_ns() - t0;
    out[1] = __atomic_load_n(&e->n_polls, __ATOMIC_RELAXED) - polls;
    out[2] = __atomic_load_n(&c->n_rounds, __ATOMIC_RELAXED) - rounds;
    return vko_quiet(e);
}
