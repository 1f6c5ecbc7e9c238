/* Private to the verbs transport: the device this context uses, one queue pair per peer, and
 * the message layer both profiles share.
 *
 * Profiles (chosen from what the device accepts: an RC queue pair is tried, UC-SEND is the
 * fallback, $POOLTENSOR_VERBS_PROFILE=rc|uc forces one):
 * - rc: get/put as RDMA READ/WRITE (chunks, only the last signalled), small puts inline;
 *   the target's registrations are resolved once per key by a message (the target registers
 *   a memory region for exactly that registration, so the NIC checks key, bounds and mode);
 *   atomics as verbs atomics where the device's are coherent with the CPU's (atomic_cap GLOB),
 *   else messages; notify as a message.
 * - uc: everything a message, served at the target by its progress thread (Apple's
 *   Thunderbolt RDMA: UC queue pairs, SEND/RECV only, 4 KiB frames, ~32 WRs a queue).
 * Messages: one 4 KiB frame each way (a request, its reply), at most VB_WINDOW requests in
 * flight per peer, so the peer always has a receive posted for each (UC drops a SEND that
 * finds none). Every completion's status is checked; an error, or no answer within the
 * context's timeout, ends the peer's verbs connection: the operation fails (PT_ERR_PEER_LOST /
 * PT_ERR_TIMEOUT) and the peer is reached over tcp from then on. */
#ifndef PT_VERBS_H
#define PT_VERBS_H

#include "core/transport.h"
#include "transport/verbs/verbs_lib.h"

#define VB_FRAME 4096u
#define VB_RECV 16                 /* receives posted per peer */
#define VB_SEND 16                 /* send frames per peer */
#define VB_WINDOW 6                /* requests in flight per peer (replies need room too) */
#define VB_SLOTS 16                /* waits per peer (requests and RDMA operations) */
#define VB_BOUNCE (1u << 20)       /* rc: staging for READ/WRITE, per peer */
#define VB_CHUNK (256u << 10)      /* rc: bytes per READ/WRITE work request */
#define VB_INLINE 64               /* rc: puts up to this size go inline */
#define VB_STRIPE (2 * VB_CHUNK)   /* rc: transfers from this size are striped over two rails */

enum { VB_RC = 1, VB_UC = 2 };

/* Message operations (a reply is op | VB_REPLY). In the rc profile a notify request is
 * written into the peer's notify slots with WRITE_WITH_IMM (the slot in the immediate); every
 * other message is a SEND. */
enum {
    VB_RESOLVE = 1, VB_GET, VB_PUT, VB_FADD, VB_CSWAP, VB_NOTIFY, VB_REPLY = 0x80
};

typedef struct {
    uint32_t op, status;
    uint64_t id;
    uint64_t key, off, len;
    int64_t a, b;
    uint64_t rkey, addr;           /* resolve's answer */
} vb_hdr_t;

#define VB_PAYLOAD (VB_FRAME - sizeof(vb_hdr_t))

/* What a peer needs to reach our queue pair (exchanged through the bootstrap). */
typedef struct {
    uint32_t magic, qpn, profile, port;
    uint8_t gid[16];
    uint32_t mtu, gid_index;
    uint32_t qpn2, port2;          /* a second rail (rc), or qpn2 = 0 */
    uint8_t gid2[16];
    uint64_t imm_addr;             /* rc: where our notify requests to it are written */
    uint32_t imm_rkey;
    uint16_t lid, lid2;            /* InfiniBand: the ports' LIDs (routing inside a subnet) */
} vb_info_t;

typedef struct {
    const pt_verbs_lib_t *lib;
    pt_ibv_context_t *ctx;
    pt_ibv_pd_t *pd;
    char name[64];
    int port, gid_index, gid_type, link_layer, mtu, lid, lid2;
    pt_ibv_gid_t gid;
    pt_ibv_device_attr_t attr;
    int profile;
    int port2, gid_index2;         /* a second active port of the device (a rail), or 0 */
    pt_ibv_gid_t gid2;
} vb_dev_t;

/* A request waiting for its reply (or an RDMA operation for its completion). */
typedef struct {
    _Atomic uint32_t done;
    pt_status_t status;
    uint64_t id, wr_id;            /* its request's id; its signalled work request's wr_id */
    int nwr;                       /* work requests that completion covers */
    int rail;                      /* the queue pair they went on (0, or 1: qp2) */
    vb_hdr_t reply;
    void *dst;                     /* get: where the reply's payload goes */
    size_t dst_len;
} vb_wait_t;

typedef struct {
    uint64_t key, addr, len, rkey;
    uint32_t access;
} vb_remote_t;

typedef struct vb_peer {
    int rank;
    pt_ibv_qp_t *qp;
    pt_ibv_qp_t *qp2;              /* the second rail, once connected on both ends */
    int qp2_up;
    int msg_rails;                 /* uc: 2 when messages alternate over both rails (each
                                      rail then holds half the receives, half the window) */
    uint64_t striped;              /* bounce chunks sent over both rails (tests, stats) */
    _Atomic int up;                /* connected and not failed */
    pt_status_t fail;
    pthread_mutex_t lock;          /* the fields below, and the send queue */
    pthread_mutex_t op_lock;       /* one rc bulk transfer at a time (the bounce buffer) */
    uint8_t *recv, *send, *bounce; /* in the context's staging region */
    /* rc: the peer writes its notify requests into imm (slot i at frame i) with
     * WRITE_WITH_IMM, the slot in the immediate; we write ours at rimm_addr */
    uint8_t *imm;
    pt_ibv_mr_t *imm_mr;
    uint64_t rimm_addr;
    uint32_t rimm_rkey;
    int send_free[VB_SEND], nfree;
    int sq_used, sq_used2;         /* work requests posted, not yet completed (per rail) */
    int inflight, inflight_rail[2];/* requests awaiting a reply (all, per rail) */
    vb_wait_t *slots[VB_SLOTS];
    uint64_t next_id;
    vb_remote_t cache[64];         /* rc: resolved registrations */
} vb_peer_t;

typedef struct pt_verbs {
    vb_dev_t dev;
    pt_ibv_cq_t *scq, *rcq;
    pt_ibv_mr_t *stage_mr;
    int inline_max;                /* rc: the inline size every queue pair was granted */
    uint8_t *stage;
    size_t stage_len;
    uint8_t *imm;                  /* rc: every peer's notify slots (VB_SLOTS frames each) */
    vb_peer_t *peers;              /* by rank */
    pthread_mutex_t poll_lock;
    pthread_t thread;
    int started;
    _Atomic int stopping;
    pthread_mutex_t mr_lock;       /* rc: regions made for our registrations */
    struct {
        uint64_t key;
        pt_ibv_mr_t *mr;
    } mrs[PT_MAX_REGS];
} pt_verbs_t;

extern const pt_transport_ops_t pt_transport_verbs;

/* verbs_dev.c: open the device (choose device, port, GID; probe the profile). On failure
 * `why` says what is missing in one line. */
pt_status_t pt__verbs_dev_open(vb_dev_t *d, char *why, size_t whylen);
void pt__verbs_dev_close(vb_dev_t *d);
const char *pt__verbs_wc_str(int status);

/* verbs_conn.c */
pt_verbs_t *pt__verbs_get(pt_ctx_t *ctx, pt_status_t *st);
/* Send one request to the peer and wait for its reply (payload: put data; w->dst: get). */
pt_status_t pt__verbs_call(pt_ctx_t *ctx, vb_peer_t *p, vb_hdr_t *h, const void *payload,
                           size_t plen, vb_wait_t *w);
/* Start a request; the caller waits with pt__verbs_wait. */
pt_status_t pt__verbs_start(pt_ctx_t *ctx, vb_peer_t *p, vb_hdr_t *h, const void *payload,
                            size_t plen, vb_wait_t *w);
pt_status_t pt__verbs_wait(pt_ctx_t *ctx, vb_peer_t *p, vb_wait_t *w);
/* Post RDMA work requests (rc) on rail 0 or 1; w completes with the last, signalled one. */
pt_status_t pt__verbs_rdma_start(pt_ctx_t *ctx, vb_peer_t *p, int rail, pt_ibv_send_wr_t *wrs,
                                 int n, vb_wait_t *w);
/* The same, waited for (rail 0). */
pt_status_t pt__verbs_rdma(pt_ctx_t *ctx, vb_peer_t *p, pt_ibv_send_wr_t *wrs, int n);
/* The peer's verbs connection failed with st: its waiters fail, tcp reaches it from now on. */
void pt__verbs_peer_fail(pt_ctx_t *ctx, vb_peer_t *p, pt_status_t st);
/* Serve one request frame addressed to us (in the poller). */
void pt__verbs_serve(pt_ctx_t *ctx, vb_peer_t *p, int rail, const vb_hdr_t *h,
                     const uint8_t *payload);
/* Send a reply frame (poller). */
pt_status_t pt__verbs_reply(pt_ctx_t *ctx, vb_peer_t *p, int rail, vb_hdr_t *h,
                            const void *payload,
                            size_t plen);
void pt__verbs_forget(pt_ctx_t *ctx, uint64_t key);
void pt__verbs_stop(pt_ctx_t *ctx);
void pt__verbs_release(pt_ctx_t *ctx);

#endif
