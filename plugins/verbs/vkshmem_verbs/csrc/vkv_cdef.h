/* The libibverbs declarations the cffi cdef needs besides vkv.h: the structs the pure
 * functions fill, as far as the tests read them ("...": the compiler fills in the rest and
 * checks every field named here against infiniband/verbs.h), and the constants. */
struct ibv_qp;
struct ibv_mr;
struct ibv_sge { uint64_t addr; uint32_t length; uint32_t lkey; };
struct ibv_send_wr { uint64_t wr_id; struct ibv_send_wr *next; struct ibv_sge *sg_list;
                     int num_sge; unsigned int send_flags; ...; };
union ibv_gid { uint8_t raw[16]; ...; };
struct ibv_global_route { union ibv_gid dgid; uint32_t flow_label; uint8_t sgid_index;
                          uint8_t hop_limit; uint8_t traffic_class; };
struct ibv_ah_attr { struct ibv_global_route grh; uint16_t dlid; uint8_t sl;
                     uint8_t src_path_bits; uint8_t static_rate; uint8_t is_global;
                     uint8_t port_num; };
struct ibv_qp_attr { uint32_t qkey; uint32_t rq_psn; uint32_t sq_psn; uint32_t dest_qp_num;
                     unsigned int qp_access_flags; struct ibv_ah_attr ah_attr;
                     uint16_t pkey_index; uint8_t max_rd_atomic; uint8_t max_dest_rd_atomic;
                     uint8_t min_rnr_timer; uint8_t port_num; uint8_t timeout;
                     uint8_t retry_cnt; uint8_t rnr_retry; ...; };
int vkv_wr_opcode(const struct ibv_send_wr *wr);
int vkv_attr_state(const struct ibv_qp_attr *a);
int vkv_attr_path_mtu(const struct ibv_qp_attr *a);
