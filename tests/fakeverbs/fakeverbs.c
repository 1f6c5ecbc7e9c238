/* A simulated verbs provider, for tests only: the entry points of libibverbs that pooltensor's
 * verbs transport uses, backed by a fabric in shared memory between the processes of a test
 * ($POOLTENSOR_FAKEVERBS_FABRIC, a file every process maps). It checks our verbs logic, not
 * hardware: nothing here is a NIC.
 *
 * Work requests are carried out by the process that posts them: the bytes move between
 * processes with process_vm_readv/writev, checked against the fabric's tables of memory
 * regions (key, bounds, access) as a NIC checks them; completions go into completion queues in
 * the fabric, so a peer's receive completions appear in its queue. What the hardware enforces,
 * it enforces, per $POOLTENSOR_FAKEVERBS_PROFILE:
 *   rc    (InfiniBand / RoCE v2): RC and UC queue pairs, SEND/RECV, RDMA READ/WRITE,
 *         WRITE_WITH_IMM, 64-bit atomics (atomic_cap HCA: atomic among the device's own
 *         atomics only), 1024 WRs per queue, RNR retry exhaustion on a SEND that finds no
 *         receive posted.
 *   apple (Thunderbolt 5 RDMA): UC only (an RC queue pair fails at RTR), SEND/RECV only, a SEND
 *         and its RECV must cover the same number of 4 KiB frames, 32 WRs per queue, 100
 *         memory regions per device, no post_recv before RTS, no move to ERR before destroy,
 *         GID 1 is the IPv4-mapped one (absent with $POOLTENSOR_FAKEVERBS_IPV4=0), port 1 is
 *         down and the link is on port 2.
 * rc with $POOLTENSOR_FAKEVERBS_ATOMICS=glob reports atomic_cap GLOB, so that the transport
 * uses verbs atomics: they are then atomic among the fabric's atomics only (not against the
 * target's own CPU), so a test that uses it must not mix the two on one word.
 * rc with $POOLTENSOR_FAKEVERBS_LINK=ib is InfiniBand: ports have LIDs (one per process and
 * port), GID 0 is the port's fe80:: GID of type IB, and RTR needs the destination's LID.
 * Both: $POOLTENSOR_FAKEVERBS_PORTS=2 gives two active ports (two rails);
 * $POOLTENSOR_FAKEVERBS_DEVICES=0 gives no device at all. Send queue slots are freed only when
 * a signalled completion covering them is polled (selective signalling must be bounded).
 *
 * Faults (fakeverbs_fault, called by tests through ctypes):
 *   FV_FAULT_FAIL n   the next n work requests posted by pid complete with RETRY_EXC_ERR and
 *                     their queue pair goes to ERR (later ones are flushed)
 *   FV_FAULT_FLUSH    every queue pair of pid goes to ERR; its posted receives are flushed
 *   FV_FAULT_SILENT   pid's queue pairs stop answering: work requests to them vanish, no
 *                     completion ever comes (n = 0 ends it)
 *   FV_FAULT_QPERR    pid's queue pairs go to ERR without a completion: what is sent to them
 *                     fails (RC: RETRY_EXC_ERR at the sender) or vanishes (UC). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fv_compat.h"

#define FV_MAGIC 0x6676616272696331ULL
#define FV_MAX_QP 512
#define FV_MAX_CQ 512
#define FV_MAX_MR 4096
#define FV_RQ 1024
#define FV_CQE 2048
#define FV_FRAME 4096

enum { FV_FAULT_FAIL = 1, FV_FAULT_FLUSH = 2, FV_FAULT_SILENT = 3, FV_FAULT_QPERR = 4 };

typedef struct {
    uint64_t wr_id, addr;
    uint32_t len, lkey;
} fv_rwqe_t;

typedef struct {
    int used, pid, type, state, port, silent;
    uint32_t qpn, dest_qpn;
    int send_cq, recv_cq, max_send, max_recv, sig_all, max_inline;
    int sq_used, sq_pending;          /* slots in use; unsignalled WRs since the last signal */
    uint32_t rq_head, rq_tail;
    fv_rwqe_t rq[FV_RQ];
} fv_qp_t;

typedef struct {
    uint64_t wr_id;
    int status, opcode;
    uint32_t byte_len, imm, qp_num, src_qp, flags;
    int sq_release;                   /* send slots this completion frees once polled */
    int qp_slot;
} fv_wc_t;

typedef struct {
    int used, pid;
    uint32_t head, tail;
    fv_wc_t wc[FV_CQE];
} fv_cq_t;

typedef struct {
    int used, pid, access;
    uint64_t addr, len;
    uint32_t key;
} fv_mr_t;

typedef struct {
    uint64_t magic;
    pthread_mutex_t lock;
    uint32_t next_key, next_qpn;
    int fail_pid, fail_left;
    uint64_t atomics;                 /* atomic work requests carried out (tests) */
    uint64_t write_imm;               /* WRITE_WITH_IMM work requests delivered (tests) */
    fv_qp_t qp[FV_MAX_QP];
    fv_cq_t cq[FV_MAX_CQ];
    fv_mr_t mr[FV_MAX_MR];
} fv_fabric_t;

static fv_fabric_t *fab;
static int apple;
static int nports = 1;
static int ipv4 = 1;
static int ndevices = 1;
static int ib;
static pthread_once_t once = PTHREAD_ONCE_INIT;

struct fv_dev {
    char name[32];
};
static struct fv_dev dev0;
static struct ibv_device *devlist[2];

typedef struct {
    struct ibv_context c;
    int nmr;
} fv_ctx_t;
typedef struct {
    struct ibv_cq cq;
    int slot;
} fv_cqh_t;
typedef struct {
    struct ibv_qp qp;
    int slot;
} fv_qph_t;
typedef struct {
    struct ibv_mr mr;
    int slot;
} fv_mrh_t;

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

static void lock(void)
{
    if (pthread_mutex_lock(&fab->lock) == EOWNERDEAD)
        pthread_mutex_consistent(&fab->lock);
}

static void unlock(void) { pthread_mutex_unlock(&fab->lock); }

static int alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

static void setup(void)
{
    const char *prof = getenv("POOLTENSOR_FAKEVERBS_PROFILE");
    apple = prof && strcmp(prof, "apple") == 0;
    nports = env_int("POOLTENSOR_FAKEVERBS_PORTS", 1) >= 2 ? 2 : 1;
    ipv4 = env_int("POOLTENSOR_FAKEVERBS_IPV4", 1);
    ndevices = env_int("POOLTENSOR_FAKEVERBS_DEVICES", 1);
    const char *link = getenv("POOLTENSOR_FAKEVERBS_LINK");
    ib = !apple && link && strcmp(link, "ib") == 0;
    snprintf(dev0.name, sizeof(dev0.name), "%s", apple ? "rdma_en5" : "fakerc0");
    const char *path = getenv("POOLTENSOR_FAKEVERBS_FABRIC");
    char def[128];
    if (!path || !*path) {
        snprintf(def, sizeof(def), "/dev/shm/pt-fakeverbs-%d", (int)getuid());
        path = def;
    }
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return;
    flock(fd, LOCK_EX);
    struct stat st;
    fstat(fd, &st);
    if ((size_t)st.st_size < sizeof(fv_fabric_t) && ftruncate(fd, sizeof(fv_fabric_t)) != 0) {
        flock(fd, LOCK_UN);
        close(fd);
        return;
    }
    fv_fabric_t *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (f != MAP_FAILED && f->magic != FV_MAGIC) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&f->lock, &a);
        f->next_key = 0x100;
        f->next_qpn = 0x40;
        f->magic = FV_MAGIC;
    }
    flock(fd, LOCK_UN);
    close(fd);
    fab = f == MAP_FAILED ? NULL : f;
}

/* ---- devices and ports ---- */
struct ibv_device **ibv_get_device_list(int *n)
{
    pthread_once(&once, setup);
    int k = fab && ndevices > 0 ? 1 : 0;
    devlist[0] = k ? (struct ibv_device *)&dev0 : NULL;
    devlist[1] = NULL;
    if (n)
        *n = k;
    if (!fab)
        errno = ENOSYS;
    return devlist;
}

void ibv_free_device_list(struct ibv_device **list) {}

const char *ibv_get_device_name(struct ibv_device *d) { return ((struct fv_dev *)d)->name; }

static int fv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int fv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int fv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

struct ibv_context *ibv_open_device(struct ibv_device *d)
{
    fv_ctx_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->c.device = d;
    c->c.ops.poll_cq = fv_poll_cq;
    c->c.ops.post_send = fv_post_send;
    c->c.ops.post_recv = fv_post_recv;
    c->c.cmd_fd = -1;
    c->c.async_fd = -1;
    return &c->c;
}

int ibv_close_device(struct ibv_context *c)
{
    free(c);
    return 0;
}

int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "fakeverbs-%s", apple ? "apple" : "rc");
    a->max_mr_size = 1ULL << 40;
    a->max_qp = FV_MAX_QP;
    a->max_qp_wr = apple ? 32 : 1024;
    a->max_sge = 4;
    a->max_cq = FV_MAX_CQ;
    a->max_cqe = FV_CQE;
    a->max_mr = apple ? 100 : FV_MAX_MR;
    a->max_pd = 64;
    a->max_qp_rd_atom = apple ? 0 : 16;
    a->max_qp_init_rd_atom = apple ? 0 : 16;
    const char *atom = getenv("POOLTENSOR_FAKEVERBS_ATOMICS");
    a->atomic_cap = apple                              ? IBV_ATOMIC_NONE
                    : atom && strcmp(atom, "glob") == 0 ? IBV_ATOMIC_GLOB
                                                        : IBV_ATOMIC_HCA;
    a->phys_port_cnt = apple ? 2 : (uint8_t)nports;
    a->vendor_id = apple ? 0x106b : 0x15b3;
    return 0;
}

/* The LID of pid's port (InfiniBand). */
static uint16_t lid_of(int pid, int port) { return (uint16_t)(1 + (pid * 2 + port) % 48000); }

static int port_up(int port)
{
    if (apple)
        return port == 2 || (port == 1 && nports == 2);
    return port >= 1 && port <= nports;
}

int ibv_query_port(struct ibv_context *c, uint8_t port, fv_port_attr_arg *arg)
{
    struct ibv_port_attr *a = (struct ibv_port_attr *)arg;
    int ports = apple ? 2 : nports;
    if (port < 1 || port > ports)
        return EINVAL;
    memset(a, 0, sizeof(*a));
    a->state = port_up(port) ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = apple ? IBV_MTU_4096 : IBV_MTU_1024;
    a->gid_tbl_len = 2;
    a->max_msg_sz = 1u << 30;
    a->link_layer = ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
    a->lid = ib ? lid_of(getpid(), port) : 0;
    a->phys_state = port_up(port) ? 5 : 3;
    return 0;
}

/* GID 0: link-local IPv6 (fe80::); GID 1: ::ffff:10.<port>.0.1, RoCE v2 (unless IPv4 is off;
 * none on InfiniBand). */
static int gid_of(int port, int index, union ibv_gid *g)
{
    memset(g, 0, sizeof(*g));
    if (ib && index == 1)
        return 0;
    if (index == 0) {
        g->raw[0] = 0xfe;
        g->raw[1] = 0x80;
        g->raw[15] = (uint8_t)port;
        return 0;
    }
    if (index == 1 && ipv4) {
        g->raw[10] = g->raw[11] = 0xff;
        g->raw[12] = 10;
        g->raw[13] = (uint8_t)port;
        g->raw[15] = 1;
        return 0;
    }
    return index == 1 ? 0 : EINVAL; /* an empty entry (all zero) */
}

int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *g)
{
    return gid_of(port, index, g);
}

int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
                      struct ibv_gid_entry *e, uint32_t flags, size_t size)
{
    memset(e, 0, size);
    int rc = gid_of((int)port, (int)index, &e->gid);
    if (rc)
        return rc;
    static const uint8_t zero[16];
    if (memcmp(e->gid.raw, zero, 16) == 0)
        return ENODATA;
    e->gid_index = index;
    e->port_num = port;
    e->gid_type = ib ? IBV_GID_TYPE_IB : IBV_GID_TYPE_ROCE_V2;
    return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd)
        pd->context = c;
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

/* ---- memory regions ---- */
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    fv_ctx_t *c = (fv_ctx_t *)pd->context;
    if (apple && c->nmr >= 100) {
        errno = ENOMEM;
        return NULL;
    }
    fv_mrh_t *h = calloc(1, sizeof(*h));
    if (!h) {
        errno = ENOMEM;
        return NULL;
    }
    lock();
    int s = -1;
    for (int i = 0; i < FV_MAX_MR && s < 0; i++)
        if (!fab->mr[i].used || !alive(fab->mr[i].pid))
            s = i;
    if (s < 0) {
        unlock();
        free(h);
        errno = ENOMEM;
        return NULL;
    }
    fv_mr_t *m = &fab->mr[s];
    m->used = 1;
    m->pid = getpid();
    m->addr = (uint64_t)(uintptr_t)addr;
    m->len = len;
    m->access = access;
    m->key = ((fab->next_key++) << 12) | (uint32_t)s;
    unlock();
    c->nmr++;
    h->slot = s;
    h->mr.context = pd->context;
    h->mr.pd = pd;
    h->mr.addr = addr;
    h->mr.length = len;
    h->mr.lkey = h->mr.rkey = m->key;
    return &h->mr;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    fv_mrh_t *h = (fv_mrh_t *)mr;
    lock();
    fab->mr[h->slot].used = 0;
    fab->mr[h->slot].key = 0;
    unlock();
    ((fv_ctx_t *)mr->context)->nmr--;
    free(h);
    return 0;
}

/* The region of pid under key covering [addr, addr+len) with access `need` (lock held). */
static int mr_ok(int pid, uint32_t key, uint64_t addr, uint64_t len, int need)
{
    fv_mr_t *m = &fab->mr[key & 0xfff];
    if ((key & 0xfff) >= FV_MAX_MR || !m->used || m->key != key || m->pid != pid)
        return 0;
    if (addr < m->addr || len > m->len || addr - m->addr > m->len - len)
        return 0;
    return (m->access & need) == need;
}

/* ---- completion queues ---- */
struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int vec)
{
    fv_cqh_t *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    lock();
    int s = -1;
    for (int i = 0; i < FV_MAX_CQ && s < 0; i++)
        if (!fab->cq[i].used || !alive(fab->cq[i].pid))
            s = i;
    if (s >= 0) {
        memset(&fab->cq[s], 0, sizeof(fab->cq[s]));
        fab->cq[s].used = 1;
        fab->cq[s].pid = getpid();
    }
    unlock();
    if (s < 0) {
        free(h);
        errno = ENOMEM;
        return NULL;
    }
    h->slot = s;
    h->cq.context = c;
    h->cq.cq_context = cq_context;
    h->cq.cqe = cqe;
    return &h->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    fv_cqh_t *h = (fv_cqh_t *)cq;
    lock();
    fab->cq[h->slot].used = 0;
    unlock();
    free(h);
    return 0;
}

/* lock held */
static void cq_push(int cq, const fv_wc_t *wc)
{
    fv_cq_t *q = &fab->cq[cq];
    if (q->tail - q->head >= FV_CQE)
        return; /* overrun: the completion is lost, as on a real queue */
    q->wc[q->tail++ % FV_CQE] = *wc;
}

static int fv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *out)
{
    fv_cq_t *q = &fab->cq[((fv_cqh_t *)cq)->slot];
    if (q->head == q->tail)
        return 0; /* (a racy peek: the lock below decides) */
    int k = 0;
    lock();
    for (; k < n && q->head != q->tail; k++) {
        fv_wc_t *w = &q->wc[q->head++ % FV_CQE];
        memset(&out[k], 0, sizeof(out[k]));
        out[k].wr_id = w->wr_id;
        out[k].status = w->status;
        out[k].opcode = w->opcode;
        out[k].byte_len = w->byte_len;
        out[k].imm_data = w->imm;
        out[k].qp_num = w->qp_num;
        out[k].src_qp = w->src_qp;
        out[k].wc_flags = w->flags;
        if (w->sq_release && w->qp_slot >= 0)
            fab->qp[w->qp_slot].sq_used -= w->sq_release;
    }
    unlock();
    return k;
}

/* ---- queue pairs ---- */
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    int maxwr = apple ? 32 : 1024;
    if ((a->qp_type != IBV_QPT_RC && a->qp_type != IBV_QPT_UC) ||
        a->cap.max_send_wr > (uint32_t)maxwr || a->cap.max_recv_wr > (uint32_t)maxwr ||
        !a->send_cq || !a->recv_cq) {
        errno = EINVAL;
        return NULL;
    }
    fv_qph_t *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    lock();
    int s = -1;
    for (int i = 0; i < FV_MAX_QP && s < 0; i++)
        if (!fab->qp[i].used || !alive(fab->qp[i].pid))
            s = i;
    if (s >= 0) {
        fv_qp_t *q = &fab->qp[s];
        memset(q, 0, sizeof(*q));
        q->used = 1;
        q->pid = getpid();
        q->type = a->qp_type;
        q->state = IBV_QPS_RESET;
        q->qpn = ((fab->next_qpn++) << 10) | (uint32_t)s;
        q->send_cq = ((fv_cqh_t *)a->send_cq)->slot;
        q->recv_cq = ((fv_cqh_t *)a->recv_cq)->slot;
        q->max_send = (int)a->cap.max_send_wr;
        q->max_recv = (int)a->cap.max_recv_wr;
        q->sig_all = a->sq_sig_all;
        /* inline sends: up to 256 bytes on rc, none on apple; what is granted is written back */
        q->max_inline = apple ? 0 : (int)(a->cap.max_inline_data < 256 ? a->cap.max_inline_data
                                                                         : 256);
        a->cap.max_inline_data = (uint32_t)q->max_inline;
        h->qp.qp_num = q->qpn;
    }
    unlock();
    if (s < 0) {
        free(h);
        errno = ENOMEM;
        return NULL;
    }
    h->slot = s;
    h->qp.context = pd->context;
    h->qp.pd = pd;
    h->qp.send_cq = a->send_cq;
    h->qp.recv_cq = a->recv_cq;
    h->qp.qp_type = a->qp_type;
    h->qp.state = IBV_QPS_RESET;
    return &h->qp;
}

static fv_qp_t *qp_by_num(uint32_t qpn)
{
    fv_qp_t *q = &fab->qp[qpn & 0x3ff];
    return (qpn & 0x3ff) < FV_MAX_QP && q->used && q->qpn == qpn ? q : NULL;
}

/* The queue pair goes to ERR; with flush, its posted receives complete as flushed (lock held). */
static void qp_error(fv_qp_t *q, int flush)
{
    q->state = IBV_QPS_ERR;
    for (; flush && q->rq_head != q->rq_tail; q->rq_head++) {
        fv_wc_t w = {.wr_id = q->rq[q->rq_head % FV_RQ].wr_id, .status = IBV_WC_WR_FLUSH_ERR,
                     .opcode = IBV_WC_RECV, .qp_num = q->qpn, .qp_slot = -1};
        cq_push(q->recv_cq, &w);
    }
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    fv_qph_t *h = (fv_qph_t *)qp;
    int rc = 0;
    lock();
    fv_qp_t *q = &fab->qp[h->slot];
    if (mask & IBV_QP_STATE) {
        int to = a->qp_state;
        if (to == IBV_QPS_ERR && apple) {
            fprintf(stderr, "fakeverbs: apple profile: a QP may not be moved to ERR\n");
            rc = EINVAL;
        } else if (to == IBV_QPS_INIT) {
            if (!(mask & IBV_QP_PORT) || !port_up(a->port_num))
                rc = EINVAL;
            else
                q->port = a->port_num;
        } else if (to == IBV_QPS_RTR) {
            if (q->state != IBV_QPS_INIT || !(mask & IBV_QP_DEST_QPN) || !(mask & IBV_QP_AV))
                rc = EINVAL;
            else if (apple && q->type == IBV_QPT_RC)
                rc = EINVAL; /* Thunderbolt RDMA refuses RC here */
            else if (apple && !(a->ah_attr.is_global && a->ah_attr.grh.dgid.raw[10] == 0xff &&
                                a->ah_attr.grh.dgid.raw[11] == 0xff))
                rc = EINVAL; /* a GID that is not IPv4-mapped does not route */
            else if (ib && (!qp_by_num(a->dest_qp_num) ||
                            a->ah_attr.dlid != lid_of(qp_by_num(a->dest_qp_num)->pid,
                                                      qp_by_num(a->dest_qp_num)->port)))
                rc = EINVAL; /* InfiniBand routes by the destination's LID */
            else
                q->dest_qpn = a->dest_qp_num;
        } else if (to == IBV_QPS_RTS) {
            if (q->state != IBV_QPS_RTR)
                rc = EINVAL;
        } else if (to == IBV_QPS_ERR) {
            qp_error(q, 1);
        }
        if (!rc && to != IBV_QPS_ERR)
            q->state = to;
        if (!rc)
            qp->state = to;
    }
    unlock();
    return rc;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    fv_qph_t *h = (fv_qph_t *)qp;
    lock();
    fab->qp[h->slot].used = 0;
    fab->qp[h->slot].qpn = 0;
    unlock();
    free(h);
    return 0;
}

/* ---- the data path ---- */
static uint64_t sge_total(const struct ibv_send_wr *wr)
{
    uint64_t n = 0;
    for (int i = 0; i < wr->num_sge; i++)
        n += wr->sg_list[i].length;
    return n;
}

/* Copy between this process's sges and pid's [raddr, raddr+len). */
static int move(int pid, const struct ibv_sge *sg, int nsge, uint64_t raddr, uint64_t len,
                int to_remote)
{
    struct iovec l[8], r = {.iov_base = (void *)(uintptr_t)raddr, .iov_len = len};
    for (int i = 0; i < nsge && i < 8; i++) {
        l[i].iov_base = (void *)(uintptr_t)sg[i].addr;
        l[i].iov_len = sg[i].length;
    }
    if (len == 0)
        return 0;
    ssize_t n = to_remote ? process_vm_writev(pid, l, (unsigned long)nsge, &r, 1, 0)
                          : process_vm_readv(pid, l, (unsigned long)nsge, &r, 1, 0);
    return n == (ssize_t)len ? 0 : -1;
}

/* One work request, carried out now (lock held). Returns the completion status. */
static int execute(fv_qp_t *q, const struct ibv_send_wr *wr, uint32_t *byte_len)
{
    int me = getpid();
    uint64_t total = sge_total(wr);
    *byte_len = (uint32_t)total;
    if (fab->fail_pid == me && fab->fail_left > 0) {
        fab->fail_left--;
        return IBV_WC_RETRY_EXC_ERR;
    }
    for (int i = 0; i < wr->num_sge; i++) {
        int need = wr->opcode == IBV_WR_RDMA_READ || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
                           wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP
                       ? IBV_ACCESS_LOCAL_WRITE
                       : 0;
        if (!(wr->send_flags & IBV_SEND_INLINE) &&
            !mr_ok(me, wr->sg_list[i].lkey, wr->sg_list[i].addr, wr->sg_list[i].length, need))
            return IBV_WC_LOC_PROT_ERR;
    }
    fv_qp_t *d = qp_by_num(q->dest_qpn);
    int rc_type = q->type == IBV_QPT_RC;
    if (!d || !alive(d->pid) || d->state == IBV_QPS_ERR || d->state < IBV_QPS_RTR)
        return rc_type ? IBV_WC_RETRY_EXC_ERR : -1; /* UC: gone without a word */
    if (d->silent)
        return -2;
    int op = wr->opcode;
    if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
        if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            if (!mr_ok(d->pid, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, total,
                       IBV_ACCESS_REMOTE_WRITE))
                return IBV_WC_REM_ACCESS_ERR;
        }
        if (d->rq_head == d->rq_tail)
            return rc_type ? IBV_WC_RNR_RETRY_EXC_ERR : -1; /* UC: dropped */
        fv_rwqe_t *r = &d->rq[d->rq_head % FV_RQ];
        fv_wc_t w = {.wr_id = r->wr_id, .status = IBV_WC_SUCCESS, .byte_len = (uint32_t)total,
                     .qp_num = d->qpn, .src_qp = q->qpn, .qp_slot = -1};
        if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            if (move(d->pid, wr->sg_list, wr->num_sge, wr->wr.rdma.remote_addr, total, 1))
                return IBV_WC_REM_ACCESS_ERR;
            w.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            fab->write_imm++;
        } else {
            w.opcode = IBV_WC_RECV;
            int bad = total > r->len || !mr_ok(d->pid, r->lkey, r->addr, total,
                                               IBV_ACCESS_LOCAL_WRITE);
            if (apple && (total + FV_FRAME - 1) / FV_FRAME != (r->len + FV_FRAME - 1) / FV_FRAME)
                bad = 1; /* the frames of a SEND and its RECV must match */
            if (bad) {
                w.status = IBV_WC_LOC_LEN_ERR;
                d->rq_head++;
                cq_push(d->recv_cq, &w);
                qp_error(d, 1);
                return rc_type ? IBV_WC_REM_OP_ERR : IBV_WC_SUCCESS;
            }
            if (move(d->pid, wr->sg_list, wr->num_sge, r->addr, total, 1))
                return IBV_WC_REM_OP_ERR;
        }
        if (op != IBV_WR_SEND) {
            w.flags = IBV_WC_WITH_IMM;
            w.imm = wr->imm_data;
        }
        d->rq_head++;
        cq_push(d->recv_cq, &w);
        return IBV_WC_SUCCESS;
    }
    if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_READ) {
        int write = op == IBV_WR_RDMA_WRITE;
        if (!mr_ok(d->pid, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, total,
                   write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ))
            return IBV_WC_REM_ACCESS_ERR;
        if (move(d->pid, wr->sg_list, wr->num_sge, wr->wr.rdma.remote_addr, total, write))
            return IBV_WC_REM_ACCESS_ERR;
        return IBV_WC_SUCCESS;
    }
    /* atomics: 8 bytes, 8-aligned, atomic among this fabric's atomics (lock held) */
    fab->atomics++;
    uint64_t ra = wr->wr.atomic.remote_addr, old, val;
    if (total != 8 || (ra & 7) ||
        !mr_ok(d->pid, wr->wr.atomic.rkey, ra, 8, IBV_ACCESS_REMOTE_ATOMIC))
        return IBV_WC_REM_ACCESS_ERR;
    struct ibv_sge tmp = {.addr = (uint64_t)(uintptr_t)&old, .length = 8};
    if (move(d->pid, &tmp, 1, ra, 8, 0))
        return IBV_WC_REM_ACCESS_ERR;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD)
        val = old + wr->wr.atomic.compare_add;
    else
        val = old == wr->wr.atomic.compare_add ? wr->wr.atomic.swap : old;
    tmp.addr = (uint64_t)(uintptr_t)&val;
    if (val != old && move(d->pid, &tmp, 1, ra, 8, 1))
        return IBV_WC_REM_ACCESS_ERR;
    memcpy((void *)(uintptr_t)wr->sg_list[0].addr, &old, 8);
    return IBV_WC_SUCCESS;
}

static int wc_opcode(int op)
{
    switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
        return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
        return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
        return IBV_WC_COMP_SWAP;
    default:
        return IBV_WC_SEND;
    }
}

static int fv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    fv_qph_t *h = (fv_qph_t *)qp;
    int rc = 0;
    lock();
    fv_qp_t *q = &fab->qp[h->slot];
    for (; wr; wr = wr->next) {
        int op = wr->opcode;
        int allowed = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
                      (!apple && q->type == IBV_QPT_RC) ||
                      (!apple && (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM));
        if (q->state < IBV_QPS_RTS || !allowed || wr->num_sge > 4 || wr->num_sge < 0 ||
            (apple && sge_total(wr) > (1u << 30)) ||
            ((wr->send_flags & IBV_SEND_INLINE) && sge_total(wr) > (uint64_t)q->max_inline)) {
            rc = EINVAL;
            break;
        }
        if (q->sq_used >= q->max_send) {
            rc = ENOMEM; /* the send queue is full: a signalled completion must be polled */
            break;
        }
        q->sq_used++;
        q->sq_pending++;
        int signaled = q->sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
        uint32_t len = 0;
        int st;
        if (q->state == IBV_QPS_ERR) {
            st = IBV_WC_WR_FLUSH_ERR;
            signaled = 1;
        } else {
            st = execute(q, wr, &len);
        }
        if (st == -2) {
            continue; /* the peer is silent: no completion, the slot stays taken */
        }
        if (st == -1)
            st = IBV_WC_SUCCESS; /* UC: the sender never knows */
        if (st != IBV_WC_SUCCESS) {
            signaled = 1; /* errors always complete */
            if (q->state != IBV_QPS_ERR)
                qp_error(q, 1);
        }
        if (signaled) {
            fv_wc_t w = {.wr_id = wr->wr_id, .status = st, .opcode = wc_opcode(op),
                         .byte_len = len, .qp_num = q->qpn, .sq_release = q->sq_pending,
                         .qp_slot = h->slot};
            q->sq_pending = 0;
            cq_push(q->send_cq, &w);
        }
    }
    unlock();
    if (rc && bad)
        *bad = wr;
    return rc;
}

static int fv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    fv_qph_t *h = (fv_qph_t *)qp;
    int rc = 0;
    lock();
    fv_qp_t *q = &fab->qp[h->slot];
    for (; wr; wr = wr->next) {
        if (q->state == IBV_QPS_RESET || (apple && q->state < IBV_QPS_RTS) || wr->num_sge != 1) {
            rc = EINVAL; /* apple: receives only once the QP is in RTS */
            break;
        }
        if ((int)(q->rq_tail - q->rq_head) >= q->max_recv) {
            rc = ENOMEM;
            break;
        }
        fv_rwqe_t *r = &q->rq[q->rq_tail++ % FV_RQ];
        r->wr_id = wr->wr_id;
        r->addr = wr->sg_list[0].addr;
        r->len = wr->sg_list[0].length;
        r->lkey = wr->sg_list[0].lkey;
        if (q->state == IBV_QPS_ERR)
            qp_error(q, 1);
    }
    unlock();
    if (rc && bad)
        *bad = wr;
    return rc;
}

/* ---- fault injection (tests) ---- */
int fakeverbs_fault(int kind, int pid, int n)
{
    pthread_once(&once, setup);
    if (!fab)
        return -1;
    lock();
    if (kind == FV_FAULT_FAIL) {
        fab->fail_pid = pid;
        fab->fail_left = n;
    }
    for (int i = 0; i < FV_MAX_QP; i++) {
        fv_qp_t *q = &fab->qp[i];
        if (!q->used || q->pid != pid)
            continue;
        if (kind == FV_FAULT_FLUSH)
            qp_error(q, 1);
        else if (kind == FV_FAULT_QPERR)
            q->state = IBV_QPS_ERR;
        else if (kind == FV_FAULT_SILENT)
            q->silent = n != 0;
    }
    unlock();
    return 0;
}

/* Atomic work requests carried out on the whole fabric so far (tests). */
unsigned long long fakeverbs_atomics(void)
{
    pthread_once(&once, setup);
    return fab ? (unsigned long long)fab->atomics : 0;
}

/* WRITE_WITH_IMM work requests delivered on the whole fabric so far (tests). */
unsigned long long fakeverbs_write_imm(void)
{
    pthread_once(&once, setup);
    return fab ? (unsigned long long)fab->write_imm : 0;
}
