/* vkshmem-verbs native helper: a small binding of libibverbs (rdma-core's infiniband/verbs.h).
 *
 * One vkv_dev per open transport (rail): the device context, a protection domain, one
 * completion queue shared by every QP, a registered staging area (copies of sources and
 * destinations that lie in no registered segment, and the 8-byte result of AMOs), and a
 * table of the local registrations (zero-copy where a buffer lies in one). One RC QP per peer
 * (this PE's own included: a QP connected to itself, so this PE's AMOs go through the NIC).
 *
 * Two kinds of functions:
 *  - pure ones (no device): the ibv_qp_attr of each QP transition, the ibv_send_wr of each
 *    operation, MTU codes, the AMO plan and the compare-and-swap emulation; the tests call
 *    them on every machine;
 *  - the ones that need a device: open, register, connect, post, poll; the data path also
 *    runs on a software loopback model of a provider (vkv_model.c, for the tests).
 *
 * Every data-path call holds the device's mutex (so the CQ has one reader at a time) and
 * waits at most timeout_ms. Return codes: 0 success, negative errno or vkshmem's VK_ST_*
 * status codes (vkshmem/plugin.h): VK_ST_TIMEDOUT (no completion within the timeout),
 * VK_ST_COMPLETION (a work completion reported an error: vkv_last_error), VK_ST_AMO (unknown
 * AMO op/width/offset, or the device has no atomics), VK_ST_CLOSED.
 */
#ifndef VKV_H
#define VKV_H

#include <stddef.h>
#include <stdint.h>

#include <vkshmem/plugin.h> /* VK_ST_*, the AMO op codes VK_FETCH..VK_XOR */

#define VKV_ERRLEN 256

/* How an AMO is carried (vkv_amo_plan): one NIC fetch-and-add, one NIC compare-and-swap, or a
 * loop of compare-and-swaps on the enclosing aligned 8 bytes. */
#define VKV_PLAN_FAA 1
#define VKV_PLAN_CAS 2
#define VKV_PLAN_LOOP 3

typedef struct vkv_dev vkv_dev;

/* What this PE's port is: the connection data carries it, stats() reports it. */
struct vkv_port {
    uint64_t max_mr_size;
    int32_t gid_index;
    int32_t max_qp_rd_atom;
    int32_t atomic_cap;      /* IBV_ATOMIC_NONE / _HCA / _GLOB */
    uint16_t lid;
    uint8_t port;
    uint8_t link_layer;      /* IBV_LINK_LAYER_INFINIBAND / _ETHERNET */
    uint8_t state;           /* IBV_PORT_ACTIVE ... */
    uint8_t active_mtu;      /* IBV_MTU_256 .. IBV_MTU_4096 */
    uint8_t gid[16];
};

/* How one QP reaches its peer QP (built by the Python side from both ends' data). */
struct vkv_path {
    uint32_t qpn;            /* the peer's QP for us */
    uint32_t psn;            /* the peer's first PSN (our rq_psn) */
    uint32_t my_psn;         /* our first PSN (sq_psn) */
    uint32_t flow_label;
    uint16_t lid;
    uint8_t gid[16];
    uint8_t mtu;             /* IBV_MTU_*: min of both ends' and the option */
    uint8_t is_global;       /* GRH (RoCE always; IB across subnets or when gid_index set) */
    uint8_t sgid_index;
    uint8_t traffic_class;
    uint8_t hop_limit;
    uint8_t sl;
    uint8_t port;
    uint8_t timeout;         /* local ACK timeout exponent: 4.096 us * 2^timeout */
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint8_t rd_atomic;       /* outstanding RDMA reads/atomics, both directions */
    uint8_t min_rnr_timer;
};

/* The device's NIC atomics, as the emulation loop sees them: opcode VKV_PLAN_FAA adds
 * compare_add, VKV_PLAN_CAS swaps in swap where the word equals compare_add; both return the
 * word's old value in *old. 0 or a negative error. */
typedef int (*vkv_nic_fn)(void *ctx, int plan, uint64_t compare_add, uint64_t swap,
                          uint64_t *old);

/* -- pure functions (no device) ------------------------------------------------------------ */
int vkv_mtu_code(int bytes);            /* 256..4096 -> IBV_MTU_*, else 0 */
int vkv_mtu_bytes(int code);            /* IBV_MTU_* -> bytes, else 0 */
void vkv_init_attr(struct ibv_qp_attr *a, int *mask, int port);
void vkv_rtr_attr(struct ibv_qp_attr *a, int *mask, const struct vkv_path *p);
void vkv_rts_attr(struct ibv_qp_attr *a, int *mask, const struct vkv_path *p);
/* RDMA WRITE/READ (opcode IBV_WR_RDMA_*) of len bytes between local laddr and remote raddr. */
void vkv_wr_rdma(struct ibv_send_wr *wr, struct ibv_sge *sge, int opcode, uint64_t wr_id,
                 uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                 unsigned int flags);
/* IBV_WR_ATOMIC_FETCH_AND_ADD / _CMP_AND_SWP on the 8 bytes at raddr; the old value lands in
 * the 8 bytes at result (lkey). */
void vkv_wr_atomic(struct ibv_send_wr *wr, struct ibv_sge *sge, int opcode, uint64_t wr_id,
                   uint64_t result, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                   uint64_t compare_add, uint64_t swap, unsigned int flags);
/* union ibv_send_wr.wr, read back (for the tests) */
uint64_t vkv_wr_remote_addr(const struct ibv_send_wr *wr, int atomic);
uint32_t vkv_wr_rkey(const struct ibv_send_wr *wr, int atomic);
uint64_t vkv_wr_compare_add(const struct ibv_send_wr *wr);
uint64_t vkv_wr_swap(const struct ibv_send_wr *wr);
/* The plan of op on a width-byte word at bit shift (0 or 32 for width 4) of its enclosing
 * 8 bytes; for FAA/CAS, the NIC operands. */
int vkv_amo_plan(int op, int width, int shift, uint64_t operand, uint64_t compare,
                 uint64_t *compare_add, uint64_t *swap);
/* The enclosing 8 bytes after op, from their value word; the sub-word's old value in *old. */
uint64_t vkv_amo_apply(int op, int width, int shift, uint64_t word, uint64_t operand,
                       uint64_t compare, uint64_t *old);
/* Carry op with nic (one FAA/CAS, or a compare-and-swap loop): the old value in *result. */
int vkv_amo_run(vkv_nic_fn nic, void *ctx, int op, int width, int shift, uint64_t operand,
                uint64_t compare, uint64_t *result);
/* A NIC model for the tests: FAA/CAS with CPU atomics on the 8 bytes at ctx. */
int vkv_cpu_nic(void *ctx, int plan, uint64_t compare_add, uint64_t swap, uint64_t *old);
void *vkv_cpu_nic_address(void);

/* -- the device ------------------------------------------------------------------------------ */
/* The RDMA devices libibverbs lists, '\n'-separated in out; their count, or -errno. */
int vkv_device_names(char *out, size_t cap);
vkv_dev *vkv_open(const char *name, int port, int gid_index, int depth, int max_inline,
                  uint32_t staging_slot, uint32_t staging_slots, char *err);
int vkv_query(vkv_dev *d, struct vkv_port *out);
void vkv_close(vkv_dev *d);
const char *vkv_last_error(vkv_dev *d);
void vkv_stats(vkv_dev *d, uint64_t *out4); /* posted, completed, staged bytes, cas retries */
/* A new RC QP in RESET; connect moves it through INIT, RTR, RTS. */
struct ibv_qp *vkv_qp_new(vkv_dev *d, char *err);
uint32_t vkv_qp_num(struct ibv_qp *qp);
int vkv_qp_connect(vkv_dev *d, struct ibv_qp *qp, const struct vkv_path *p, char *err);
void vkv_qp_free(vkv_dev *d, struct ibv_qp *qp);
/* ibv_reg_mr of [addr, addr+len), or ibv_reg_dmabuf_mr of fd (offset 0, iova 0) if fd >= 0. */
struct ibv_mr *vkv_reg(vkv_dev *d, void *addr, size_t len, int dmabuf_fd, char *err);
uint32_t vkv_mr_rkey(struct ibv_mr *mr);
uint64_t vkv_mr_base(struct ibv_mr *mr, int dmabuf); /* remote address of the first byte */
void vkv_dereg(vkv_dev *d, struct ibv_mr *mr);

/* -- a software loopback model of a provider, for the tests (vkv_model.c: not a NIC) ---- */
vkv_dev *vkv_open_model(int depth, int max_inline, uint32_t staging_slot,
                        uint32_t staging_slots);
/* out4: fence flags seen, inline WRs, last RTR dest QPN, completions not yet polled; hold
 * (completions withheld) and fail_next (the next WR fails) are set where >= 0 */
void vkv_model_control(vkv_dev *d, int hold, int fail_next, uint64_t *out4);

/* -- the data path (every call takes the device's mutex) ------------------------------------- */
int vkv_put(vkv_dev *d, struct ibv_qp *qp, uint64_t raddr, uint32_t rkey, const void *src,
            size_t n, int nbi, int timeout_ms);
int vkv_get(vkv_dev *d, struct ibv_qp *qp, uint64_t raddr, uint32_t rkey, void *dst,
            size_t n, int timeout_ms);
int vkv_amo(vkv_dev *d, struct ibv_qp *qp, uint64_t raddr, uint32_t rkey, int op, int width,
            uint64_t operand, uint64_t compare, int timeout_ms, uint64_t *result);
void vkv_fence(vkv_dev *d, struct ibv_qp *qp); /* the next WR on qp carries IBV_SEND_FENCE */
int vkv_quiet(vkv_dev *d, int timeout_ms);

#endif
