/* Transports: how the one-sided operations reach a peer. A transport is one const ops table
 * plus capability flags, defined in its own room (pt_transport_shm in transport/shm,
 * pt_transport_tcp in transport/tcp). A peer holds a pointer to the table that reaches it
 * (pt_peer_t.ops: shm once pt_ctx_connect mapped its control block, tcp once it has a tcp
 * address, which wins; verbs once its queue pair is connected, falling back to tcp when the
 * queue pair fails); the entry points of pt.h (core/rma.c, core/progress.c) check what
 * does not depend on the transport and call through it.
 *
 * Every entry is set. An operation a transport lacks points at the shared
 * pt_transport_unsupported_* function of its signature, which returns PT_ERR_UNSUPPORTED
 * (C cannot call one function through pointers of different types, so there is one per
 * signature; only map has one today, the only operation a transport lacks), and its
 * capability bit is clear. A transport checks the rank itself: one it does not reach (outside
 * the world, or not connected) is PT_ERR_INVALID. */
#ifndef PT_TRANSPORT_H
#define PT_TRANSPORT_H

#include "core/internal.h"

/* What a transport does natively (pt_transport_ops_t.caps). */
enum {
    PT_CAP_GET = 1u << 0,
    PT_CAP_PUT = 1u << 1,
    PT_CAP_ASYNC = 1u << 2,        /* get_async, put_async: in flight without a progress thread */
    PT_CAP_FETCH_ADD = 1u << 3,
    PT_CAP_COMPARE_SWAP = 1u << 4,
    PT_CAP_NOTIFY = 1u << 5,       /* notify, notify_async */
    PT_CAP_PUT_NOTIFY = 1u << 6,
    PT_CAP_PUT_INDEXED = 1u << 7,
    PT_CAP_MAP = 1u << 8,          /* map: a direct pointer into the peer's memory */
};

/* map's flags. */
enum {
    PT_MAP_WRITE = 1,              /* checked like a put: write mode, a writable mapping */
    PT_MAP_LOCAL = 2,              /* this process's own registrations outside its segments
                                      too (their own address), for the team engine */
};

typedef struct pt_transport_ops {
    const char *name;
    int id;                        /* what pt_ctx_transport says of a rank it reaches */
    unsigned caps;                 /* PT_CAP_* */
    /* the operations of pt.h, same arguments, same rules (outputs last, set on success) */
    pt_status_t (*get)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst,
                       size_t len);
    pt_status_t (*put)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                       size_t len);
    /* out is not NULL (checked by the caller) */
    pt_status_t (*get_async)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst,
                             size_t len, pt_req_t **out);
    pt_status_t (*put_async)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                             const void *src, size_t len, pt_req_t **out);
    pt_status_t (*fetch_add)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                             int64_t *old_out);
    pt_status_t (*compare_swap)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                int64_t expected, int64_t desired, int64_t *old_out);
    pt_status_t (*notify)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v);
    pt_status_t (*notify_async)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                                pt_req_t **out);
    pt_status_t (*put_notify)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                              const void *src, size_t len, uint64_t nkey, uint64_t noff,
                              int64_t v);
    /* put_notify in flight (*out completes with the target's answer); NULL where a transport
     * has no faster way than put_notify itself (pt_put_notify_async then runs that) */
    pt_status_t (*put_notify_async)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                    const void *src, size_t len, uint64_t nkey, uint64_t noff,
                                    int64_t v, pt_req_t **out);
    /* put_notify with no answer, head's hlen bytes then src's len at off, any length
     * (pt_put_notify_quiet_head); NULL where a transport has none (pt_put_notify_quiet_head
     * then runs put and put_notify) */
    pt_status_t (*put_notify_quiet)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                    const void *head, size_t hlen, const void *src, size_t len,
                                    uint64_t nkey, uint64_t noff, int64_t v);
    /* n > 0, offs and src set, itemsize > 0 (checked by the caller) */
    pt_status_t (*put_indexed)(pt_ctx_t *ctx, int rank, uint64_t key, const uint64_t *offs,
                               size_t n, size_t itemsize, const void *src);
    /* [off, off+len) of rank's registration as a pointer valid until pt_ctx_destroy
     * (pt_attach; the team engine with PT_MAP_LOCAL); flags: PT_MAP_* */
    pt_status_t (*map)(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len,
                       int flags, void **ptr);
    /* pt_ctx_destroy: stop runs before the context's own threads stop (serving, connections),
     * release after them (what stayed mapped); NULL when there is nothing to do */
    void (*stop)(pt_ctx_t *ctx);
    void (*release)(pt_ctx_t *ctx);
    /* a registration has gone (deregistered, or its segment removed; serve_lock held for
     * writing): what the transport made for it goes too. NULL when it made nothing */
    void (*forget)(pt_ctx_t *ctx, uint64_t key);
} pt_transport_ops_t;

extern const pt_transport_ops_t pt_transport_shm;
extern const pt_transport_ops_t pt_transport_tcp;
extern const pt_transport_ops_t pt_transport_verbs;
/* Every transport, NULL-terminated, in the order pt_ctx_destroy stops them
 * (core/transport.c). */
extern const pt_transport_ops_t *const pt_transports[];

/* For a transport without asynchronous gets and puts of its own: the request is queued for
 * the context's progress threads, which make the transport's synchronous get or put. */
pt_status_t pt_transport_queued_get_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                          void *dst, size_t len, pt_req_t **out);
pt_status_t pt_transport_queued_put_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                          const void *src, size_t len, pt_req_t **out);

/* For a transport without map: PT_ERR_UNSUPPORTED. */
pt_status_t pt_transport_unsupported_map(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                         size_t len, int flags, void **ptr);

/* The table that reaches rank. A rank not reached (yet), or outside the world, goes to the
 * same-machine one, which refuses it (PT_ERR_INVALID). */
static inline const pt_transport_ops_t *pt__peer_ops(pt_ctx_t *ctx, int rank)
{
    const pt_transport_ops_t *ops =
        rank >= 0 && rank < ctx->size ? ctx->peers[rank].ops : NULL;
    return ops ? ops : &pt_transport_shm;
}

#endif
