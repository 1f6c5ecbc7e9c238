/* Our verbs declarations (native/src/transport/verbs/verbs_abi.h) against rdma-core's own
 * <infiniband/verbs.h>: the size of every struct we declare, the offset and size of every
 * field, the value of every constant. Prints one line per check, "BAD" lines on a mismatch,
 * and exits 1 when any differs (tests/test_verbs_abi.py builds and runs it). */
#include <infiniband/verbs.h>
#include <stdio.h>

#include "transport/verbs/verbs_abi.h"

static int checks, bad;

static void same(const char *what, long ours, long theirs)
{
    checks++;
    if (ours != theirs)
        bad++;
    printf("%s %s ours=%ld rdma-core=%ld\n", ours == theirs ? "ok " : "BAD", what, ours, theirs);
}

#define SIZE(o, t) same("sizeof " #t, (long)sizeof(o), (long)sizeof(struct t))
#define FIELD(o, t, fo, ft)                                                               \
    do {                                                                                  \
        same("offsetof " #t "." #ft, (long)offsetof(o, fo), (long)offsetof(struct t, ft)); \
        same("sizeof " #t "." #ft, (long)sizeof(((o *)0)->fo),                            \
             (long)sizeof(((struct t *)0)->ft));                                          \
    } while (0)
#define F(o, t, f) FIELD(o, t, f, f)
#define CONST(a, b) same(#b, (long)(a), (long)(b))

int main(void)
{
    /* gid */
    same("sizeof ibv_gid", sizeof(pt_ibv_gid_t), sizeof(union ibv_gid));
    same("offsetof ibv_gid.global.interface_id", offsetof(pt_ibv_gid_t, global.interface_id),
         offsetof(union ibv_gid, global.interface_id));
    SIZE(pt_ibv_gid_entry_t, ibv_gid_entry);
    F(pt_ibv_gid_entry_t, ibv_gid_entry, gid);
    F(pt_ibv_gid_entry_t, ibv_gid_entry, gid_index);
    F(pt_ibv_gid_entry_t, ibv_gid_entry, port_num);
    F(pt_ibv_gid_entry_t, ibv_gid_entry, gid_type);
    F(pt_ibv_gid_entry_t, ibv_gid_entry, ndev_ifindex);
    /* device attributes: every field */
    SIZE(pt_ibv_device_attr_t, ibv_device_attr);
#define DA(f) F(pt_ibv_device_attr_t, ibv_device_attr, f)
    DA(fw_ver); DA(node_guid); DA(sys_image_guid); DA(max_mr_size); DA(page_size_cap);
    DA(vendor_id); DA(vendor_part_id); DA(hw_ver); DA(max_qp); DA(max_qp_wr);
    DA(device_cap_flags); DA(max_sge); DA(max_sge_rd); DA(max_cq); DA(max_cqe); DA(max_mr);
    DA(max_pd); DA(max_qp_rd_atom); DA(max_ee_rd_atom); DA(max_res_rd_atom);
    DA(max_qp_init_rd_atom); DA(max_ee_init_rd_atom); DA(atomic_cap); DA(max_ee); DA(max_rdd);
    DA(max_mw); DA(max_raw_ipv6_qp); DA(max_raw_ethy_qp); DA(max_mcast_grp);
    DA(max_mcast_qp_attach); DA(max_total_mcast_qp_attach); DA(max_ah); DA(max_fmr);
    DA(max_map_per_fmr); DA(max_srq); DA(max_srq_wr); DA(max_srq_sge); DA(max_pkeys);
    DA(local_ca_ack_delay); DA(phys_port_cnt);
    /* port attributes: ours has room at the end for fields a newer library appends */
    checks++;
    if (sizeof(pt_ibv_port_attr_t) < sizeof(struct ibv_port_attr))
        bad++;
    printf("%s sizeof ibv_port_attr ours=%zu >= rdma-core=%zu\n",
           sizeof(pt_ibv_port_attr_t) >= sizeof(struct ibv_port_attr) ? "ok " : "BAD",
           sizeof(pt_ibv_port_attr_t), sizeof(struct ibv_port_attr));
#define PA(f) F(pt_ibv_port_attr_t, ibv_port_attr, f)
    PA(state); PA(max_mtu); PA(active_mtu); PA(gid_tbl_len); PA(port_cap_flags);
    PA(max_msg_sz); PA(bad_pkey_cntr); PA(qkey_viol_cntr); PA(pkey_tbl_len); PA(lid);
    PA(sm_lid); PA(lmc); PA(max_vl_num); PA(sm_sl); PA(subnet_timeout); PA(init_type_reply);
    PA(active_width); PA(active_speed); PA(phys_state); PA(link_layer); PA(flags);
    PA(port_cap_flags2);
    /* queue pair creation and modification */
    SIZE(pt_ibv_qp_cap_t, ibv_qp_cap);
    F(pt_ibv_qp_cap_t, ibv_qp_cap, max_send_wr); F(pt_ibv_qp_cap_t, ibv_qp_cap, max_recv_wr);
    F(pt_ibv_qp_cap_t, ibv_qp_cap, max_send_sge); F(pt_ibv_qp_cap_t, ibv_qp_cap, max_recv_sge);
    F(pt_ibv_qp_cap_t, ibv_qp_cap, max_inline_data);
    SIZE(pt_ibv_qp_init_attr_t, ibv_qp_init_attr);
#define QI(f) F(pt_ibv_qp_init_attr_t, ibv_qp_init_attr, f)
    QI(qp_context); QI(send_cq); QI(recv_cq); QI(srq); QI(cap); QI(qp_type); QI(sq_sig_all);
    SIZE(pt_ibv_global_route_t, ibv_global_route);
#define GR(f) F(pt_ibv_global_route_t, ibv_global_route, f)
    GR(dgid); GR(flow_label); GR(sgid_index); GR(hop_limit); GR(traffic_class);
    SIZE(pt_ibv_ah_attr_t, ibv_ah_attr);
#define AH(f) F(pt_ibv_ah_attr_t, ibv_ah_attr, f)
    AH(grh); AH(dlid); AH(sl); AH(src_path_bits); AH(static_rate); AH(is_global); AH(port_num);
    SIZE(pt_ibv_qp_attr_t, ibv_qp_attr);
#define QA(f) F(pt_ibv_qp_attr_t, ibv_qp_attr, f)
    QA(qp_state); QA(cur_qp_state); QA(path_mtu); QA(path_mig_state); QA(qkey); QA(rq_psn);
    QA(sq_psn); QA(dest_qp_num); QA(qp_access_flags); QA(cap); QA(ah_attr); QA(alt_ah_attr);
    QA(pkey_index); QA(alt_pkey_index); QA(en_sqd_async_notify); QA(sq_draining);
    QA(max_rd_atomic); QA(max_dest_rd_atomic); QA(min_rnr_timer); QA(port_num); QA(timeout);
    QA(retry_cnt); QA(rnr_retry); QA(alt_port_num); QA(alt_timeout); QA(rate_limit);
    /* work requests and completions */
    SIZE(pt_ibv_sge_t, ibv_sge);
    F(pt_ibv_sge_t, ibv_sge, addr); F(pt_ibv_sge_t, ibv_sge, length); F(pt_ibv_sge_t, ibv_sge, lkey);
    SIZE(pt_ibv_send_wr_t, ibv_send_wr);
#define SW(f) F(pt_ibv_send_wr_t, ibv_send_wr, f)
    SW(wr_id); SW(next); SW(sg_list); SW(num_sge); SW(opcode); SW(send_flags); SW(imm_data);
    SW(wr.rdma.remote_addr); SW(wr.rdma.rkey); SW(wr.atomic.remote_addr);
    SW(wr.atomic.compare_add); SW(wr.atomic.swap); SW(wr.atomic.rkey);
    SW(qp_type.xrc.remote_srqn);
    FIELD(pt_ibv_send_wr_t, ibv_send_wr, ext.tso.mss, tso.mss);
    FIELD(pt_ibv_send_wr_t, ibv_send_wr, ext.bind_mw.bind_info, bind_mw.bind_info);
    SIZE(pt_ibv_recv_wr_t, ibv_recv_wr);
    F(pt_ibv_recv_wr_t, ibv_recv_wr, wr_id); F(pt_ibv_recv_wr_t, ibv_recv_wr, next);
    F(pt_ibv_recv_wr_t, ibv_recv_wr, sg_list); F(pt_ibv_recv_wr_t, ibv_recv_wr, num_sge);
    SIZE(pt_ibv_wc_t, ibv_wc);
#define WC(f) F(pt_ibv_wc_t, ibv_wc, f)
    WC(wr_id); WC(status); WC(opcode); WC(vendor_err); WC(byte_len); WC(imm_data); WC(qp_num);
    WC(src_qp); WC(wc_flags); WC(pkey_index); WC(slid); WC(sl); WC(dlid_path_bits);
    /* what the library allocates: the fields we read, and where the data-path ops sit */
    SIZE(pt_ibv_context_ops_t, ibv_context_ops);
    FIELD(pt_ibv_context_ops_t, ibv_context_ops, poll_cq, poll_cq);
    FIELD(pt_ibv_context_ops_t, ibv_context_ops, post_send, post_send);
    FIELD(pt_ibv_context_ops_t, ibv_context_ops, post_recv, post_recv);
    FIELD(pt_ibv_context_ops_t, ibv_context_ops, compat_async_event, _compat_async_event);
    SIZE(pt_ibv_context_t, ibv_context);
    F(pt_ibv_context_t, ibv_context, device); F(pt_ibv_context_t, ibv_context, ops);
    F(pt_ibv_context_t, ibv_context, abi_compat);
    SIZE(pt_ibv_pd_t, ibv_pd);
    F(pt_ibv_pd_t, ibv_pd, context); F(pt_ibv_pd_t, ibv_pd, handle);
    SIZE(pt_ibv_mr_t, ibv_mr);
#define MR(f) F(pt_ibv_mr_t, ibv_mr, f)
    MR(context); MR(pd); MR(addr); MR(length); MR(handle); MR(lkey); MR(rkey);
#define CQ(f) F(pt_ibv_cq_t, ibv_cq, f)
    CQ(context); CQ(channel); CQ(cq_context); CQ(handle); CQ(cqe);
#define QP(f) F(pt_ibv_qp_t, ibv_qp, f)
    QP(context); QP(qp_context); QP(pd); QP(send_cq); QP(recv_cq); QP(srq); QP(handle);
    QP(qp_num); QP(state); QP(qp_type);
    /* constants */
    CONST(PT_IBV_ATOMIC_NONE, IBV_ATOMIC_NONE); CONST(PT_IBV_ATOMIC_HCA, IBV_ATOMIC_HCA);
    CONST(PT_IBV_ATOMIC_GLOB, IBV_ATOMIC_GLOB);
    CONST(PT_IBV_MTU_256, IBV_MTU_256); CONST(PT_IBV_MTU_512, IBV_MTU_512);
    CONST(PT_IBV_MTU_1024, IBV_MTU_1024); CONST(PT_IBV_MTU_2048, IBV_MTU_2048);
    CONST(PT_IBV_MTU_4096, IBV_MTU_4096);
    CONST(PT_IBV_PORT_DOWN, IBV_PORT_DOWN); CONST(PT_IBV_PORT_ACTIVE, IBV_PORT_ACTIVE);
    CONST(PT_IBV_LINK_LAYER_UNSPECIFIED, IBV_LINK_LAYER_UNSPECIFIED);
    CONST(PT_IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_INFINIBAND);
    CONST(PT_IBV_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_ETHERNET);
    CONST(PT_IBV_GID_TYPE_IB, IBV_GID_TYPE_IB); CONST(PT_IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V1);
    CONST(PT_IBV_GID_TYPE_ROCE_V2, IBV_GID_TYPE_ROCE_V2);
    CONST(PT_IBV_WC_SUCCESS, IBV_WC_SUCCESS); CONST(PT_IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_LEN_ERR);
    CONST(PT_IBV_WC_LOC_QP_OP_ERR, IBV_WC_LOC_QP_OP_ERR);
    CONST(PT_IBV_WC_LOC_PROT_ERR, IBV_WC_LOC_PROT_ERR);
    CONST(PT_IBV_WC_WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR);
    CONST(PT_IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_INV_REQ_ERR);
    CONST(PT_IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR);
    CONST(PT_IBV_WC_REM_OP_ERR, IBV_WC_REM_OP_ERR);
    CONST(PT_IBV_WC_RETRY_EXC_ERR, IBV_WC_RETRY_EXC_ERR);
    CONST(PT_IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR);
    CONST(PT_IBV_WC_GENERAL_ERR, IBV_WC_GENERAL_ERR);
    CONST(PT_IBV_WC_SEND, IBV_WC_SEND); CONST(PT_IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE);
    CONST(PT_IBV_WC_RDMA_READ, IBV_WC_RDMA_READ); CONST(PT_IBV_WC_COMP_SWAP, IBV_WC_COMP_SWAP);
    CONST(PT_IBV_WC_FETCH_ADD, IBV_WC_FETCH_ADD); CONST(PT_IBV_WC_RECV, IBV_WC_RECV);
    CONST(PT_IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_RECV_RDMA_WITH_IMM);
    CONST(PT_IBV_WC_WITH_IMM, IBV_WC_WITH_IMM);
    CONST(PT_IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE);
    CONST(PT_IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_WRITE);
    CONST(PT_IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_READ);
    CONST(PT_IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_REMOTE_ATOMIC);
    CONST(PT_IBV_QPT_RC, IBV_QPT_RC); CONST(PT_IBV_QPT_UC, IBV_QPT_UC);
    CONST(PT_IBV_QP_STATE, IBV_QP_STATE); CONST(PT_IBV_QP_ACCESS_FLAGS, IBV_QP_ACCESS_FLAGS);
    CONST(PT_IBV_QP_PKEY_INDEX, IBV_QP_PKEY_INDEX); CONST(PT_IBV_QP_PORT, IBV_QP_PORT);
    CONST(PT_IBV_QP_AV, IBV_QP_AV); CONST(PT_IBV_QP_PATH_MTU, IBV_QP_PATH_MTU);
    CONST(PT_IBV_QP_TIMEOUT, IBV_QP_TIMEOUT); CONST(PT_IBV_QP_RETRY_CNT, IBV_QP_RETRY_CNT);
    CONST(PT_IBV_QP_RNR_RETRY, IBV_QP_RNR_RETRY); CONST(PT_IBV_QP_RQ_PSN, IBV_QP_RQ_PSN);
    CONST(PT_IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_MAX_QP_RD_ATOMIC);
    CONST(PT_IBV_QP_MIN_RNR_TIMER, IBV_QP_MIN_RNR_TIMER); CONST(PT_IBV_QP_SQ_PSN, IBV_QP_SQ_PSN);
    CONST(PT_IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MAX_DEST_RD_ATOMIC);
    CONST(PT_IBV_QP_DEST_QPN, IBV_QP_DEST_QPN);
    CONST(PT_IBV_QPS_RESET, IBV_QPS_RESET); CONST(PT_IBV_QPS_INIT, IBV_QPS_INIT);
    CONST(PT_IBV_QPS_RTR, IBV_QPS_RTR); CONST(PT_IBV_QPS_RTS, IBV_QPS_RTS);
    CONST(PT_IBV_QPS_SQD, IBV_QPS_SQD); CONST(PT_IBV_QPS_SQE, IBV_QPS_SQE);
    CONST(PT_IBV_QPS_ERR, IBV_QPS_ERR);
    CONST(PT_IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE);
    CONST(PT_IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM);
    CONST(PT_IBV_WR_SEND, IBV_WR_SEND); CONST(PT_IBV_WR_SEND_WITH_IMM, IBV_WR_SEND_WITH_IMM);
    CONST(PT_IBV_WR_RDMA_READ, IBV_WR_RDMA_READ);
    CONST(PT_IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_CMP_AND_SWP);
    CONST(PT_IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_FETCH_AND_ADD);
    CONST(PT_IBV_SEND_FENCE, IBV_SEND_FENCE); CONST(PT_IBV_SEND_SIGNALED, IBV_SEND_SIGNALED);
    CONST(PT_IBV_SEND_SOLICITED, IBV_SEND_SOLICITED); CONST(PT_IBV_SEND_INLINE, IBV_SEND_INLINE);
    printf("%d checks, %d differ\n", checks, bad);
    return bad ? 1 : 0;
}
