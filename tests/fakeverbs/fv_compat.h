/* Where rdma-core's headers are absent, the simulated provider is built on our own
 * declarations (native/src/transport/verbs/verbs_abi.h) under rdma-core's names. Where they
 * are present (the normal case: libibverbs-dev), it is built on rdma-core's, so that a wrong
 * declaration of ours cannot be hidden by the same mistake on both sides. */
#ifndef FV_COMPAT_H
#define FV_COMPAT_H

#ifdef FV_RDMA_CORE
#include <infiniband/verbs.h>
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_get_device_list
typedef struct _compat_ibv_port_attr fv_port_attr_arg;
#else
#include "transport/verbs/verbs_abi.h"
#define ibv_device pt_ibv_device
#define ibv_context pt_ibv_context
#define ibv_context_ops pt_ibv_context_ops
#define ibv_device_attr pt_ibv_device_attr
#define ibv_port_attr pt_ibv_port_attr
#define ibv_gid pt_ibv_gid
#define ibv_gid_entry pt_ibv_gid_entry
#define ibv_pd pt_ibv_pd
#define ibv_mr pt_ibv_mr
#define ibv_cq pt_ibv_cq
#define ibv_qp pt_ibv_qp
#define ibv_qp_init_attr pt_ibv_qp_init_attr
#define ibv_qp_attr pt_ibv_qp_attr
#define ibv_send_wr pt_ibv_send_wr
#define ibv_recv_wr pt_ibv_recv_wr
#define ibv_sge pt_ibv_sge
#define ibv_wc pt_ibv_wc
#define ibv_comp_channel pt_ibv_comp_channel
struct pt_ibv_comp_channel;
typedef struct pt_ibv_port_attr fv_port_attr_arg;
#define IBV_ATOMIC_NONE PT_IBV_ATOMIC_NONE
#define IBV_ATOMIC_HCA PT_IBV_ATOMIC_HCA
#define IBV_ATOMIC_GLOB PT_IBV_ATOMIC_GLOB
#define IBV_MTU_1024 PT_IBV_MTU_1024
#define IBV_MTU_4096 PT_IBV_MTU_4096
#define IBV_PORT_DOWN PT_IBV_PORT_DOWN
#define IBV_PORT_ACTIVE PT_IBV_PORT_ACTIVE
#define IBV_LINK_LAYER_ETHERNET PT_IBV_LINK_LAYER_ETHERNET
#define IBV_LINK_LAYER_INFINIBAND PT_IBV_LINK_LAYER_INFINIBAND
#define IBV_GID_TYPE_IB PT_IBV_GID_TYPE_IB
#define IBV_GID_TYPE_ROCE_V2 PT_IBV_GID_TYPE_ROCE_V2
#define IBV_WC_SUCCESS PT_IBV_WC_SUCCESS
#define IBV_WC_LOC_LEN_ERR PT_IBV_WC_LOC_LEN_ERR
#define IBV_WC_LOC_QP_OP_ERR PT_IBV_WC_LOC_QP_OP_ERR
#define IBV_WC_LOC_PROT_ERR PT_IBV_WC_LOC_PROT_ERR
#define IBV_WC_WR_FLUSH_ERR PT_IBV_WC_WR_FLUSH_ERR
#define IBV_WC_REM_ACCESS_ERR PT_IBV_WC_REM_ACCESS_ERR
#define IBV_WC_REM_OP_ERR PT_IBV_WC_REM_OP_ERR
#define IBV_WC_RETRY_EXC_ERR PT_IBV_WC_RETRY_EXC_ERR
#define IBV_WC_RNR_RETRY_EXC_ERR PT_IBV_WC_RNR_RETRY_EXC_ERR
#define IBV_WC_SEND PT_IBV_WC_SEND
#define IBV_WC_RDMA_WRITE PT_IBV_WC_RDMA_WRITE
#define IBV_WC_RDMA_READ PT_IBV_WC_RDMA_READ
#define IBV_WC_COMP_SWAP PT_IBV_WC_COMP_SWAP
#define IBV_WC_FETCH_ADD PT_IBV_WC_FETCH_ADD
#define IBV_WC_RECV PT_IBV_WC_RECV
#define IBV_WC_RECV_RDMA_WITH_IMM PT_IBV_WC_RECV_RDMA_WITH_IMM
#define IBV_WC_WITH_IMM PT_IBV_WC_WITH_IMM
#define IBV_ACCESS_LOCAL_WRITE PT_IBV_ACCESS_LOCAL_WRITE
#define IBV_ACCESS_REMOTE_WRITE PT_IBV_ACCESS_REMOTE_WRITE
#define IBV_ACCESS_REMOTE_READ PT_IBV_ACCESS_REMOTE_READ
#define IBV_ACCESS_REMOTE_ATOMIC PT_IBV_ACCESS_REMOTE_ATOMIC
#define IBV_QPT_RC PT_IBV_QPT_RC
#define IBV_QPT_UC PT_IBV_QPT_UC
#define IBV_QP_STATE PT_IBV_QP_STATE
#define IBV_QP_PORT PT_IBV_QP_PORT
#define IBV_QP_AV PT_IBV_QP_AV
#define IBV_QP_DEST_QPN PT_IBV_QP_DEST_QPN
#define IBV_QP_ACCESS_FLAGS PT_IBV_QP_ACCESS_FLAGS
#define IBV_QPS_RESET PT_IBV_QPS_RESET
#define IBV_QPS_INIT PT_IBV_QPS_INIT
#define IBV_QPS_RTR PT_IBV_QPS_RTR
#define IBV_QPS_RTS PT_IBV_QPS_RTS
#define IBV_QPS_ERR PT_IBV_QPS_ERR
#define IBV_WR_RDMA_WRITE PT_IBV_WR_RDMA_WRITE
#define IBV_WR_RDMA_WRITE_WITH_IMM PT_IBV_WR_RDMA_WRITE_WITH_IMM
#define IBV_WR_SEND PT_IBV_WR_SEND
#define IBV_WR_SEND_WITH_IMM PT_IBV_WR_SEND_WITH_IMM
#define IBV_WR_RDMA_READ PT_IBV_WR_RDMA_READ
#define IBV_WR_ATOMIC_CMP_AND_SWP PT_IBV_WR_ATOMIC_CMP_AND_SWP
#define IBV_WR_ATOMIC_FETCH_AND_ADD PT_IBV_WR_ATOMIC_FETCH_AND_ADD
#define IBV_SEND_SIGNALED PT_IBV_SEND_SIGNALED
#define IBV_SEND_INLINE PT_IBV_SEND_INLINE
#endif

#endif
