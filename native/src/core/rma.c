/* One-sided get, put and atomics over shared memory. Each access is checked against the
 * target's own registration table (in its control block): key, bounds and mode. Memory in a
 * segment is mapped once and copied directly; other memory goes through cross-memory attach
 * (pt_plat_copy_from/to_peer), which the kernel serves without the target taking part. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "transport/tcp/tcp_proto.h"

typedef struct {
    int seg;          /* segment slot, or -1 for cross-memory attach */
    uint64_t where;   /* offset in the segment, or address in the target */
    uint32_t access;
} pt_target_t;

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

static pt_status_t lookup(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len,
                          int write, pt_target_t *out)
{
    if (rank < 0 || rank >= ctx->size)
        return PT_ERR_INVALID;
    pt_peer_t *p = &ctx->peers[rank];
    if (!p->connected)
        return PT_ERR_INVALID;
    if (atomic_load_explicit(&p->lost, memory_order_relaxed))
        return PT_ERR_PEER_LOST;
    pt_status_t st = pt__reg_lookup(p->ctrl, key, off, len, write, &out->seg, &out->where);
    if (st == PT_OK)
        out->access = write ? 3 : 1;
    return st;
}

/* A peer reached over tcp (tcp_client.c serves it): rank already checked by the caller. */
static int is_tcp(pt_ctx_t *ctx, int rank)
{
    return rank >= 0 && rank < ctx->size && ctx->peers[rank].tcp != NULL;
}

/* The mapping of a peer's segment slot, made on first use and remade if the slot changed. */
static pt_status_t peer_map(pt_ctx_t *ctx, int rank, int s, pt_map_t **out)
{
    pt_peer_t *p = &ctx->peers[rank];
    uint64_t gen = atomic_load_explicit(&p->ctrl->segs[s].gen, memory_order_acquire);
    pt_map_t *m = atomic_load_explicit(&p->maps[s], memory_order_acquire);
    if (m && m->gen == gen) {
        *out = m;
        return PT_OK;
    }
    if (gen == 0)
        return PT_ERR_KEY;
    pthread_mutex_lock(&p->lock);
    pt_status_t st = PT_OK;
    m = atomic_load(&p->maps[s]);
    if (!m || m->gen != gen) {
        if (rank == ctx->rank) {
            /* our own segment: no second mapping needed */
            pt_segment_t *seg = ctx->segs[s];
            pt_map_t *nm = seg ? calloc(1, sizeof(*nm)) : NULL;
            if (!nm) {
                st = seg ? PT_ERR_NOMEM : PT_ERR_KEY;
                goto out;
            }
            nm->gen = gen;
            nm->base = pt_segment_base(seg);
            nm->len = 0; /* not ours to unmap */
            nm->writable = 1;
            nm->older = m;
            atomic_store(&p->maps[s], nm);
            m = nm;
        } else {
            int writable;
            size_t len = p->ctrl->segs[s].len;
            void *base;
            st = pt_plat_segment_map(p->pid, p->ctrl->segs[s].fd, len, 0, &base, &writable);
            if (st != PT_OK)
                goto out;
            pt_map_t *nm = calloc(1, sizeof(*nm));
            if (!nm) {
                pt_plat_segment_unmap(base, len);
                st = PT_ERR_NOMEM;
                goto out;
            }
            nm->gen = gen;
            nm->base = base;
            nm->len = len;
            nm->writable = writable;
            if (m) {
                m->older = p->retired;
                p->retired = m;
            }
            atomic_store_explicit(&p->maps[s], nm, memory_order_release);
            m = nm;
        }
    }
out:
    pthread_mutex_unlock(&p->lock);
    if (st == PT_OK)
        *out = m;
    return st;
}

static pt_status_t resolve(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len,
                           int write, uint8_t **ptr, pt_target_t *t)
{
    pt_status_t st = lookup(ctx, rank, key, off, len, write, t);
    if (st != PT_OK)
        return st;
    *ptr = NULL;
    if (t->seg < 0) {
        if (rank == ctx->rank)
            *ptr = (uint8_t *)(uintptr_t)t->where;
        return PT_OK;
    }
    pt_map_t *m;
    st = peer_map(ctx, rank, t->seg, &m);
    if (st != PT_OK)
        return st;
    if (write && !m->writable)
        return PT_ERR_MODE;
    *ptr = m->base + t->where;
    return PT_OK;
}

static pt_status_t cma(pt_ctx_t *ctx, int rank, uint64_t addr, void *buf, size_t len, int write)
{
    int32_t pid = ctx->peers[rank].pid;
    return write ? pt_plat_copy_to_peer(pid, addr, buf, len)
                 : pt_plat_copy_from_peer(pid, buf, addr, len);
}

pt_status_t pt_get(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst, size_t len)
{
    if (is_tcp(ctx, rank))
        return pt__tcp_rw(ctx, rank, 0, key, off, dst, len, NULL);
    uint8_t *src;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, off, len, 0, &src, &t);
    if (st != PT_OK)
        return st;
    if (len == 0)
        return PT_OK;
    if (!src)
        return cma(ctx, rank, t.where, dst, len, 0);
    pt_copy(dst, src, len);
    return PT_OK;
}

pt_status_t pt_put(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                   size_t len)
{
    if (is_tcp(ctx, rank))
        return pt__tcp_rw(ctx, rank, 1, key, off, (void *)(uintptr_t)src, len, NULL);
    uint8_t *dst;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, off, len, 1, &dst, &t);
    if (st != PT_OK)
        return st;
    if (len == 0)
        return PT_OK;
    if (!dst)
        return cma(ctx, rank, t.where, (void *)(uintptr_t)src, len, 1);
    pt_copy(dst, src, len);
    return PT_OK;
}

static pt_status_t atomic_target(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                 _Atomic int64_t **out)
{
    uint8_t *p;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, off, 8, 1, &p, &t);
    if (st != PT_OK)
        return st;
    if (t.seg < 0)
        return PT_ERR_UNSUPPORTED;
    if (((uintptr_t)p & 7) != 0)
        return PT_ERR_ALIGN;
    *out = (_Atomic int64_t *)p;
    return PT_OK;
}

pt_status_t pt_fetch_add(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                         int64_t *old_out)
{
    if (is_tcp(ctx, rank))
        return pt__tcp_atomic(ctx, rank, PT_TCP_OP_FETCH_ADD, key, off, v, 0, old_out);
    _Atomic int64_t *p;
    pt_status_t st = atomic_target(ctx, rank, key, off, &p);
    if (st != PT_OK)
        return st;
    *old_out = atomic_fetch_add(p, v);
    return PT_OK;
}

pt_status_t pt_compare_swap(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t expected,
                            int64_t desired, int64_t *old_out)
{
    if (is_tcp(ctx, rank))
        return pt__tcp_atomic(ctx, rank, PT_TCP_OP_CSWAP, key, off, expected, desired, old_out);
    _Atomic int64_t *p;
    pt_status_t st = atomic_target(ctx, rank, key, off, &p);
    if (st != PT_OK)
        return st;
    int64_t e = expected;
    atomic_compare_exchange_strong(p, &e, desired);
    *old_out = e;
    return PT_OK;
}

pt_status_t pt_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v)
{
    if (is_tcp(ctx, rank))
        return pt__tcp_atomic(ctx, rank, PT_TCP_OP_NOTIFY, key, off, v, 0, NULL);
    _Atomic int64_t *p;
    pt_status_t st = atomic_target(ctx, rank, key, off, &p);
    if (st != PT_OK)
        return st;
    atomic_fetch_add(p, v);
    pt_plat_wake(pt__low_word(p), 1);
    return PT_OK;
}

pt_status_t pt_put_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                          size_t len, uint64_t nkey, uint64_t noff, int64_t v)
{
    if (is_tcp(ctx, rank))
        return pt__tcp_put_notify(ctx, rank, key, off, src, len, nkey, noff, v);
    /* the counter is checked first, so that a refusal of either leaves the target unchanged */
    _Atomic int64_t *p;
    pt_status_t st = atomic_target(ctx, rank, nkey, noff, &p);
    if (st != PT_OK)
        return st;
    if ((st = pt_put(ctx, rank, key, off, src, len)) != PT_OK)
        return st;
    atomic_fetch_add(p, v); /* (sequentially consistent: after the bytes, for any observer) */
    pt_plat_wake(pt__low_word(p), 1);
    return PT_OK;
}

pt_status_t pt_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                            pt_req_t **out)
{
    if (!out)
        return PT_ERR_INVALID;
    if (is_tcp(ctx, rank))
        return pt__tcp_notify_async(ctx, rank, key, off, v, out);
    /* shared memory: done at once (a store and a wake), handed back complete */
    pt_req_t *r = calloc(1, sizeof(*r));
    if (!r)
        return PT_ERR_NOMEM;
    pt_status_t st = pt_notify(ctx, rank, key, off, v);
    if (st != PT_OK) {
        free(r);
        return st;
    }
    atomic_store(&r->refs, 1);
    r->rank = rank;
    atomic_store_explicit(&r->done, 1, memory_order_release);
    *out = r;
    return PT_OK;
}

pt_status_t pt_wait_local(pt_ctx_t *ctx, const int64_t *addr, int64_t value, int watch,
                          double timeout)
{
    if (!addr || ((uintptr_t)addr & 7))
        return PT_ERR_ALIGN;
    _Atomic int64_t *p = (_Atomic int64_t *)(uintptr_t)addr;
    double start = pt__now(), spin = pt__spin_seconds();
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(p, memory_order_acquire) >= value)
            return PT_OK;
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
        uint32_t w = atomic_load(pt__low_word(p));
        if (atomic_load(p) >= value)
            return PT_OK;
        pt_plat_wait(pt__low_word(p), w, 0.01, 1);
    }
}

/* For the team engine: a direct pointer to [off, off+len) of rank's registration. */
pt_status_t pt__resolve(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len,
                        uint8_t **ptr)
{
    if (is_tcp(ctx, rank))
        return PT_ERR_UNSUPPORTED;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, off, len, 1, ptr, &t);
    if (st == PT_OK && !*ptr)
        return PT_ERR_UNSUPPORTED;
    return st;
}

pt_status_t pt_attach(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len, int write,
                      void **ptr)
{
    if (is_tcp(ctx, rank))
        return PT_ERR_UNSUPPORTED; /* nothing to map: the memory is on another machine */
    uint8_t *p;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, off, len, write, &p, &t);
    if (st != PT_OK)
        return st;
    if (t.seg < 0 || !p)
        return PT_ERR_UNSUPPORTED;
    *ptr = p;
    return PT_OK;
}

pt_status_t pt_put_indexed(pt_ctx_t *ctx, int rank, uint64_t key, const uint64_t *offs, size_t n,
                           size_t itemsize, const void *src)
{
    if (n == 0)
        return PT_OK;
    if (!offs || !src || itemsize == 0)
        return PT_ERR_INVALID;
    if (is_tcp(ctx, rank))
        return pt__tcp_put_indexed(ctx, rank, key, offs, n, itemsize, src);
    uint64_t lo = offs[0], hi = offs[0];
    for (size_t i = 1; i < n; i++) {
        lo = offs[i] < lo ? offs[i] : lo;
        hi = offs[i] > hi ? offs[i] : hi;
    }
    if (hi > UINT64_MAX - itemsize)
        return PT_ERR_BOUNDS;
    uint8_t *base;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, lo, (size_t)(hi - lo + itemsize), 1, &base, &t);
    if (st != PT_OK)
        return st;
    const uint8_t *s = src;
    if (!base) { /* cross-memory attach: one write per item */
        for (size_t i = 0; i < n; i++)
            if ((st = cma(ctx, rank, t.where + (offs[i] - lo), (void *)(uintptr_t)(s + i * itemsize),
                          itemsize, 1)) != PT_OK)
                return st;
        return PT_OK;
    }
    base -= lo;
    switch (itemsize) {
    case 1: for (size_t i = 0; i < n; i++) base[offs[i]] = s[i]; break;
    case 2: for (size_t i = 0; i < n; i++) memcpy(base + offs[i], s + 2 * i, 2); break;
    case 4: for (size_t i = 0; i < n; i++) memcpy(base + offs[i], s + 4 * i, 4); break;
    case 8: for (size_t i = 0; i < n; i++) memcpy(base + offs[i], s + 8 * i, 8); break;
    default: for (size_t i = 0; i < n; i++) memcpy(base + offs[i], s + i * itemsize, itemsize);
    }
    return PT_OK;
}
