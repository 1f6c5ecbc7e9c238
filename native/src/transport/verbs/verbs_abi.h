/* Our own declarations of the part of the verbs ABI (rdma-core's libibverbs, Apple's
 * librdma) this transport uses, so that the build needs no rdma-core headers: only a C
 * compiler. Names carry a pt_ prefix so that they can sit beside rdma-core's own in one file:
 * tests/verbs_abi_check.c includes both and compares the size and offset of every struct and
 * field, and the value of every constant, declared here (tests/test_verbs_abi.py).
 *
 * Only the leading fields we read or write are given for the structs the library allocates
 * (context, device, pd, cq, mr, qp); the structs we allocate ourselves are complete. The
 * data-path calls (post_send, post_recv, poll_cq) are not exported functions: they go through
 * the context's ops, at the offsets below, as rdma-core's inline functions do. */
#ifndef PT_VERBS_ABI_H
#define PT_VERBS_ABI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct pt_ibv_device;   /* opaque: only passed back to the library */
struct pt_ibv_qp;
struct pt_ibv_cq;
struct pt_ibv_send_wr;
struct pt_ibv_recv_wr;
struct pt_ibv_wc;

/* ---- constants ---- */
enum { PT_IBV_ATOMIC_NONE = 0, PT_IBV_ATOMIC_HCA = 1, PT_IBV_ATOMIC_GLOB = 2 };
enum {
    PT_IBV_MTU_256 = 1, PT_IBV_MTU_512 = 2, PT_IBV_MTU_1024 = 3, PT_IBV_MTU_2048 = 4,
    PT_IBV_MTU_4096 = 5
};
enum { PT_IBV_PORT_DOWN = 1, PT_IBV_PORT_ACTIVE = 4 };
enum {
    PT_IBV_LINK_LAYER_UNSPECIFIED = 0, PT_IBV_LINK_LAYER_INFINIBAND = 1,
    PT_IBV_LINK_LAYER_ETHERNET = 2
};
enum { PT_IBV_GID_TYPE_IB = 0, PT_IBV_GID_TYPE_ROCE_V1 = 1, PT_IBV_GID_TYPE_ROCE_V2 = 2 };
enum {
    PT_IBV_WC_SUCCESS = 0, PT_IBV_WC_LOC_LEN_ERR = 1, PT_IBV_WC_LOC_QP_OP_ERR = 2,
    PT_IBV_WC_LOC_PROT_ERR = 4, PT_IBV_WC_WR_FLUSH_ERR = 5, PT_IBV_WC_REM_INV_REQ_ERR = 9,
    PT_IBV_WC_REM_ACCESS_ERR = 10, PT_IBV_WC_REM_OP_ERR = 11, PT_IBV_WC_RETRY_EXC_ERR = 12,
    PT_IBV_WC_RNR_RETRY_EXC_ERR = 13, PT_IBV_WC_GENERAL_ERR = 21
};
enum {
    PT_IBV_WC_SEND = 0, PT_IBV_WC_RDMA_WRITE = 1, PT_IBV_WC_RDMA_READ = 2,
    PT_IBV_WC_COMP_SWAP = 3, PT_IBV_WC_FETCH_ADD = 4, PT_IBV_WC_RECV = 1 << 7,
    PT_IBV_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1
};
enum { PT_IBV_WC_WITH_IMM = 1 << 1 };
enum {
    PT_IBV_ACCESS_LOCAL_WRITE = 1, PT_IBV_ACCESS_REMOTE_WRITE = 1 << 1,
    PT_IBV_ACCESS_REMOTE_READ = 1 << 2, PT_IBV_ACCESS_REMOTE_ATOMIC = 1 << 3
};
enum { PT_IBV_QPT_RC = 2, PT_IBV_QPT_UC = 3 };
enum {
    PT_IBV_QP_STATE = 1 << 0, PT_IBV_QP_ACCESS_FLAGS = 1 << 3, PT_IBV_QP_PKEY_INDEX = 1 << 4,
    PT_IBV_QP_PORT = 1 << 5, PT_IBV_QP_AV = 1 << 7, PT_IBV_QP_PATH_MTU = 1 << 8,
    PT_IBV_QP_TIMEOUT = 1 << 9, PT_IBV_QP_RETRY_CNT = 1 << 10, PT_IBV_QP_RNR_RETRY = 1 << 11,
    PT_IBV_QP_RQ_PSN = 1 << 12, PT_IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
    PT_IBV_QP_MIN_RNR_TIMER = 1 << 15, PT_IBV_QP_SQ_PSN = 1 << 16,
    PT_IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17, PT_IBV_QP_DEST_QPN = 1 << 20
};
enum {
    PT_IBV_QPS_RESET = 0, PT_IBV_QPS_INIT = 1, PT_IBV_QPS_RTR = 2, PT_IBV_QPS_RTS = 3,
    PT_IBV_QPS_SQD = 4, PT_IBV_QPS_SQE = 5, PT_IBV_QPS_ERR = 6
};
enum {
    PT_IBV_WR_RDMA_WRITE = 0, PT_IBV_WR_RDMA_WRITE_WITH_IMM = 1, PT_IBV_WR_SEND = 2,
    PT_IBV_WR_SEND_WITH_IMM = 3, PT_IBV_WR_RDMA_READ = 4, PT_IBV_WR_ATOMIC_CMP_AND_SWP = 5,
    PT_IBV_WR_ATOMIC_FETCH_AND_ADD = 6
};
enum {
    PT_IBV_SEND_FENCE = 1 << 0, PT_IBV_SEND_SIGNALED = 1 << 1, PT_IBV_SEND_SOLICITED = 1 << 2,
    PT_IBV_SEND_INLINE = 1 << 3
};

/* ---- structs we allocate (complete) ---- */
typedef union pt_ibv_gid {
    uint8_t raw[16];
    struct {
        uint64_t subnet_prefix;   /* big-endian */
        uint64_t interface_id;
    } global;
} pt_ibv_gid_t;

typedef struct pt_ibv_gid_entry {
    pt_ibv_gid_t gid;
    uint32_t gid_index;
    uint32_t port_num;
    uint32_t gid_type;
    uint32_t ndev_ifindex;
} pt_ibv_gid_entry_t;

typedef struct pt_ibv_device_attr {
    char fw_ver[64];
    uint64_t node_guid;
    uint64_t sys_image_guid;
    uint64_t max_mr_size;
    uint64_t page_size_cap;
    uint32_t vendor_id;
    uint32_t vendor_part_id;
    uint32_t hw_ver;
    int max_qp;
    int max_qp_wr;
    unsigned int device_cap_flags;
    int max_sge;
    int max_sge_rd;
    int max_cq;
    int max_cqe;
    int max_mr;
    int max_pd;
    int max_qp_rd_atom;
    int max_ee_rd_atom;
    int max_res_rd_atom;
    int max_qp_init_rd_atom;
    int max_ee_init_rd_atom;
    int atomic_cap;               /* PT_IBV_ATOMIC_* */
    int max_ee;
    int max_rdd;
    int max_mw;
    int max_raw_ipv6_qp;
    int max_raw_ethy_qp;
    int max_mcast_grp;
    int max_mcast_qp_attach;
    int max_total_mcast_qp_attach;
    int max_ah;
    int max_fmr;
    int max_map_per_fmr;
    int max_srq;
    int max_srq_wr;
    int max_srq_sge;
    uint16_t max_pkeys;
    uint8_t local_ca_ack_delay;
    uint8_t phys_port_cnt;
} pt_ibv_device_attr_t;

typedef struct pt_ibv_port_attr {
    int state;                    /* PT_IBV_PORT_* */
    int max_mtu;                  /* PT_IBV_MTU_* */
    int active_mtu;
    int gid_tbl_len;
    uint32_t port_cap_flags;
    uint32_t max_msg_sz;
    uint32_t bad_pkey_cntr;
    uint32_t qkey_viol_cntr;
    uint16_t pkey_tbl_len;
    uint16_t lid;
    uint16_t sm_lid;
    uint8_t lmc;
    uint8_t max_vl_num;
    uint8_t sm_sl;
    uint8_t subnet_timeout;
    uint8_t init_type_reply;
    uint8_t active_width;
    uint8_t active_speed;
    uint8_t phys_state;
    uint8_t link_layer;           /* PT_IBV_LINK_LAYER_* */
    uint8_t flags;
    uint16_t port_cap_flags2;
    uint32_t reserved[8];         /* room for fields a newer library appends */
} pt_ibv_port_attr_t;

typedef struct pt_ibv_qp_cap {
    uint32_t max_send_wr;
    uint32_t max_recv_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
} pt_ibv_qp_cap_t;

typedef struct pt_ibv_qp_init_attr {
    void *qp_context;
    struct pt_ibv_cq *send_cq;
    struct pt_ibv_cq *recv_cq;
    void *srq;
    pt_ibv_qp_cap_t cap;
    int qp_type;                  /* PT_IBV_QPT_* */
    int sq_sig_all;
} pt_ibv_qp_init_attr_t;

typedef struct pt_ibv_global_route {
    pt_ibv_gid_t dgid;
    uint32_t flow_label;
    uint8_t sgid_index;
    uint8_t hop_limit;
    uint8_t traffic_class;
} pt_ibv_global_route_t;

typedef struct pt_ibv_ah_attr {
    pt_ibv_global_route_t grh;
    uint16_t dlid;
    uint8_t sl;
    uint8_t src_path_bits;
    uint8_t static_rate;
    uint8_t is_global;
    uint8_t port_num;
} pt_ibv_ah_attr_t;

typedef struct pt_ibv_qp_attr {
    int qp_state;                 /* PT_IBV_QPS_* */
    int cur_qp_state;
    int path_mtu;
    int path_mig_state;
    uint32_t qkey;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint32_t dest_qp_num;
    unsigned int qp_access_flags;
    pt_ibv_qp_cap_t cap;
    pt_ibv_ah_attr_t ah_attr;
    pt_ibv_ah_attr_t alt_ah_attr;
    uint16_t pkey_index;
    uint16_t alt_pkey_index;
    uint8_t en_sqd_async_notify;
    uint8_t sq_draining;
    uint8_t max_rd_atomic;
    uint8_t max_dest_rd_atomic;
    uint8_t min_rnr_timer;
    uint8_t port_num;
    uint8_t timeout;
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint8_t alt_port_num;
    uint8_t alt_timeout;
    uint32_t rate_limit;
} pt_ibv_qp_attr_t;

typedef struct pt_ibv_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
} pt_ibv_sge_t;

typedef struct pt_ibv_mw_bind_info {
    void *mr;
    uint64_t addr;
    uint64_t length;
    unsigned int mw_access_flags;
} pt_ibv_mw_bind_info_t;

typedef struct pt_ibv_send_wr {
    uint64_t wr_id;
    struct pt_ibv_send_wr *next;
    pt_ibv_sge_t *sg_list;
    int num_sge;
    int opcode;                   /* PT_IBV_WR_* */
    unsigned int send_flags;      /* PT_IBV_SEND_* */
    uint32_t imm_data;            /* network byte order */
    union {
        struct {
            uint64_t remote_addr;
            uint32_t rkey;
        } rdma;
        struct {
            uint64_t remote_addr;
            uint64_t compare_add;
            uint64_t swap;
            uint32_t rkey;
        } atomic;
        struct {
            void *ah;
            uint32_t remote_qpn;
            uint32_t remote_qkey;
        } ud;
    } wr;
    union {
        struct {
            uint32_t remote_srqn;
        } xrc;
    } qp_type;
    union {
        struct {
            void *mw;
            uint32_t rkey;
            pt_ibv_mw_bind_info_t bind_info;
        } bind_mw;
        struct {
            void *hdr;
            uint16_t hdr_sz;
            uint16_t mss;
        } tso;
    } ext;
} pt_ibv_send_wr_t;

typedef struct pt_ibv_recv_wr {
    uint64_t wr_id;
    struct pt_ibv_recv_wr *next;
    pt_ibv_sge_t *sg_list;
    int num_sge;
} pt_ibv_recv_wr_t;

typedef struct pt_ibv_wc {
    uint64_t wr_id;
    int status;                   /* PT_IBV_WC_* status */
    int opcode;                   /* PT_IBV_WC_* opcode */
    uint32_t vendor_err;
    uint32_t byte_len;
    uint32_t imm_data;            /* network byte order */
    uint32_t qp_num;
    uint32_t src_qp;
    unsigned int wc_flags;
    uint16_t pkey_index;
    uint16_t slid;
    uint8_t sl;
    uint8_t dlid_path_bits;
} pt_ibv_wc_t;

/* ---- structs the library allocates (leading fields only) ---- */
typedef int (*pt_ibv_poll_cq_fn)(struct pt_ibv_cq *cq, int n, pt_ibv_wc_t *wc);
typedef int (*pt_ibv_post_send_fn)(struct pt_ibv_qp *qp, pt_ibv_send_wr_t *wr,
                                   pt_ibv_send_wr_t **bad);
typedef int (*pt_ibv_post_recv_fn)(struct pt_ibv_qp *qp, pt_ibv_recv_wr_t *wr,
                                   pt_ibv_recv_wr_t **bad);

/* The context's ops, in rdma-core's order; the entries we do not call are placeholders. */
typedef struct pt_ibv_context_ops {
    void *compat_query_device, *compat_query_port, *compat_alloc_pd, *compat_dealloc_pd;
    void *compat_reg_mr, *compat_rereg_mr, *compat_dereg_mr, *alloc_mw, *bind_mw, *dealloc_mw;
    void *compat_create_cq;
    pt_ibv_poll_cq_fn poll_cq;
    void *req_notify_cq, *compat_cq_event, *compat_resize_cq, *compat_destroy_cq;
    void *compat_create_srq, *compat_modify_srq, *compat_query_srq, *compat_destroy_srq;
    void *post_srq_recv, *compat_create_qp, *compat_query_qp, *compat_modify_qp;
    void *compat_destroy_qp;
    pt_ibv_post_send_fn post_send;
    pt_ibv_post_recv_fn post_recv;
    void *compat_create_ah, *compat_destroy_ah, *compat_attach_mcast, *compat_detach_mcast;
    void *compat_async_event;
} pt_ibv_context_ops_t;

typedef struct pt_ibv_context {
    struct pt_ibv_device *device;
    pt_ibv_context_ops_t ops;
    int cmd_fd;
    int async_fd;
    int num_comp_vectors;
    pthread_mutex_t mutex;
    void *abi_compat;
} pt_ibv_context_t;

typedef struct pt_ibv_pd {
    pt_ibv_context_t *context;
    uint32_t handle;
} pt_ibv_pd_t;

typedef struct pt_ibv_mr {
    pt_ibv_context_t *context;
    pt_ibv_pd_t *pd;
    void *addr;
    size_t length;
    uint32_t handle;
    uint32_t lkey;
    uint32_t rkey;
} pt_ibv_mr_t;

typedef struct pt_ibv_cq {
    pt_ibv_context_t *context;
    void *channel;
    void *cq_context;
    uint32_t handle;
    int cqe;
} pt_ibv_cq_t;

typedef struct pt_ibv_qp {
    pt_ibv_context_t *context;
    void *qp_context;
    pt_ibv_pd_t *pd;
    pt_ibv_cq_t *send_cq;
    pt_ibv_cq_t *recv_cq;
    void *srq;
    uint32_t handle;
    uint32_t qp_num;
    int state;
    int qp_type;
} pt_ibv_qp_t;

/* The data-path calls, as rdma-core's inline functions make them. */
static inline int pt_ibv_post_send(pt_ibv_qp_t *qp, pt_ibv_send_wr_t *wr,
                                   pt_ibv_send_wr_t **bad)
{
    return qp->context->ops.post_send(qp, wr, bad);
}

static inline int pt_ibv_post_recv(pt_ibv_qp_t *qp, pt_ibv_recv_wr_t *wr,
                                   pt_ibv_recv_wr_t **bad)
{
    return qp->context->ops.post_recv(qp, wr, bad);
}

static inline int pt_ibv_poll_cq(pt_ibv_cq_t *cq, int n, pt_ibv_wc_t *wc)
{
    return cq->context->ops.poll_cq(cq, n, wc);
}

#endif
