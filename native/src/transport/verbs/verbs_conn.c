/* The verbs transport's connections: the device opened at first use, one staging region (one
 * memory region for every peer's frames and bounce buffer: few large regions), one queue pair
 * per peer brought to RTS with what the peer published through the bootstrap, and the poller
 * (a native thread, helped by whoever waits) that completes requests and serves the peer's.
 *
 * wr_id: (rank << 16 | index) << 2 | kind; kind 1 a receive frame, 2 a send frame, 3 the
 * signalled last work request of an RDMA operation waiting in slot `index`. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>

#include "transport/verbs/verbs.h"

#define VB_INFO_MAGIC 0x70747662u
#define WRID(rank, idx, kind) ((((uint64_t)(rank) << 16 | (uint64_t)(idx)) << 2) | (kind))

static size_t peer_stage(int profile)
{
    return (size_t)(VB_RECV + VB_SEND) * VB_FRAME + (profile == VB_RC ? VB_BOUNCE : 0);
}

static int sq_depth(const pt_verbs_t *v)
{
    int d = v->dev.attr.max_qp_wr;
    return d > 0 && d < 64 ? d : 64;
}

static pt_status_t post_recv(pt_verbs_t *v, vb_peer_t *p, int i)
{
    pt_ibv_sge_t sge = {.addr = (uint64_t)(uintptr_t)(p->recv + (size_t)i * VB_FRAME),
                        .length = VB_FRAME, .lkey = v->stage_mr->lkey};
    pt_ibv_recv_wr_t wr = {.wr_id = WRID(p->rank, i, 1), .sg_list = &sge, .num_sge = 1};
    pt_ibv_recv_wr_t *bad = NULL;
    pt_ibv_qp_t *qp = p->msg_rails == 2 && i >= VB_RECV / 2 ? p->qp2 : p->qp;
    return pt_ibv_post_recv(qp, &wr, &bad) == 0 ? PT_OK : PT_ERR_PEER_LOST;
}

static pt_status_t wc_status(int s)
{
    return s == PT_IBV_WC_REM_ACCESS_ERR ? PT_ERR_KEY : PT_ERR_PEER_LOST;
}

/* (p->lock held) */
static void finish_locked(vb_peer_t *p, int s, pt_status_t st)
{
    vb_wait_t *w = p->slots[s];
    if (!w)
        return;
    p->slots[s] = NULL;
    w->status = st;
    atomic_store_explicit(&w->done, 1, memory_order_release);
    pt_plat_wake(&w->done, 0);
}

void pt__verbs_peer_fail(pt_ctx_t *ctx, vb_peer_t *p, pt_status_t st)
{
    pthread_mutex_lock(&p->lock);
    if (atomic_exchange(&p->up, 0)) {
        p->fail = st;
        pt_peer_t *pe = &ctx->peers[p->rank];
        if (pe->ops == &pt_transport_verbs && pe->tcp)
            pe->ops = &pt_transport_tcp; /* the next use goes over tcp */
        else if (pe->ops == &pt_transport_verbs)
            pe->ops = NULL;
    }
    for (int s = 0; s < VB_SLOTS; s++)
        finish_locked(p, s, st);
    p->inflight = p->inflight_rail[0] = p->inflight_rail[1] = 0;
    pthread_mutex_unlock(&p->lock);
}

static void on_send(pt_ctx_t *ctx, pt_verbs_t *v, const pt_ibv_wc_t *wc)
{
    int kind = (int)(wc->wr_id & 3);
    int rank = (int)(wc->wr_id >> 18), idx = (int)((wc->wr_id >> 2) & 0xffff);
    if (rank < 0 || rank >= ctx->size || !v->peers[rank].qp)
        return;
    vb_peer_t *p = &v->peers[rank];
    pthread_mutex_lock(&p->lock);
    if (kind == 2) {
        p->send_free[p->nfree++] = idx & 0xff;
        *(idx >> 8 ? &p->sq_used2 : &p->sq_used) -= 1;
    } else if (kind == 3) {
        vb_wait_t *w = p->slots[idx];
        if (w && w->wr_id == wc->wr_id) {
            *(w->rail ? &p->sq_used2 : &p->sq_used) -= w->nwr;
            finish_locked(p, idx, wc->status == PT_IBV_WC_SUCCESS ? PT_OK
                                                                   : wc_status(wc->status));
        }
    }
    pthread_mutex_unlock(&p->lock);
    if (wc->status != PT_IBV_WC_SUCCESS && !atomic_load(&v->stopping))
        pt__verbs_peer_fail(ctx, p, wc_status(wc->status));
}

static void on_recv(pt_ctx_t *ctx, pt_verbs_t *v, const pt_ibv_wc_t *wc)
{
    int rank = (int)(wc->wr_id >> 18), idx = (int)((wc->wr_id >> 2) & 0xffff);
    if (rank < 0 || rank >= ctx->size || !v->peers[rank].qp || idx >= VB_RECV)
        return;
    vb_peer_t *p = &v->peers[rank];
    if (wc->status != PT_IBV_WC_SUCCESS) {
        if (!atomic_load(&v->stopping))
            pt__verbs_peer_fail(ctx, p, wc_status(wc->status));
        return;
    }
    if (!atomic_load(&p->up))
        return;
    const uint8_t *f = p->recv + (size_t)idx * VB_FRAME;
    if (wc->opcode == PT_IBV_WC_RECV_RDMA_WITH_IMM) { /* a request written into a slot */
        if (!p->imm || !(wc->wc_flags & PT_IBV_WC_WITH_IMM)) {
            post_recv(v, p, idx);
            pt__verbs_peer_fail(ctx, p, PT_ERR_PEER_LOST);
            return;
        }
        f = p->imm + (size_t)(ntohl(wc->imm_data) % VB_SLOTS) * VB_FRAME;
    }
    vb_hdr_t h;
    memcpy(&h, f, sizeof(h));
    int carries = h.op == VB_PUT || h.op == (VB_GET | VB_REPLY); /* a payload of h.len */
    if (wc->byte_len < sizeof(h) || (carries && h.len > VB_PAYLOAD)) {
        post_recv(v, p, idx);
        pt__verbs_peer_fail(ctx, p, PT_ERR_PEER_LOST); /* a malformed frame: never trusted */
        return;
    }
    if (!(h.op & VB_REPLY)) {
        uint8_t payload[VB_PAYLOAD];
        size_t n = h.op == VB_PUT ? (size_t)h.len : 0;
        memcpy(payload, f + sizeof(h), n);
        post_recv(v, p, idx); /* before the reply: the peer may send again once it has it */
        int rail = p->qp2 && wc->qp_num == p->qp2->qp_num;
        pt__verbs_serve(ctx, p, rail, &h, payload);
        return;
    }
    pthread_mutex_lock(&p->lock);
    int s = (int)(h.id & 15);
    vb_wait_t *w = p->slots[s];
    if (w && w->id == h.id) {
        w->reply = h;
        if (w->dst && h.status == PT_OK)
            memcpy(w->dst, f + sizeof(h), h.len < w->dst_len ? (size_t)h.len : w->dst_len);
        p->inflight--;
        p->inflight_rail[w->rail]--;
        finish_locked(p, s, (pt_status_t)h.status);
    }
    pthread_mutex_unlock(&p->lock);
    post_recv(v, p, idx);
}

static int poll_send(pt_ctx_t *ctx, pt_verbs_t *v)
{
    pt_ibv_wc_t wc[16];
    int n = pt_ibv_poll_cq(v->scq, 16, wc);
    for (int i = 0; i < n; i++)
        on_send(ctx, v, &wc[i]);
    return n > 0 ? n : 0;
}

/* Poll both queues; whoever holds poll_lock serves. */
static int poll_all(pt_ctx_t *ctx, pt_verbs_t *v)
{
    if (pthread_mutex_trylock(&v->poll_lock) != 0)
        return 0;
    int n = poll_send(ctx, v);
    pt_ibv_wc_t wc[16];
    int m = pt_ibv_poll_cq(v->rcq, 16, wc);
    for (int i = 0; i < m; i++)
        on_recv(ctx, v, &wc[i]);
    pthread_mutex_unlock(&v->poll_lock);
    return n + (m > 0 ? m : 0);
}

static void nap(double seconds)
{
    struct timespec ts = {0, (long)(seconds * 1e9)};
    nanosleep(&ts, NULL);
}

/* The poller: after activity it polls for the spin time (pt_set_spin: long where cores are
 * free, short when ranks outnumber them), so that a peer's next request is served within
 * microseconds; then it naps, 50 us growing to 1 ms. */
static void *poller_main(void *arg)
{
    pt_ctx_t *ctx = arg;
    pt_verbs_t *v = ctx->verbs;
    double idle = 0, last = pt__now();
    while (!atomic_load(&v->stopping)) {
        if (poll_all(ctx, v)) {
            idle = 0;
            last = pt__now();
            continue;
        }
        double el = pt__now() - last;
        if (el < pt__spin_seconds()) {
            pt__relax(el);
            continue;
        }
        idle = idle < 50e-6 ? 50e-6 : idle * 1.5 > 1e-3 ? 1e-3 : idle * 1.5;
        nap(idle);
    }
    return NULL;
}

pt_verbs_t *pt__verbs_get(pt_ctx_t *ctx, pt_status_t *st)
{
    if (ctx->verbs) {
        *st = PT_OK;
        return ctx->verbs;
    }
    *st = PT_ERR_NOMEM;
    pt_verbs_t *v = calloc(1, sizeof(*v));
    if (!v)
        return NULL;
    char why[256];
    if ((*st = pt__verbs_dev_open(&v->dev, why, sizeof(why))) != PT_OK)
        goto err_free;
    const pt_verbs_lib_t *lib = v->dev.lib;
    *st = PT_ERR_SYS;
    int cqe = ctx->size * (VB_RECV + VB_SEND) + 64;
    v->scq = lib->create_cq(v->dev.ctx, cqe, NULL, NULL, 0);
    v->rcq = lib->create_cq(v->dev.ctx, cqe, NULL, NULL, 0);
    if (!v->scq || !v->rcq)
        goto err_cq;
    v->stage_len = peer_stage(v->dev.profile) * (size_t)ctx->size;
    if (posix_memalign((void **)&v->stage, 4096, v->stage_len) != 0) {
        v->stage = NULL;
        goto err_cq;
    }
    memset(v->stage, 0, v->stage_len);
    v->stage_mr = lib->reg_mr(v->dev.pd, v->stage, v->stage_len, PT_IBV_ACCESS_LOCAL_WRITE);
    if (!v->stage_mr)
        goto err_stage;
    if (v->dev.profile == VB_RC &&
        posix_memalign((void **)&v->imm, 4096, (size_t)ctx->size * VB_SLOTS * VB_FRAME) != 0)
        v->imm = NULL; /* (then notifies go as SENDs) */
    v->peers = calloc((size_t)ctx->size, sizeof(vb_peer_t));
    if (!v->peers)
        goto err_mr;
    for (int r = 0; r < ctx->size; r++) {
        vb_peer_t *p = &v->peers[r];
        p->rank = r;
        pthread_mutex_init(&p->lock, NULL);
        pthread_mutex_init(&p->op_lock, NULL);
        uint8_t *base = v->stage + peer_stage(v->dev.profile) * (size_t)r;
        p->recv = base;
        p->send = base + (size_t)VB_RECV * VB_FRAME;
        p->bounce = base + (size_t)(VB_RECV + VB_SEND) * VB_FRAME;
        for (int i = 0; i < VB_SEND; i++)
            p->send_free[p->nfree++] = i;
    }
    v->inline_max = VB_INLINE;
    pthread_mutex_init(&v->poll_lock, NULL);
    pthread_mutex_init(&v->mr_lock, NULL);
    ctx->verbs = v;
    if (pthread_create(&v->thread, NULL, poller_main, ctx) != 0) {
        ctx->verbs = NULL;
        goto err_peers;
    }
    v->started = 1;
    *st = PT_OK;
    return v;
err_peers:
    free(v->peers);
err_mr:
    free(v->imm);
    lib->dereg_mr(v->stage_mr);
err_stage:
    free(v->stage);
err_cq:
    if (v->scq)
        lib->destroy_cq(v->scq);
    if (v->rcq)
        lib->destroy_cq(v->rcq);
    pt__verbs_dev_close(&v->dev);
err_free:
    free(v);
    return NULL;
}

/* A queue pair on `port`, in INIT. */
static pt_ibv_qp_t *qp_make(pt_verbs_t *v, int port)
{
    int depth = sq_depth(v);
    pt_ibv_qp_init_attr_t ia = {
        .send_cq = v->scq, .recv_cq = v->rcq,
        .qp_type = v->dev.profile == VB_RC ? PT_IBV_QPT_RC : PT_IBV_QPT_UC,
        .cap = {.max_send_wr = (uint32_t)depth, .max_recv_wr = VB_RECV, .max_send_sge = 1,
                .max_recv_sge = 1, .max_inline_data = v->dev.profile == VB_RC ? VB_INLINE : 0}};
    pt_ibv_qp_t *qp = v->dev.lib->create_qp(v->dev.pd, &ia);
    if (!qp && ia.cap.max_inline_data) { /* a device without inline sends */
        ia.cap.max_inline_data = 0;
        qp = v->dev.lib->create_qp(v->dev.pd, &ia);
    }
    if (!qp)
        return NULL;
    /* the provider writes back what it granted: inline only up to that, on every pair */
    if ((int)ia.cap.max_inline_data < v->inline_max)
        v->inline_max = (int)ia.cap.max_inline_data;
    pt_ibv_qp_attr_t a = {.qp_state = PT_IBV_QPS_INIT, .port_num = (uint8_t)port};
    a.qp_access_flags = v->dev.profile == VB_RC ? PT_IBV_ACCESS_REMOTE_READ |
                                                      PT_IBV_ACCESS_REMOTE_WRITE |
                                                      PT_IBV_ACCESS_REMOTE_ATOMIC
                                                : PT_IBV_ACCESS_REMOTE_WRITE;
    if (v->dev.lib->modify_qp(qp, &a, PT_IBV_QP_STATE | PT_IBV_QP_PKEY_INDEX | PT_IBV_QP_PORT |
                                          PT_IBV_QP_ACCESS_FLAGS) != 0) {
        v->dev.lib->destroy_qp(qp);
        return NULL;
    }
    return qp;
}

/* INIT -> RTR -> RTS towards the peer's queue pair qpn at gid. */
static pt_status_t qp_connect(pt_verbs_t *v, pt_ibv_qp_t *qp, int port, int gid_index,
                              uint32_t qpn, const uint8_t gid[16], int lid, int mtu)
{
    const pt_verbs_lib_t *lib = v->dev.lib;
    int rc = v->dev.profile == VB_RC;
    pt_ibv_qp_attr_t a;
    memset(&a, 0, sizeof(a));
    a.qp_state = PT_IBV_QPS_RTR;
    a.path_mtu = mtu < v->dev.mtu ? mtu : v->dev.mtu;
    a.dest_qp_num = qpn;
    a.max_dest_rd_atomic = rc ? 4 : 0;
    a.min_rnr_timer = 12;
    /* Ethernet (RoCE, Thunderbolt) routes by GID; InfiniBand inside a subnet by LID */
    a.ah_attr.is_global = v->dev.link_layer != PT_IBV_LINK_LAYER_INFINIBAND || lid == 0;
    a.ah_attr.dlid = (uint16_t)lid;
    memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = (uint8_t)port;
    int mask = PT_IBV_QP_STATE | PT_IBV_QP_AV | PT_IBV_QP_PATH_MTU | PT_IBV_QP_DEST_QPN |
               PT_IBV_QP_RQ_PSN;
    if (rc)
        mask |= PT_IBV_QP_MAX_DEST_RD_ATOMIC | PT_IBV_QP_MIN_RNR_TIMER;
    if (lib->modify_qp(qp, &a, mask) != 0)
        return PT_ERR_SYS;
    memset(&a, 0, sizeof(a));
    a.qp_state = PT_IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = rc ? 4 : 0;
    mask = PT_IBV_QP_STATE | PT_IBV_QP_SQ_PSN;
    if (rc)
        mask |= PT_IBV_QP_TIMEOUT | PT_IBV_QP_RETRY_CNT | PT_IBV_QP_RNR_RETRY |
                PT_IBV_QP_MAX_QP_RD_ATOMIC;
    return lib->modify_qp(qp, &a, mask) == 0 ? PT_OK : PT_ERR_SYS;
}

pt_status_t pt_ctx_verbs_local(pt_ctx_t *ctx, int rank, void *info, size_t *len)
{
    if (!ctx || rank < 0 || rank >= ctx->size || rank == ctx->rank || !info || !len ||
        *len < sizeof(vb_info_t))
        return PT_ERR_INVALID;
    pt_status_t st;
    pt_verbs_t *v = pt__verbs_get(ctx, &st);
    if (!v)
        return st;
    vb_peer_t *p = &v->peers[rank];
    if (p->qp)
        return PT_ERR_INVALID; /* one queue pair per peer */
    p->qp = qp_make(v, v->dev.port);
    if (!p->qp)
        return PT_ERR_SYS;
    /* a second rail where the device has a second active port (rc: striped transfers) */
    if (v->dev.port2)
        p->qp2 = qp_make(v, v->dev.port2);
    vb_info_t out = {.magic = VB_INFO_MAGIC, .qpn = p->qp->qp_num,
                     .profile = (uint32_t)v->dev.profile, .port = (uint32_t)v->dev.port,
                     .mtu = (uint32_t)v->dev.mtu, .gid_index = (uint32_t)v->dev.gid_index,
                     .lid = (uint16_t)v->dev.lid, .lid2 = (uint16_t)v->dev.lid2};
    memcpy(out.gid, v->dev.gid.raw, 16);
    if (v->imm) { /* rc: this peer's notify slots, writable by it alone */
        p->imm = v->imm + (size_t)rank * VB_SLOTS * VB_FRAME;
        p->imm_mr = v->dev.lib->reg_mr(v->dev.pd, p->imm, (size_t)VB_SLOTS * VB_FRAME,
                                       PT_IBV_ACCESS_LOCAL_WRITE | PT_IBV_ACCESS_REMOTE_WRITE);
        if (p->imm_mr) {
            out.imm_addr = (uint64_t)(uintptr_t)p->imm;
            out.imm_rkey = p->imm_mr->rkey;
        }
    }
    if (p->qp2) {
        out.qpn2 = p->qp2->qp_num;
        out.port2 = (uint32_t)v->dev.port2;
        memcpy(out.gid2, v->dev.gid2.raw, 16);
    }
    memcpy(info, &out, sizeof(out));
    *len = sizeof(out);
    return PT_OK;
}

pt_status_t pt_ctx_connect_verbs(pt_ctx_t *ctx, int rank, const void *info, size_t len)
{
    if (!ctx || !ctx->verbs || rank < 0 || rank >= ctx->size || !info ||
        len != sizeof(vb_info_t))
        return PT_ERR_INVALID;
    pt_verbs_t *v = ctx->verbs;
    vb_peer_t *p = &v->peers[rank];
    vb_info_t in;
    memcpy(&in, info, sizeof(in));
    if (!p->qp || in.magic != VB_INFO_MAGIC || in.profile != (uint32_t)v->dev.profile)
        return PT_ERR_INVALID; /* (profiles differ: the caller falls back to tcp) */
    pt_status_t st = qp_connect(v, p->qp, v->dev.port, v->dev.gid_index, in.qpn, in.gid,
                                in.lid, (int)in.mtu);
    if (st != PT_OK)
        return st;
    p->rimm_addr = in.imm_addr;
    p->rimm_rkey = in.imm_rkey;
    /* the second rail only where both ends have one; else it is never used */
    if (p->qp2 && in.qpn2)
        p->qp2_up = qp_connect(v, p->qp2, v->dev.port2, v->dev.gid_index2, in.qpn2, in.gid2,
                               in.lid2, (int)in.mtu) == PT_OK;
    p->msg_rails = p->qp2_up && v->dev.profile == VB_UC ? 2 : 1;
    /* receives only now, in RTS (Thunderbolt RDMA refuses them before) */
    for (int i = 0; i < VB_RECV; i++)
        if (post_recv(v, p, i) != PT_OK)
            return PT_ERR_SYS;
    atomic_store(&p->up, 1);
    ctx->peers[rank].ops = &pt_transport_verbs;
    return PT_OK;
}

const char *pt_ctx_verbs_profile(pt_ctx_t *ctx)
{
    if (!ctx || !ctx->verbs)
        return NULL;
    return ctx->verbs->dev.profile == VB_RC ? "rc" : "uc-send";
}

/* Wait for w; helps polling; the peer's loss, its failure and the timeout end it. */
pt_status_t pt__verbs_wait(pt_ctx_t *ctx, vb_peer_t *p, vb_wait_t *w)
{
    pt_verbs_t *v = ctx->verbs;
    double start = pt__now(), spin = pt__spin_seconds();
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&w->done, memory_order_acquire))
            return w->status;
        if (poll_all(ctx, v))
            continue;
        double el = pt__now() - start;
        if (el < spin) {
            pt__relax(el);
            continue;
        }
        if (pt_ctx_peer_lost(ctx, p->rank)) {
            pt__verbs_peer_fail(ctx, p, PT_ERR_PEER_LOST);
            continue;
        }
        if (el > ctx->timeout) {
            pt__verbs_peer_fail(ctx, p, PT_ERR_TIMEOUT); /* a silent peer */
            continue;
        }
        pt_plat_wait(&w->done, 0, 200e-6, 0);
    }
}

/* A free slot for w (p->lock held); -1 when none. */
static int take_slot(vb_peer_t *p, vb_wait_t *w)
{
    for (int s = 0; s < VB_SLOTS; s++)
        if (!p->slots[s]) {
            p->slots[s] = w;
            return s;
        }
    return -1;
}

/* Wait (unlocked) until cond holds under the lock, or the peer fails or times out. */
#define WAIT_UNTIL(ctx, p, cond, st)                                                     \
    do {                                                                                 \
        double t0_ = pt__now();                                                          \
        while (!(cond)) {                                                                \
            if (!atomic_load(&(p)->up)) {                                                \
                st = (p)->fail;                                                          \
                break;                                                                   \
            }                                                                            \
            pthread_mutex_unlock(&(p)->lock);                                            \
            if (!poll_all(ctx, (ctx)->verbs) && !poll_send(ctx, (ctx)->verbs))           \
                nap(20e-6);                                                              \
            double el_ = pt__now() - t0_;                                                \
            if (el_ > (ctx)->timeout)                                                    \
                pt__verbs_peer_fail(ctx, p, PT_ERR_TIMEOUT);                             \
            pthread_mutex_lock(&(p)->lock);                                              \
        }                                                                                \
    } while (0)

/* One frame out (request or reply). */
static pt_status_t send_frame(pt_ctx_t *ctx, vb_peer_t *p, int rail, const vb_hdr_t *h,
                              const void *payload, size_t plen, int imm_slot)
{
    pt_verbs_t *v = ctx->verbs;
    pt_status_t st = PT_OK;
    int depth = sq_depth(v);
    pthread_mutex_lock(&p->lock);
    int *used = rail ? &p->sq_used2 : &p->sq_used;
    WAIT_UNTIL(ctx, p, p->nfree > 0 && *used < depth, st);
    if (st != PT_OK || !atomic_load(&p->up)) {
        pthread_mutex_unlock(&p->lock);
        return st != PT_OK ? st : p->fail;
    }
    int f = p->send_free[--p->nfree];
    uint8_t *frame = p->send + (size_t)f * VB_FRAME;
    memcpy(frame, h, sizeof(*h));
    if (plen)
        memcpy(frame + sizeof(*h), payload, plen);
    /* one whole frame each way: a SEND and its RECV cover the same 4 KiB */
    pt_ibv_sge_t sge = {.addr = (uint64_t)(uintptr_t)frame, .length = VB_FRAME,
                        .lkey = v->stage_mr->lkey};
    pt_ibv_send_wr_t wr = {.wr_id = WRID(p->rank, f | rail << 8, 2), .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = PT_IBV_WR_SEND, .send_flags = PT_IBV_SEND_SIGNALED};
    if (imm_slot >= 0) { /* rc: into the peer's notify slot; the immediate says which */
        sge.length = (uint32_t)(sizeof(*h) + plen);
        wr.opcode = PT_IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl((uint32_t)imm_slot);
        wr.wr.rdma.remote_addr = p->rimm_addr + (uint64_t)imm_slot * VB_FRAME;
        wr.wr.rdma.rkey = p->rimm_rkey;
    }
    pt_ibv_send_wr_t *bad = NULL;
    (*used)++;
    int rc = pt_ibv_post_send(rail ? p->qp2 : p->qp, &wr, &bad);
    if (rc) {
        (*used)--;
        p->send_free[p->nfree++] = f;
    }
    pthread_mutex_unlock(&p->lock);
    if (rc) {
        pt__verbs_peer_fail(ctx, p, PT_ERR_PEER_LOST);
        return PT_ERR_PEER_LOST;
    }
    return PT_OK;
}

pt_status_t pt__verbs_start(pt_ctx_t *ctx, vb_peer_t *p, vb_hdr_t *h, const void *payload,
                            size_t plen, vb_wait_t *w)
{
    pt_status_t st = PT_OK;
    atomic_store(&w->done, 0);
    w->status = PT_OK;
    pthread_mutex_lock(&p->lock);
    int s = -1;
    /* two message rails: the one with fewer requests in flight, half the window each */
    int rail = 0;
    if (p->msg_rails == 2) {
        WAIT_UNTIL(ctx, p, (p->inflight_rail[0] < VB_WINDOW / 2 ||
                            p->inflight_rail[1] < VB_WINDOW / 2) &&
                               (s = take_slot(p, w)) >= 0, st);
        rail = p->inflight_rail[1] < p->inflight_rail[0];
    } else {
        WAIT_UNTIL(ctx, p, p->inflight < VB_WINDOW && (s = take_slot(p, w)) >= 0, st);
    }
    if (st != PT_OK || s < 0) {
        pthread_mutex_unlock(&p->lock);
        return st != PT_OK ? st : p->fail;
    }
    p->inflight++;
    p->inflight_rail[rail]++;
    w->rail = rail;
    p->striped += rail;
    w->id = h->id = (++p->next_id << 4) | (uint64_t)s;
    pthread_mutex_unlock(&p->lock);
    h->len = h->op == VB_PUT ? plen : h->len;
    int imm = h->op == VB_NOTIFY && p->rimm_rkey ? s : -1;
    st = send_frame(ctx, p, rail, h, payload, plen, imm);
    if (st != PT_OK) {
        pthread_mutex_lock(&p->lock);
        if (p->slots[s] == w) {
            p->slots[s] = NULL;
            p->inflight--;
            p->inflight_rail[rail]--;
        }
        pthread_mutex_unlock(&p->lock);
    }
    return st;
}

pt_status_t pt__verbs_call(pt_ctx_t *ctx, vb_peer_t *p, vb_hdr_t *h, const void *payload,
                           size_t plen, vb_wait_t *w)
{
    pt_status_t st = pt__verbs_start(ctx, p, h, payload, plen, w);
    return st != PT_OK ? st : pt__verbs_wait(ctx, p, w);
}

pt_status_t pt__verbs_reply(pt_ctx_t *ctx, vb_peer_t *p, int rail, vb_hdr_t *h,
                            const void *payload, size_t plen)
{
    h->op |= VB_REPLY;
    return send_frame(ctx, p, rail && p->qp2_up, h, payload, plen, -1);
}

pt_status_t pt__verbs_rdma_start(pt_ctx_t *ctx, vb_peer_t *p, int rail, pt_ibv_send_wr_t *wrs,
                                 int n, vb_wait_t *w)
{
    pt_verbs_t *v = ctx->verbs;
    memset(w, 0, sizeof(*w));
    pt_status_t st = PT_OK;
    int depth = sq_depth(v);
    pthread_mutex_lock(&p->lock);
    int *used = rail ? &p->sq_used2 : &p->sq_used;
    int s = -1;
    WAIT_UNTIL(ctx, p, *used + n <= depth && (s = take_slot(p, w)) >= 0, st);
    if (st != PT_OK || s < 0) {
        pthread_mutex_unlock(&p->lock);
        return st != PT_OK ? st : p->fail;
    }
    /* selective signalling: only the last; RC completes in order */
    for (int i = 0; i < n; i++) {
        wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
        wrs[i].send_flags &= ~(unsigned)PT_IBV_SEND_SIGNALED;
        wrs[i].wr_id = 0;
    }
    wrs[n - 1].send_flags |= PT_IBV_SEND_SIGNALED;
    w->wr_id = wrs[n - 1].wr_id = WRID(p->rank, s, 3);
    w->nwr = n;
    w->rail = rail;
    *used += n;
    pt_ibv_send_wr_t *bad = NULL;
    int rc = pt_ibv_post_send(rail ? p->qp2 : p->qp, wrs, &bad);
    if (rc) {
        *used -= n;
        p->slots[s] = NULL;
    }
    pthread_mutex_unlock(&p->lock);
    if (rc) {
        pt__verbs_peer_fail(ctx, p, PT_ERR_PEER_LOST);
        return PT_ERR_PEER_LOST;
    }
    return PT_OK;
}

pt_status_t pt__verbs_rdma(pt_ctx_t *ctx, vb_peer_t *p, pt_ibv_send_wr_t *wrs, int n)
{
    vb_wait_t w;
    pt_status_t st = pt__verbs_rdma_start(ctx, p, 0, wrs, n, &w);
    return st != PT_OK ? st : pt__verbs_wait(ctx, p, &w);
}

/* pt_ctx_destroy: the poller stops; every peer's waiters fail (closed). */
void pt__verbs_stop(pt_ctx_t *ctx)
{
    pt_verbs_t *v = ctx->verbs;
    if (!v)
        return;
    atomic_store(&v->stopping, 1);
    if (v->started)
        pthread_join(v->thread, NULL);
    v->started = 0;
    for (int r = 0; r < ctx->size; r++)
        if (v->peers[r].qp)
            pt__verbs_peer_fail(ctx, &v->peers[r], PT_ERR_CLOSED);
}

void pt__verbs_release(pt_ctx_t *ctx)
{
    pt_verbs_t *v = ctx->verbs;
    if (!v)
        return;
    const pt_verbs_lib_t *lib = v->dev.lib;
    for (int r = 0; r < ctx->size; r++)
        for (int k = 0; k < 2; k++) {
            pt_ibv_qp_t *qp = k ? v->peers[r].qp2 : v->peers[r].qp;
            if (qp)
                lib->destroy_qp(qp); /* (never moved to ERR first) */
        }
    for (int k = 0; k < PT_MAX_REGS; k++)
        if (v->mrs[k].mr)
            lib->dereg_mr(v->mrs[k].mr);
    for (int r = 0; r < ctx->size; r++)
        if (v->peers[r].imm_mr)
            lib->dereg_mr(v->peers[r].imm_mr);
    free(v->imm);
    lib->dereg_mr(v->stage_mr);
    lib->destroy_cq(v->scq);
    lib->destroy_cq(v->rcq);
    pt__verbs_dev_close(&v->dev);
    free(v->stage);
    free(v->peers);
    free(v);
    ctx->verbs = NULL;
}

const char *pt_ctx_verbs_device(pt_ctx_t *ctx)
{
    static _Thread_local char buf[128];
    if (!ctx || !ctx->verbs)
        return NULL;
    pt_verbs_t *v = ctx->verbs;
    int rails = 1;
    uint64_t striped = 0;
    for (int r = 0; r < ctx->size; r++) {
        rails = v->peers[r].qp2_up ? 2 : rails;
        striped += v->peers[r].striped;
    }
    snprintf(buf, sizeof(buf), "%s %d %d rails=%d striped=%llu", v->dev.name, v->dev.port,
             v->dev.gid_index, rails, (unsigned long long)striped);
    return buf;
}
