/* vkshmem-verbs: the parts that need no device (QP attributes, work requests, AMO plans and
 * the compare-and-swap emulation). Included by vkv.c. */

int vkv_mtu_code(int bytes)
{
    switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default: return 0;
    }
}

int vkv_mtu_bytes(int code)
{
    return code >= IBV_MTU_256 && code <= IBV_MTU_4096 ? 128 << code : 0;
}

void vkv_init_attr(struct ibv_qp_attr *a, int *mask, int port)
{
    memset(a, 0, sizeof *a);
    a->qp_state = IBV_QPS_INIT;
    a->pkey_index = 0;
    a->port_num = (uint8_t)port;
    a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                         IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

void vkv_rtr_attr(struct ibv_qp_attr *a, int *mask, const struct vkv_path *p)
{
    memset(a, 0, sizeof *a);
    a->qp_state = IBV_QPS_RTR;
    a->path_mtu = (enum ibv_mtu)p->mtu;
    a->dest_qp_num = p->qpn;
    a->rq_psn = p->psn;
    a->max_dest_rd_atomic = p->rd_atomic;
    a->min_rnr_timer = p->min_rnr_timer;
    a->ah_attr.dlid = p->lid;
    a->ah_attr.sl = p->sl;
    a->ah_attr.src_path_bits = 0;
    a->ah_attr.port_num = p->port;
    if (p->is_global) {
        a->ah_attr.is_global = 1;
        memcpy(a->ah_attr.grh.dgid.raw, p->gid, 16);
        a->ah_attr.grh.flow_label = p->flow_label;
        a->ah_attr.grh.sgid_index = p->sgid_index;
        a->ah_attr.grh.hop_limit = p->hop_limit;
        a->ah_attr.grh.traffic_class = p->traffic_class;
    }
    *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

void vkv_rts_attr(struct ibv_qp_attr *a, int *mask, const struct vkv_path *p)
{
    memset(a, 0, sizeof *a);
    a->qp_state = IBV_QPS_RTS;
    a->sq_psn = p->my_psn;
    a->timeout = p->timeout;
    a->retry_cnt = p->retry_cnt;
    a->rnr_retry = p->rnr_retry;
    a->max_rd_atomic = p->rd_atomic;
    *mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
}

/* The parts every WR of ours shares: one SGE, signaled or not per flags, no chain. */
static void wr_common(struct ibv_send_wr *wr, struct ibv_sge *sge, int opcode, uint64_t wr_id,
                      uint64_t laddr, uint32_t len, uint32_t lkey, unsigned int flags)
{
    memset(wr, 0, sizeof *wr);
    sge->addr = laddr;
    sge->length = len;
    sge->lkey = lkey;
    wr->wr_id = wr_id;
    wr->next = NULL;
    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->opcode = (enum ibv_wr_opcode)opcode;
    wr->send_flags = flags;
}

void vkv_wr_rdma(struct ibv_send_wr *wr, struct ibv_sge *sge, int opcode, uint64_t wr_id,
                 uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                 unsigned int flags)
{
    wr_common(wr, sge, opcode, wr_id, laddr, len, lkey, flags);
    wr->wr.rdma.remote_addr = raddr;
    wr->wr.rdma.rkey = rkey;
}

void vkv_wr_atomic(struct ibv_send_wr *wr, struct ibv_sge *sge, int opcode, uint64_t wr_id,
                   uint64_t result, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                   uint64_t compare_add, uint64_t swap, unsigned int flags)
{
    wr_common(wr, sge, opcode, wr_id, result, 8, lkey, flags);
    wr->wr.atomic.remote_addr = raddr;
    wr->wr.atomic.rkey = rkey;
    wr->wr.atomic.compare_add = compare_add;
    wr->wr.atomic.swap = opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? swap : 0;
}

uint64_t vkv_wr_remote_addr(const struct ibv_send_wr *wr, int atomic)
{
    return atomic ? wr->wr.atomic.remote_addr : wr->wr.rdma.remote_addr;
}

uint32_t vkv_wr_rkey(const struct ibv_send_wr *wr, int atomic)
{
    return atomic ? wr->wr.atomic.rkey : wr->wr.rdma.rkey;
}

uint64_t vkv_wr_compare_add(const struct ibv_send_wr *wr) { return wr->wr.atomic.compare_add; }
uint64_t vkv_wr_swap(const struct ibv_send_wr *wr) { return wr->wr.atomic.swap; }

static uint64_t width_mask(int width) { return width == 8 ? ~0ULL : 0xffffffffULL; }

int vkv_amo_plan(int op, int width, int shift, uint64_t operand, uint64_t compare,
                 uint64_t *compare_add, uint64_t *swap)
{
    if (op < VK_FETCH || op > VK_XOR || !(width == 8 ? shift == 0 :
                                          width == 4 && (shift == 0 || shift == 32)))
        return VK_ST_AMO;
    uint64_t m = width_mask(width);
    *compare_add = 0;
    *swap = 0;
    if (op == VK_FETCH)
        return VKV_PLAN_FAA; /* adding 0 reads the word atomically with every NIC atomic */
    if (width == 8 && op == VK_ADD) {
        *compare_add = operand;
        return VKV_PLAN_FAA;
    }
    if (width == 4 && shift == 32 && op == VK_ADD) {
        /* the upper half: a carry out of it leaves the 8 bytes, the lower half is untouched */
        *compare_add = (operand & m) << 32;
        return VKV_PLAN_FAA;
    }
    if (width == 8 && op == VK_CSWAP) {
        *compare_add = compare;
        *swap = operand;
        return VKV_PLAN_CAS;
    }
    return VKV_PLAN_LOOP; /* SET, SWAP, AND, OR, XOR; any 32-bit op but the above */
}

uint64_t vkv_amo_apply(int op, int width, int shift, uint64_t word, uint64_t operand,
                       uint64_t compare, uint64_t *old)
{
    uint64_t m = width_mask(width);
    uint64_t cur = (word >> shift) & m, v = operand & m, next = cur;
    switch (op) {
    case VK_FETCH: break;
    case VK_SET: case VK_SWAP: next = v; break;
    case VK_CSWAP: if (cur == (compare & m)) next = v; break;
    case VK_ADD: next = (cur + v) & m; break;
    case VK_AND: next = cur & v; break;
    case VK_OR: next = cur | v; break;
    case VK_XOR: next = cur ^ v; break;
    }
    *old = cur;
    return (word & ~(m << shift)) | (next << shift);
}

int vkv_amo_run(vkv_nic_fn nic, void *ctx, int op, int width, int shift, uint64_t operand,
                uint64_t compare, uint64_t *result)
{
    uint64_t ca, sw, got, old;
    int plan = vkv_amo_plan(op, width, shift, operand, compare, &ca, &sw);
    if (plan < 0)
        return plan;
    if (plan != VKV_PLAN_LOOP) {
        int rc = nic(ctx, plan, ca, sw, &got);
        if (rc)
            return rc;
        *result = (got >> shift) & width_mask(width);
        return 0;
    }
    /* the loop: read the 8 bytes atomically (fetch-and-add 0), compute the new 8 bytes, swap
     * them in where they still hold what was read; else retry with what the swap found */
    int rc = nic(ctx, VKV_PLAN_FAA, 0, 0, &got);
    for (long tries = 0; rc == 0; tries++) {
        uint64_t want = vkv_amo_apply(op, width, shift, got, operand, compare, &old);
        if (want == got) { /* nothing to write (a failed compare-swap, an AND with ones) */
            *result = old;
            return 0;
        }
        uint64_t seen;
        rc = nic(ctx, VKV_PLAN_CAS, got, want, &seen);
        if (rc == 0 && seen == got) {
            *result = old;
            return 0;
        }
        got = seen;
        if (tries > 1000000)
            return VK_ST_TIMEDOUT;
    }
    return rc;
}

int vkv_cpu_nic(void *ctx, int plan, uint64_t compare_add, uint64_t swap, uint64_t *old)
{
    uint64_t *w = (uint64_t *)ctx;
    if (plan == VKV_PLAN_FAA) {
        *old = __atomic_fetch_add(w, compare_add, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (plan == VKV_PLAN_CAS) {
        uint64_t expect = compare_add;
        __atomic_compare_exchange_n(w, &expect, swap, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        *old = expect;
        return 0;
    }
    return VK_ST_AMO;
}

void *vkv_cpu_nic_address(void) { return (void *)vkv_cpu_nic; }

int vkv_wr_opcode(const struct ibv_send_wr *wr) { return wr->opcode; }
int vkv_attr_state(const struct ibv_qp_attr *a) { return a->qp_state; }
int vkv_attr_path_mtu(const struct ibv_qp_attr *a) { return a->path_mtu; }
