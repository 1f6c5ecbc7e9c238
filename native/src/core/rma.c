/* The one-sided operations of pt.h. Each checks what does not depend on the transport, then
 * goes through the ops table of the transport that reaches the rank (core/transport.h). Here
 * too: the registration table every target checks an access against, and the wait on a local
 * counter that notifies move. */
#include <stdlib.h>

#include "core/transport.h"

pt_status_t pt__reg_lookup(const pt_ctrl_t *ctrl, uint64_t key, uint64_t off, size_t len,
                           int write, int *seg, uint64_t *where)
{
    uint64_t slot = key & 0xffff;
    if (slot >= PT_MAX_REGS || key == 0)
        return PT_ERR_KEY;
    const pt_ctrl_reg_t *reg = &ctrl->regs[slot];
    if (atomic_load_explicit(&reg->key, memory_order_acquire) != key)
        return PT_ERR_KEY;
    pt_ctrl_reg_t r;
    r.access = reg->access;
    r.seg = reg->seg;
    r.off = reg->off;
    r.len = reg->len;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&reg->key, memory_order_relaxed) != key)
        return PT_ERR_KEY;
    if (off > r.len || len > r.len - off)
        return PT_ERR_BOUNDS;
    if (write && !(r.access & 2))
        return PT_ERR_MODE;
    *seg = r.seg;
    *where = r.off + off;
    return PT_OK;
}

pt_status_t pt__reg_local(pt_ctx_t *ctx, uint64_t key, uint64_t off, size_t len, int write,
                          uint8_t **ptr, int *in_seg)
{
    int seg;
    uint64_t where;
    pt_status_t st = pt__reg_lookup(ctx->ctrl, key, off, len, write, &seg, &where);
    if (st != PT_OK)
        return st;
    if (seg < 0) {
        if (in_seg)
            *in_seg = 0;
        *ptr = (uint8_t *)(uintptr_t)where;
        return PT_OK;
    }
    pt_segment_t *sg = ctx->segs[seg];
    if (!sg)
        return PT_ERR_KEY;
    if (in_seg)
        *in_seg = 1;
    *ptr = (uint8_t *)pt_segment_base(sg) + where;
    return PT_OK;
}

/* Each entry point is counted (core/stats.c) under the transport that carried it, around the
 * call through the ops table, so every transport is covered by the same few lines: the cell
 * found inline, the operation timed when its cell samples it (core/stats.h). */
#define COUNTED(op, bytes, call)                                                            \
    do {                                                                                    \
        const pt_transport_ops_t *o_ = pt__peer_ops(ctx, rank);                             \
        pt__stat_cell_t *c_ = pt__stats_cell(ctx->stats, rank, o_->id, (op));               \
        uint64_t t0_ = c_ ? pt__stats_start(c_) : 0;                                        \
        pt_status_t st_ = o_->call;                                                         \
        if (c_)                                                                             \
            pt__stats_end(ctx->stats, c_, rank, (op), (bytes), st_, t0_);                   \
        return st_;                                                                         \
    } while (0)

pt_status_t pt_get(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst, size_t len)
{
    COUNTED(PT_STAT_OP_GET, len, get(ctx, rank, key, off, dst, len));
}

pt_status_t pt_put(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                   size_t len)
{
    COUNTED(PT_STAT_OP_PUT, len, put(ctx, rank, key, off, src, len));
}

pt_status_t pt_fetch_add(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                         int64_t *old_out)
{
    COUNTED(PT_STAT_OP_ATOMIC, 8, fetch_add(ctx, rank, key, off, v, old_out));
}

pt_status_t pt_compare_swap(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t expected,
                            int64_t desired, int64_t *old_out)
{
    COUNTED(PT_STAT_OP_ATOMIC, 8, compare_swap(ctx, rank, key, off, expected, desired, old_out));
}

pt_status_t pt_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v)
{
    COUNTED(PT_STAT_OP_NOTIFY, 8, notify(ctx, rank, key, off, v));
}

pt_status_t pt_put_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                          size_t len, uint64_t nkey, uint64_t noff, int64_t v)
{
    COUNTED(PT_STAT_OP_PUT_NOTIFY, len, put_notify(ctx, rank, key, off, src, len, nkey, noff, v));
}

pt_status_t pt_put_notify_quiet(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                const void *src, size_t len, uint64_t nkey, uint64_t noff,
                                int64_t v)
{
    return pt_put_notify_quiet_head(ctx, rank, key, off, NULL, 0, src, len, nkey, noff, v);
}

pt_status_t pt_put_notify_quiet_head(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                     const void *head, size_t hlen, const void *src,
                                     size_t len, uint64_t nkey, uint64_t noff, int64_t v)
{
    if (pt__peer_ops(ctx, rank)->put_notify_quiet)
        COUNTED(PT_STAT_OP_PUT_NOTIFY, hlen + len,
                put_notify_quiet(ctx, rank, key, off, head, hlen, src, len, nkey, noff, v));
    if (hlen == 0)
        COUNTED(PT_STAT_OP_PUT_NOTIFY, len,
                put_notify(ctx, rank, key, off, src, len, nkey, noff, v));
    /* the bytes first, then the head with the notify: it lands after both */
    if (len) {
        pt_status_t st = pt_put(ctx, rank, key, off + hlen, src, len);
        if (st != PT_OK)
            return st;
    }
    return pt_put_notify(ctx, rank, key, off, head, hlen, nkey, noff, v);
}

pt_status_t pt_put_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                const void *src, size_t len, uint64_t nkey, uint64_t noff,
                                int64_t v, pt_req_t **out)
{
    if (!out)
        return PT_ERR_INVALID;
    const pt_transport_ops_t *o = pt__peer_ops(ctx, rank);
    uint64_t t0 = pt__stats_t0();
    pt_status_t st;
    if (o->put_notify_async) {
        st = o->put_notify_async(ctx, rank, key, off, src, len, nkey, noff, v, out);
        if (t0 && st == PT_OK) {
            pt__stats_req_start(ctx->stats, *out, rank, o->id, PT_STAT_OP_PUT_NOTIFY, len, t0);
            return st;
        }
    } else {
        /* done here and handed back complete (shared memory: a copy and a store) */
        pt_req_t *r = calloc(1, sizeof(*r));
        if (!r)
            return PT_ERR_NOMEM;
        st = o->put_notify(ctx, rank, key, off, src, len, nkey, noff, v);
        if (st != PT_OK) {
            free(r);
        } else {
            atomic_store(&r->refs, 1);
            r->rank = rank;
            atomic_store_explicit(&r->done, 1, memory_order_release);
            *out = r;
        }
    }
    if (t0)
        pt__stats_op(ctx->stats, rank, o->id, PT_STAT_OP_PUT_NOTIFY, len, st, t0);
    return st;
}

pt_status_t pt_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                            pt_req_t **out)
{
    if (!out)
        return PT_ERR_INVALID;
    const pt_transport_ops_t *o = pt__peer_ops(ctx, rank);
    uint64_t t0 = pt__stats_t0();
    pt_status_t st = o->notify_async(ctx, rank, key, off, v, out);
    if (t0 && st == PT_OK)
        pt__stats_req_start(ctx->stats, *out, rank, o->id, PT_STAT_OP_NOTIFY, 8, t0);
    else if (t0)
        pt__stats_op(ctx->stats, rank, o->id, PT_STAT_OP_NOTIFY, 8, st, t0);
    return st;
}

pt_status_t pt_put_indexed(pt_ctx_t *ctx, int rank, uint64_t key, const uint64_t *offs, size_t n,
                           size_t itemsize, const void *src)
{
    if (n == 0)
        return PT_OK;
    if (!offs || !src || itemsize == 0)
        return PT_ERR_INVALID;
    COUNTED(PT_STAT_OP_PUT_INDEXED, n * itemsize, put_indexed(ctx, rank, key, offs, n, itemsize, src));
}

pt_status_t pt_attach(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len, int write,
                      void **ptr)
{
    return pt__peer_ops(ctx, rank)->map(ctx, rank, key, off, len, write ? PT_MAP_WRITE : 0, ptr);
}

/* For the team engine: a direct pointer to [off, off+len) of rank's registration, writable;
 * this process's own memory may lie outside its segments. */
pt_status_t pt__resolve(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len,
                        uint8_t **ptr)
{
    void *p;
    pt_status_t st =
        pt__peer_ops(ctx, rank)->map(ctx, rank, key, off, len, PT_MAP_WRITE | PT_MAP_LOCAL, &p);
    if (st == PT_OK)
        *ptr = p;
    return st;
}

/* The longest a waiter reads a peer's socket before it looks at the peer's state and its
 * timeout again (a write to the counter by anyone else is also seen then at the latest). */
#define HELP_SLICE 0.002

/* Whether rank's frames reach this process over tcp (so a waiter may read them itself). */
static int over_tcp(pt_ctx_t *ctx, int rank)
{
    return rank >= 0 && rank < ctx->size && ctx->server && ctx->peers[rank].tcp;
}

_Atomic int pt__asleep;

pt_status_t pt_wait_local(pt_ctx_t *ctx, const int64_t *addr, int64_t value, int watch,
                          double timeout)
{
    if (!addr || ((uintptr_t)addr & 7))
        return PT_ERR_ALIGN;
    _Atomic int64_t *p = (_Atomic int64_t *)(uintptr_t)addr;
    if (atomic_load_explicit(p, memory_order_acquire) >= value)
        return PT_OK;
    double start = pt__now(), spin = pt__spin_seconds();
    /* the peer's frames come over tcp: read them here (polling their sockets as a wait polls
     * its counter) rather than be woken by the thread that would read them: no wake-up while
     * polling, one after, where the thread's costs two */
    int help = over_tcp(ctx, watch);
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(p, memory_order_acquire) >= value)
            return PT_OK;
        if (help) {
            double el = pt__now() - start;
            if (pt_ctx_peer_lost(ctx, watch))
                return PT_ERR_PEER_LOST;
            if (timeout >= 0 && el > timeout)
                return PT_ERR_TIMEOUT;
            double slice = timeout >= 0 && timeout - el < HELP_SLICE ? timeout - el : HELP_SLICE;
            int h = pt__tcp_help(ctx, watch, p, value, el < spin ? spin - el : 0, slice);
            if (h > 0)
                return PT_OK;
            if (h == 0)
                continue;
            help = 0; /* not now: the usual wait, this time */
        }
        if ((i & 63) != 63)
            continue;
        double el = pt__now() - start;
        if (el < spin) {
            pt__relax(el);
            continue;
        }
        if (watch >= 0 && pt_ctx_peer_lost(ctx, watch))
            return PT_ERR_PEER_LOST;
        if (timeout >= 0 && el > timeout)
            return PT_ERR_TIMEOUT;
        /* counted asleep before the last look: a notifier that saw no sleeper added its
         * value before that look (both sequentially consistent), which then sees it */
        atomic_fetch_add(&pt__asleep, 1);
        uint32_t w = atomic_load(pt__low_word(p));
        if (atomic_load(p) >= value) {
            atomic_fetch_sub(&pt__asleep, 1);
            return PT_OK;
        }
        pt_plat_wait(pt__low_word(p), w, 0.01, 1);
        atomic_fetch_sub(&pt__asleep, 1);
        /* woken, or 10 ms: the peer's sockets may be free to read again */
        help = over_tcp(ctx, watch);
    }
}
