/* The same-machine transport: one-sided get, put and atomics over shared memory. Each access
 * is checked against the target's own registration table (in its control block, which
 * pt_ctx_connect mapped): key, bounds and mode. Memory in a segment is mapped once and copied
 * directly. Other memory (a user's buffer, registered where it is) cannot be mapped: gets and
 * puts there go through cross-memory attach (pt_plat_copy_from/to_peer), which the kernel
 * serves without the target taking part; atomics and notifies there, and gets and puts where
 * the system has no cross-memory attach (the posix profile), are sent to the target's native
 * threads over its tcp listener (pt_ctx_connect_tcp_served: the tcp transport's requests, served
 * and checked at the target as from another machine). Asynchronous gets and puts are done by
 * the context's progress threads. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "core/transport.h"

typedef struct {
    int seg;          /* segment slot, or -1 for cross-memory attach */
    uint64_t where;   /* offset in the segment, or address in the target */
    uint32_t access;
} pt_target_t;

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
            if (atomic_load(&p->ctrl->segs[s].gen) == gen)
                pt__segment_mapped(p->ctrl, p->pid, s, 1);
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

/* Whether the target serves what we cannot reach of its memory (pt_ctx_connect_tcp_served). */
static int served(pt_ctx_t *ctx, int rank)
{
    return rank != ctx->rank && ctx->peers[rank].tcp != NULL;
}

/* A get or put of memory outside the target's segments: cross-memory attach, else (no such
 * copy here, or not permitted) served by the target. */
static pt_status_t outside_rw(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, uint64_t addr,
                              void *buf, size_t len, int write)
{
    pt_status_t st = cma(ctx, rank, addr, buf, len, write);
    if ((st == PT_ERR_UNSUPPORTED || st == PT_ERR_SYS) && served(ctx, rank))
        st = write ? pt_transport_tcp.put(ctx, rank, key, off, buf, len)
                   : pt_transport_tcp.get(ctx, rank, key, off, buf, len);
    return st;
}

/* A get (write = 0: peer memory into buf) or a put (write = 1: buf into peer memory). */
static pt_status_t shm_rw(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *buf,
                          size_t len, int write)
{
    uint8_t *mem;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, off, len, write, &mem, &t);
    if (st != PT_OK)
        return st;
    if (len == 0)
        return PT_OK;
    if (!mem)
        return outside_rw(ctx, rank, key, off, t.where, buf, len, write);
    if (write)
        pt_copy(mem, buf, len);
    else
        pt_copy(buf, mem, len);
    return PT_OK;
}

static pt_status_t shm_get(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst,
                           size_t len)
{
    return shm_rw(ctx, rank, key, off, dst, len, 0);
}

static pt_status_t shm_put(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                           size_t len)
{
    return shm_rw(ctx, rank, key, off, (void *)(uintptr_t)src, len, 1);
}

/* The int64 an atomic or a notify changes: a pointer into a segment, or into our own memory;
 * NULL when it is a peer's memory outside its segments, which the target serves (the caller
 * sends the whole operation there, where it is checked again, alignment included). */
static pt_status_t atomic_target(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                 _Atomic int64_t **out)
{
    uint8_t *p;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, off, 8, 1, &p, &t);
    if (st != PT_OK)
        return st;
    if (!p) {
        if (!served(ctx, rank))
            return PT_ERR_UNSUPPORTED;
        *out = NULL;
        return PT_OK;
    }
    if (((uintptr_t)p & 7) != 0)
        return PT_ERR_ALIGN;
    *out = (_Atomic int64_t *)p;
    return PT_OK;
}

static pt_status_t shm_fetch_add(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                                 int64_t *old_out)
{
    _Atomic int64_t *p;
    pt_status_t st = atomic_target(ctx, rank, key, off, &p);
    if (st != PT_OK)
        return st;
    if (!p)
        return pt_transport_tcp.fetch_add(ctx, rank, key, off, v, old_out);
    *old_out = atomic_fetch_add(p, v);
    return PT_OK;
}

static pt_status_t shm_compare_swap(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                    int64_t expected, int64_t desired, int64_t *old_out)
{
    _Atomic int64_t *p;
    pt_status_t st = atomic_target(ctx, rank, key, off, &p);
    if (st != PT_OK)
        return st;
    if (!p)
        return pt_transport_tcp.compare_swap(ctx, rank, key, off, expected, desired, old_out);
    int64_t e = expected;
    atomic_compare_exchange_strong(p, &e, desired);
    *old_out = e;
    return PT_OK;
}

static pt_status_t shm_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v)
{
    _Atomic int64_t *p;
    pt_status_t st = atomic_target(ctx, rank, key, off, &p);
    if (st != PT_OK)
        return st;
    if (!p)
        return pt_transport_tcp.notify(ctx, rank, key, off, v);
    atomic_fetch_add(p, v);
    pt_plat_wake(pt__low_word(p), 1);
    return PT_OK;
}

static pt_status_t shm_put_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                  const void *src, size_t len, uint64_t nkey, uint64_t noff,
                                  int64_t v)
{
    /* the counter is checked first, so that a refusal of either leaves the target unchanged */
    _Atomic int64_t *p;
    pt_status_t st = atomic_target(ctx, rank, nkey, noff, &p);
    if (st != PT_OK)
        return st;
    if (!p)
        return pt_transport_tcp.put_notify(ctx, rank, key, off, src, len, nkey, noff, v);
    if ((st = shm_put(ctx, rank, key, off, src, len)) != PT_OK)
        return st;
    atomic_fetch_add(p, v); /* (sequentially consistent: after the bytes, for any observer) */
    pt_plat_wake(pt__low_word(p), 1);
    return PT_OK;
}

static pt_status_t shm_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                    int64_t v, pt_req_t **out)
{
    /* done at once (a store and a wake), handed back complete */
    pt_req_t *r = calloc(1, sizeof(*r));
    if (!r)
        return PT_ERR_NOMEM;
    pt_status_t st = shm_notify(ctx, rank, key, off, v);
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

static pt_status_t shm_put_indexed(pt_ctx_t *ctx, int rank, uint64_t key, const uint64_t *offs,
                                   size_t n, size_t itemsize, const void *src)
{
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
    if (!base) { /* cross-memory attach: one write per item; else served by the target */
        if (cma(ctx, rank, t.where, NULL, 0, 1) == PT_ERR_UNSUPPORTED && served(ctx, rank))
            return pt_transport_tcp.put_indexed(ctx, rank, key, offs, n, itemsize, src);
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

/* A direct pointer: memory in a segment (ours or a peer's, mapped). Memory outside segments
 * has none, except our own with PT_MAP_LOCAL (its address). */
static pt_status_t shm_map(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len,
                           int flags, void **ptr)
{
    uint8_t *p;
    pt_target_t t;
    pt_status_t st = resolve(ctx, rank, key, off, len, flags & PT_MAP_WRITE, &p, &t);
    if (st != PT_OK)
        return st;
    if (!p || (t.seg < 0 && !(flags & PT_MAP_LOCAL)))
        return PT_ERR_UNSUPPORTED;
    *ptr = p;
    return PT_OK;
}

void pt__shm_premap(pt_ctx_t *ctx, int rank)
{
    pt_map_t *m;
    for (int s = 0; s < PT_MAX_SEGS; s++)
        if (atomic_load(&ctx->peers[rank].ctrl->segs[s].gen))
            (void)peer_map(ctx, rank, s, &m); /* (a failure shows again at first use) */
}

/* The peers' segment mappings (made by peer_map), once nothing uses them. */
static void shm_release(pt_ctx_t *ctx)
{
    for (int i = 0; i < ctx->size; i++) {
        pt_peer_t *p = &ctx->peers[i];
        for (int s = 0; s < PT_MAX_SEGS; s++) {
            pt_map_t *m = atomic_load(&p->maps[s]);
            if (m) {
                pt_plat_segment_unmap(m->base, m->len);
                free(m);
            }
        }
        for (pt_map_t *m = p->retired; m;) {
            pt_map_t *next = m->older;
            pt_plat_segment_unmap(m->base, m->len);
            free(m);
            m = next;
        }
    }
}

const pt_transport_ops_t pt_transport_shm = {
    .name = "shm",
    .id = 1,
    .caps = PT_CAP_GET | PT_CAP_PUT | PT_CAP_FETCH_ADD | PT_CAP_COMPARE_SWAP | PT_CAP_NOTIFY |
            PT_CAP_PUT_NOTIFY | PT_CAP_PUT_INDEXED | PT_CAP_MAP,
    .get = shm_get,
    .put = shm_put,
    .get_async = pt_transport_queued_get_async,
    .put_async = pt_transport_queued_put_async,
    .fetch_add = shm_fetch_add,
    .compare_swap = shm_compare_swap,
    .notify = shm_notify,
    .notify_async = shm_notify_async,
    .put_notify = shm_put_notify,
    .put_indexed = shm_put_indexed,
    .map = shm_map,
    .stop = NULL,
    .release = shm_release,
};
