/* Private to native/: the control block shared with same-host peers, and helpers. */
#ifndef PT_INTERNAL_H
#define PT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/stats.h"
#include "platform/platform.h"
#include "pt.h"

#define PT_CTRL_MAGIC 0x70746374726c3031ULL
#define PT_MAX_SEGS 256
#define PT_MAX_REGS 1024
#define PT_CACHELINE 64

/* A segment this process exports: peers open /proc/<pid>/fd/<fd> and map it. gen != 0 when live. */
typedef struct {
    _Atomic uint64_t gen;
    int32_t fd;
    _Atomic int32_t mapped;               /* same-host peers that have mapped it */
    uint64_t len;
} pt_ctrl_seg_t;

/* A registration. key == 0: free. seg >= 0: offset inside segs[seg]; seg < 0: address served by
 * cross-memory attach. Published by storing key last (release), read as a seqlock by peers. */
typedef struct {
    _Atomic uint64_t key;
    uint32_t access;
    int32_t seg;
    uint64_t off;
    uint64_t len;
} pt_ctrl_reg_t;

/* The control block: one page-aligned shared segment per process, written only by its owner
 * except the barrier words, which every rank of the host updates on the root's block. */
typedef struct {
    uint64_t magic;
    int32_t pid;
    int32_t rank;
    _Atomic int32_t lost_seen;            /* 1 + the first peer its owner saw lost, or 0 */
    int32_t ctrl_handle;                  /* this block's own segment handle */
    _Atomic int32_t ctrl_mapped;          /* same-host peers that have mapped this block */
    _Atomic int32_t npeers;               /* 1 + the same-host peers that map our segments,
                                             once all are connected (pt_ctx_connected_all);
                                             0 before: then names are kept */
    _Alignas(PT_CACHELINE) _Atomic uint32_t bar_count;
    _Alignas(PT_CACHELINE) _Atomic uint32_t bar_gen;
    _Alignas(PT_CACHELINE) pt_ctrl_seg_t segs[PT_MAX_SEGS];
    pt_ctrl_reg_t regs[PT_MAX_REGS];
} pt_ctrl_t;

/* A mapping of one peer segment, immutable once published. */
typedef struct pt_map {
    uint64_t gen;
    uint8_t *base;
    size_t len;
    int writable;
    struct pt_map *older;
} pt_map_t;

typedef struct {
    const struct pt_transport_ops *ops;   /* the transport that reaches it (core/transport.h),
                                             NULL until it is reached */
    int connected;                        /* its control block is mapped (pt_ctx_connect) */
    int32_t pid;
    int watch_fd;                         /* readable once the process exits, or -1 */
    _Atomic int lost;
    pt_ctrl_t *ctrl;
    size_t ctrl_len;
    /* the shm transport's mappings of its segments */
    pthread_mutex_t lock;                 /* taken only to map a segment */
    _Atomic(pt_map_t *) maps[PT_MAX_SEGS];
    pt_map_t *retired;                    /* replaced mappings, unmapped at destroy */
    struct pt_tcp_peer *tcp;              /* set: this peer is reached over tcp (transport/tcp) */
} pt_peer_t;

struct pt_req {
    _Atomic uint32_t done;                /* waiters sleep on it (pt_plat_wait) */
    _Atomic int refs;
    pt_status_t status;
    int is_put;
    int rank;
    uint64_t key, off;
    void *buf;
    size_t len;
    struct pt_req *next;
    /* tcp requests (tcp_client.c); the fields below are guarded by their connection's lock */
    int op;                               /* PT_TCP_OP_* */
    int64_t a, b, old;                    /* operands; the old value an atomic returns */
    const uint64_t *offs;                 /* put_indexed: n offsets, items of itemsize */
    size_t n, itemsize;
    uint64_t lo, span;                    /* put_indexed: the whole set's range */
    uint8_t value[8];                     /* put_notify: le64 value in front of its last frame */
    uint64_t id;
    size_t sent;                          /* bytes (put_indexed: items) framed so far */
    uint32_t frames, frames_sent, replied;
    int busy;                             /* threads moving bytes of buf outside the lock */
    int finished;                         /* outcome known; published once not busy */
    int self_read;                        /* its caller reads the replies (never sleeps) */
    double deadline;
    /* striping (tcp_stripe.c): a part of a large transfer points at the whole, which completes
     * once its `parts` are over, with the first status that was not PT_OK */
    struct pt_req *whole;
    _Atomic int parts;
    _Atomic int part_status;
    /* counting (core/stats.c): set by the entry point that started it, cleared once counted */
    _Atomic(pt_stats_t *) stat;
    uint64_t stat_t0, stat_bytes;
    int stat_rank, stat_transport, stat_op;
};

struct pt_ctx {
    int rank, size;
    pt_segment_t *ctrl_seg;
    pt_ctrl_t *ctrl;
    pt_segment_t *segs[PT_MAX_SEGS];      /* local segments, by slot */
    uint64_t next_gen;
    pthread_mutex_t reg_lock;
    pt_peer_t *peers;
    /* progress: a queue served by worker threads */
    pthread_mutex_t q_lock;
    pthread_cond_t q_cond;
    pt_req_t *q_head, *q_tail;
    int stopping;
    int nthreads;
    pthread_t *threads;
    _Atomic int first_lost;               /* the first peer seen dead, or -1 */
    /* peer monitor */
    pthread_t monitor;
    int monitor_started;
    _Atomic int monitor_stop;
    pt_plat_wakefd_t wake;                /* brings the monitor out of poll() */
    /* tcp: the shared secret, the timeout of synchronous operations, the server */
    uint8_t secret[64];                   /* longer secrets are kept as their SHA-256 */
    size_t secret_len;
    double timeout;
    _Atomic int tcp_stripes;              /* POOLTENSOR_TCP_STRIPES, read at first use; 0: not yet */
    _Atomic size_t tcp_stripe_part;       /* POOLTENSOR_TCP_STRIPE_PART, likewise */
    pthread_rwlock_t serve_lock;          /* read: a server thread touching registered memory;
                                             write: deregistration, segment removal */
    struct pt_tcp_server *server;
    pt_stats_t *stats;                    /* what the data path did (core/stats.c) */
    struct pt_verbs *verbs;               /* the verbs transport's state, once it is used */
};

/* For the team engine: a writable direct pointer to [off, off+len) of rank's registration
 * (core/rma.c; PT_ERR_UNSUPPORTED where the transport cannot map it). */
pt_status_t pt__resolve(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len,
                        uint8_t **ptr);
/* This process's waiters asleep in pt_wait_local: a notify served here wakes only if some
 * are (rma.c, tcp_server.c). */
extern _Atomic int pt__asleep;
double pt__now(void);
/* $name as a whole number, dflt when unset or empty, clamped to [lo, hi] (status.c): the one
 * reading of the native layer's numeric knobs. */
long pt__env_long(const char *name, long dflt, long lo, long hi);
/* How long a waiter polls before it blocks (pt_set_spin, $POOLTENSOR_SPIN_US). */
double pt__spin_seconds(void);
/* Called while polling: after a few microseconds, give the core to whoever else is runnable
 * (on a loaded or oversubscribed machine that is often the peer we are waiting for). */
void pt__relax(double elapsed);

pt_status_t pt__progress_start(pt_ctx_t *ctx);
void pt__progress_stop(pt_ctx_t *ctx);
/* A get (or a put) for the progress threads to do with pt_get (pt_put); *out completes when
 * it is done. */
pt_status_t pt__progress_submit(pt_ctx_t *ctx, int is_put, int rank, uint64_t key, uint64_t off,
                                void *buf, size_t len, pt_req_t **out);
pt_status_t pt__monitor_start(pt_ctx_t *ctx);
void pt__monitor_stop(pt_ctx_t *ctx);
void pt__monitor_poke(pt_ctx_t *ctx);
void pt__peer_mark_lost(pt_ctx_t *ctx, int rank);
/* A same-host peer (pid, control block ctrl) has one more mapping of its segment slot s (-1:
 * the control block itself): once every peer of its host has mapped it, its name (posix
 * profile) goes (pt_plat_segment_seal). Called by whoever mapped it, and by the owner. */
void pt__segment_mapped(pt_ctrl_t *ctrl, int32_t pid, int s, int add);
/* The shm transport: map every live segment of a same-host peer now (transport/shm). */
void pt__shm_premap(pt_ctx_t *ctx, int rank);

/* Registration lookup on a control block: key, bounds [off, off+len) and mode. On success
 * *seg is the segment slot (or -1: *where is an address) and *where the offset in it. */
pt_status_t pt__reg_lookup(const pt_ctrl_t *ctrl, uint64_t key, uint64_t off, size_t len,
                           int write, int *seg, uint64_t *where);
/* What a target serves: [off, off+len) of this process's own registration `key` as a pointer,
 * after the same checks (the caller holds serve_lock for reading). in_seg (may be NULL): whether
 * it lies in one of our segments (else in user memory). Outputs set only on success. */
pt_status_t pt__reg_local(pt_ctx_t *ctx, uint64_t key, uint64_t off, size_t len, int write,
                          uint8_t **ptr, int *in_seg);

/* The 32-bit half of an int64 counter that changes first on small increments: the word its
 * waiters sleep on (pt_plat_wait), woken by whoever moves it (notify, over any transport). */
static inline _Atomic uint32_t *pt__low_word(const void *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (_Atomic uint32_t *)((uint8_t *)(uintptr_t)p + 4);
#else
    return (_Atomic uint32_t *)(uintptr_t)p;
#endif
}

/* A rank waiting until the int64 at `counter` is >= value, moved by world rank `rank`'s
 * unanswered frames, reads those frames from that peer's connections to this context's tcp
 * server itself (tcp_server.c): polling the sockets for `spin` seconds, then sleeping in
 * poll, for `slice` seconds at most. 1: the counter got there; 0: not within slice; -1: it
 * cannot (no such connection, one is busy in its thread, the next input is something else,
 * a platform without a socket sleeper: the posix profile): then wait as usual. */
int pt__tcp_help(pt_ctx_t *ctx, int rank, const void *counter, int64_t value, double spin,
                 double slice);

#endif
