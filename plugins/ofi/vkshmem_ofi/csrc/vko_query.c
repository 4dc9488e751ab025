/* vkshmem-ofi: the AMOs the provider offers (fi_*atomicvalid), what it granted, the settings
 * chosen after opening, the counters, the names of the return codes. Included by vko.c. */

static const enum fi_op FIOP[8] = {FI_ATOMIC_READ, FI_ATOMIC_WRITE, FI_ATOMIC_WRITE, FI_CSWAP,
                                   FI_SUM, FI_BAND, FI_BOR, FI_BXOR};

static uint32_t query_valid(struct fid_ep *ep) {
    uint32_t mask = 0;
    for (int w8 = 0; w8 < 2; w8++) {
        enum fi_datatype dt = w8 ? FI_UINT64 : FI_UINT32;
        for (int op = 0; op < 8; op++) {
            size_t n = 0;
            uint32_t bit = 1u << (op + (w8 ? VKO_AMO_W8 : 0));
            if (op == VK_CSWAP) {
                if (!fi_compare_atomicvalid(ep, dt, FI_CSWAP, &n) && n)
                    mask |= bit << VKO_AMO_FETCH;
                continue;
            }
            if (op != VK_FETCH && op != VK_SWAP && !fi_atomicvalid(ep, dt, FIOP[op], &n) && n)
                mask |= bit;
            n = 0;
            if (!fi_fetch_atomicvalid(ep, dt, FIOP[op], &n) && n)
                mask |= bit << VKO_AMO_FETCH;
        }
    }
    return mask;
}

const char *vko_provider(vko_ctx *c) { return c->info->fabric_attr->prov_name; }

void vko_info(vko_ctx *c, uint64_t *out) {
    out[0] = (uint64_t)c->info->domain_attr->mr_mode;
    out[1] = c->info->tx_attr->msg_order;
    out[2] = c->info->tx_attr->inject_size;
    out[3] = c->info->ep_attr->max_msg_size;
    out[4] = (uint64_t)(c->waitable ? (c->wait_fd >= 0 ? 2 : 1) : 0); /* fd, sread, poll */
    out[5] = c->info->caps;
}

uint32_t vko_amo_valid(vko_ctx *c) { return c->valid; }
void vko_set_emulation(vko_ctx *c, uint32_t mask) { c->emulate = mask; }
void vko_set_inject_amo(vko_ctx *c, int on) { c->inject_amo = on; }
void vko_set_busy_yield(vko_ctx *c, int on) {
    __atomic_store_n(&c->busy_yield, on, __ATOMIC_RELAXED);
}

void vko_stats(vko_ctx *c, uint64_t *out) {
    out[0] = __atomic_load_n(&c->n_done, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&c->n_err, __ATOMIC_RELAXED);
    out[2] = __atomic_load_n(&c->n_wakeups, __ATOMIC_RELAXED);
    out[3] = c->rcntr ? __atomic_load_n(&c->n_remote, __ATOMIC_RELAXED) : UINT64_MAX;
    out[4] = __atomic_load_n(&c->n_busy, __ATOMIC_RELAXED);
    out[5] = __atomic_load_n(&c->n_emulated, __ATOMIC_RELAXED);
    out[6] = __atomic_load_n(&c->n_rounds, __ATOMIC_RELAXED);
    out[7] = __atomic_load_n(&c->n_parks, __ATOMIC_RELAXED);
}

const char *vko_last_error(vko_ctx *c) { return c->lasterr; }

int vko_puts_ordered(vko_ctx *c) { return c->puts_ordered; }

void vko_set_fence_quiet(vko_ctx *c, int on) {
    uint64_t both = c->info->tx_attr->msg_order & c->info->rx_attr->msg_order;
    c->puts_ordered = !on && (both & (FI_ORDER_WAW | FI_ORDER_RMA_WAW)) != 0;
}

const char *vko_strerror(int rc) {
    switch (rc) {
    case VK_ST_PEER: return "the PE published no address";
    case VK_ST_SEG: return "no such segment";
    case VK_ST_BOUNDS: return "outside the segment";
    case VK_ST_ALIGN: return "misaligned AMO";
    case VK_ST_AMO: return "AMO not available";
    case VK_ST_CLOSED: return "closed";
    case VK_ST_NOMEM: return "out of memory";
    case VK_ST_TOOBIG: return "blob too big";
    case VK_ST_TIMEDOUT: return "timed out";
    case VK_ST_NODMABUF: return "libfabric built without FI_MR_DMABUF";
    case VK_ST_FAILED: return "a PE of the job failed";
    case VK_ST_RANDOM: return "getrandom(2) gave no random memory key";
    default: return fi_strerror(rc < 0 ? -rc : rc);
    }
}
