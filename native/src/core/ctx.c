/* The endpoint: control block, registrations, local segments and same-host peers; which
 * transport reaches each peer (pt_peer_t.ops). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/transport.h"

static uint64_t random_nonce(void)
{
    uint64_t v = 0;
    if (pt_plat_random(&v, sizeof(v)) != PT_OK)
        v = (uint64_t)pt__now() * 6364136223846793005ULL ^ (uint64_t)getpid();
    v &= 0xffffffffffffULL;
    return v ? v : 1;
}

pt_status_t pt_ctx_create(int rank, int size, int nthreads, pt_ctx_t **out)
{
    if (rank < 0 || size <= 0 || rank >= size || !out)
        return PT_ERR_INVALID;
    pt_status_t st = PT_ERR_NOMEM;
    pt_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return PT_ERR_NOMEM;
    ctx->rank = rank;
    ctx->size = size;
    ctx->nthreads = nthreads > 0 ? nthreads : 1;
    ctx->next_gen = 1;
    ctx->wake = PT_PLAT_WAKEFD_CLOSED;
    atomic_store(&ctx->first_lost, -1);
    const char *tenv = getenv("POOLTENSOR_TIMEOUT");
    ctx->timeout = tenv && atof(tenv) > 0 ? atof(tenv) : 60.0;
    /* a deregistration must not starve behind a stream of served requests */
    pt_plat_rwlock_init(&ctx->serve_lock);
    pthread_mutex_init(&ctx->reg_lock, NULL);
    pthread_mutex_init(&ctx->q_lock, NULL);
    pthread_cond_init(&ctx->q_cond, NULL);
    if ((st = pt__stats_create(size, &ctx->stats)) != PT_OK)
        goto err_free;
    st = PT_ERR_NOMEM;
    ctx->peers = calloc((size_t)size, sizeof(pt_peer_t));
    if (!ctx->peers)
        goto err_free;
    for (int i = 0; i < size; i++) {
        pthread_mutex_init(&ctx->peers[i].lock, NULL);
        ctx->peers[i].watch_fd = -1;
    }
    pt_plat_reap();
    st = pt_segment_create(sizeof(pt_ctrl_t), &ctx->ctrl_seg);
    if (st != PT_OK)
        goto err_peers;
    ctx->ctrl = pt_segment_base(ctx->ctrl_seg);
    ctx->ctrl->magic = PT_CTRL_MAGIC;
    ctx->ctrl->pid = getpid();
    ctx->ctrl->rank = rank;
    ctx->ctrl->ctrl_handle = pt_segment_fd(ctx->ctrl_seg);
    for (int i = 0; i < PT_MAX_SEGS; i++)
        ctx->ctrl->segs[i].fd = -1;
    /* This process is its own peer: the same code path serves local and remote ranks. */
    pt_addr_t self;
    pt_ctx_addr(ctx, &self);
    st = pt_ctx_connect(ctx, rank, &self);
    if (st != PT_OK)
        goto err_ctrl;
    st = pt__progress_start(ctx);
    if (st != PT_OK)
        goto err_ctrl;
    st = pt__monitor_start(ctx);
    if (st != PT_OK)
        goto err_progress;
    *out = ctx;
    return PT_OK;
err_progress:
    pt__progress_stop(ctx);
err_ctrl:
    pt_segment_destroy(ctx->ctrl_seg);
err_peers:
    free(ctx->peers);
err_free:
    pt__stats_unref(ctx->stats);
    pthread_rwlock_destroy(&ctx->serve_lock);
    free(ctx);
    return st;
}

static void peer_unmap(pt_peer_t *p)
{
    if (p->ctrl)
        pt_plat_segment_unmap(p->ctrl, p->ctrl_len);
    pt_plat_peer_unwatch(p->watch_fd);
}

void pt_ctx_destroy(pt_ctx_t *ctx)
{
    if (!ctx)
        return;
    /* stop serving first (nothing touches our memory after), then our own requests */
    for (const pt_transport_ops_t *const *t = pt_transports; *t; t++)
        if ((*t)->stop)
            (*t)->stop(ctx);
    pt__monitor_stop(ctx);
    pt__progress_stop(ctx);
    for (const pt_transport_ops_t *const *t = pt_transports; *t; t++)
        if ((*t)->release)
            (*t)->release(ctx);
    for (int i = 0; i < ctx->size; i++)
        peer_unmap(&ctx->peers[i]);
    free(ctx->peers);
    pt_segment_destroy(ctx->ctrl_seg);
    pt_plat_reap();
    pthread_rwlock_destroy(&ctx->serve_lock);
    pt_plat_secure_zero(ctx->secret, sizeof(ctx->secret));
    pt__stats_unref(ctx->stats); /* (async requests still out keep theirs) */
    free(ctx);
}

void pt_ctx_addr(const pt_ctx_t *ctx, pt_addr_t *out)
{
    out->pid = getpid();
    out->ctrl_fd = pt_segment_fd(ctx->ctrl_seg);
    out->ctrl_len = pt_segment_len(ctx->ctrl_seg);
}

pt_status_t pt_ctx_connect(pt_ctx_t *ctx, int rank, const pt_addr_t *addr)
{
    if (rank < 0 || rank >= ctx->size || !addr || addr->ctrl_len < sizeof(pt_ctrl_t))
        return PT_ERR_INVALID;
    pt_peer_t *p = &ctx->peers[rank];
    if (p->connected)
        return PT_OK;
    /* Barrier words live in the root's block, so every block is mapped writable. */
    void *base;
    pt_status_t st = pt_plat_segment_map(addr->pid, addr->ctrl_fd, addr->ctrl_len, 1, &base,
                                         NULL);
    if (st != PT_OK)
        return st;
    pt_ctrl_t *c = base;
    if (c->magic != PT_CTRL_MAGIC || c->pid != addr->pid) {
        pt_plat_segment_unmap(base, addr->ctrl_len);
        return PT_ERR_INVALID;
    }
    p->pid = addr->pid;
    p->ctrl = c;
    p->ctrl_len = addr->ctrl_len;
    if (rank != ctx->rank)
        p->watch_fd = pt_plat_peer_watch(addr->pid);
    if (!p->ops)
        p->ops = &pt_transport_shm; /* (a tcp address, given first, still wins) */
    p->connected = 1;
    if (rank != ctx->rank) {
        pt__stats_event(ctx->stats, rank, PT_STAT_CONNECT, PT_OK, -1);
        pt__segment_mapped(c, p->pid, -1, 1);
        pt__shm_premap(ctx, rank); /* its segments so far: their names can go soon */
    }
    pt__monitor_poke(ctx);
    return PT_OK;
}

void pt__segment_mapped(pt_ctrl_t *ctrl, int32_t pid, int s, int add)
{
    _Atomic int32_t *count = s < 0 ? &ctrl->ctrl_mapped : &ctrl->segs[s].mapped;
    int32_t handle = s < 0 ? ctrl->ctrl_handle : ctrl->segs[s].fd;
    int32_t m = add ? atomic_fetch_add(count, 1) + 1 : atomic_load(count);
    int32_t known = atomic_load(&ctrl->npeers);
    if (known > 0 && m >= known - 1 && handle >= 0)
        pt_plat_segment_seal(pid, handle);
}

pt_status_t pt_ctx_connected_all(pt_ctx_t *ctx)
{
    if (!ctx)
        return PT_ERR_INVALID;
    int32_t n = 0;
    for (int r = 0; r < ctx->size; r++)
        n += r != ctx->rank && ctx->peers[r].connected;
    atomic_store(&ctx->ctrl->npeers, n + 1);
    int32_t pid = ctx->ctrl->pid;
    pt__segment_mapped(ctx->ctrl, pid, -1, 0);
    pthread_mutex_lock(&ctx->reg_lock);
    for (int s = 0; s < PT_MAX_SEGS; s++)
        if (ctx->segs[s])
            pt__segment_mapped(ctx->ctrl, pid, s, 0);
    pthread_mutex_unlock(&ctx->reg_lock);
    return PT_OK;
}

int pt_ctx_transport(pt_ctx_t *ctx, int rank)
{
    if (!ctx || rank < 0 || rank >= ctx->size || !ctx->peers[rank].ops)
        return 0;
    return ctx->peers[rank].ops->id;
}

int pt_ctx_first_lost(pt_ctx_t *ctx) { return atomic_load(&ctx->first_lost); }

static void mark_lost(pt_ctx_t *ctx, int rank)
{
    int none = -1;
    if (!atomic_exchange(&ctx->peers[rank].lost, 1))
        pt__stats_event(ctx->stats, rank, PT_STAT_LOST, PT_ERR_PEER_LOST, -1);
    if (atomic_compare_exchange_strong(&ctx->first_lost, &none, rank))
        atomic_store(&ctx->ctrl->lost_seen, rank + 1); /* for our same-host peers, below */
}

/* Of two peers seen gone at once (a monitor that polls, on a loaded machine), the first lost
 * is the one the other saw lost before it went, if that one is gone too: a rank that leaves
 * because a peer died is not the cause, however late its peer is noticed. */
void pt__peer_mark_lost(pt_ctx_t *ctx, int rank)
{
    if (rank < 0 || rank >= ctx->size || rank == ctx->rank)
        return;
    pt_peer_t *p = &ctx->peers[rank];
    int q = p->connected && p->ctrl ? (int)atomic_load(&p->ctrl->lost_seen) - 1 : -1;
    if (q >= 0 && q < ctx->size && q != rank && q != ctx->rank &&
        !atomic_load(&ctx->peers[q].lost) && ctx->peers[q].connected &&
        pt_plat_peer_gone(ctx->peers[q].pid))
        mark_lost(ctx, q);
    mark_lost(ctx, rank);
}

int pt_ctx_peer_lost(pt_ctx_t *ctx, int rank)
{
    if (rank < 0 || rank >= ctx->size)
        return 0;
    return atomic_load(&ctx->peers[rank].lost);
}

pt_status_t pt_ctx_add_segment(pt_ctx_t *ctx, pt_segment_t *seg)
{
    pthread_mutex_lock(&ctx->reg_lock);
    pt_status_t st = PT_ERR_NOMEM;
    for (int s = 0; s < PT_MAX_SEGS; s++) {
        if (ctx->segs[s] == seg) {
            st = PT_OK;
            break;
        }
        if (!ctx->segs[s]) {
            ctx->segs[s] = seg;
            pt_ctrl_seg_t *cs = &ctx->ctrl->segs[s];
            cs->fd = pt_segment_fd(seg);
            cs->len = pt_segment_len(seg);
            atomic_store(&cs->mapped, 0);
            atomic_store_explicit(&cs->gen, ctx->next_gen++, memory_order_release);
            pt__segment_mapped(ctx->ctrl, ctx->ctrl->pid, s, 0); /* no peer: no name */
            st = PT_OK;
            break;
        }
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    return st;
}

/* What a transport made for a registration goes with it (serve_lock held for writing). */
static void forget(pt_ctx_t *ctx, uint64_t key)
{
    for (const pt_transport_ops_t *const *t = pt_transports; *t; t++)
        if ((*t)->forget)
            (*t)->forget(ctx, key);
}

pt_status_t pt_ctx_remove_segment(pt_ctx_t *ctx, pt_segment_t *seg)
{
    pthread_rwlock_wrlock(&ctx->serve_lock); /* no tcp request is inside it after this */
    pthread_mutex_lock(&ctx->reg_lock);
    pt_status_t st = PT_ERR_INVALID;
    for (int s = 0; s < PT_MAX_SEGS; s++) {
        if (ctx->segs[s] != seg)
            continue;
        for (int r = 0; r < PT_MAX_REGS; r++) {
            pt_ctrl_reg_t *reg = &ctx->ctrl->regs[r];
            uint64_t key = atomic_load(&reg->key);
            if (key && reg->seg == s) {
                atomic_store(&reg->key, 0);
                forget(ctx, key);
            }
        }
        atomic_store(&ctx->ctrl->segs[s].gen, 0);
        ctx->ctrl->segs[s].fd = -1;
        ctx->segs[s] = NULL;
        st = PT_OK;
        break;
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    pthread_rwlock_unlock(&ctx->serve_lock);
    return st;
}

pt_status_t pt_ctx_register(pt_ctx_t *ctx, void *base, size_t len, int access, uint64_t *key_out)
{
    if ((access != PT_ACCESS_R && access != PT_ACCESS_RW) || !key_out || (!base && len))
        return PT_ERR_INVALID;
    pthread_mutex_lock(&ctx->reg_lock);
    int seg = -1;
    uint64_t off = (uint64_t)(uintptr_t)base;
    for (int s = 0; s < PT_MAX_SEGS; s++) {
        pt_segment_t *sg = ctx->segs[s];
        uint8_t *b = sg ? pt_segment_base(sg) : NULL;
        if (sg && (uint8_t *)base >= b && (uint8_t *)base + len <= b + pt_segment_len(sg)) {
            seg = s;
            off = (uint64_t)((uint8_t *)base - b);
            break;
        }
    }
    pt_status_t st = PT_ERR_NOMEM;
    for (int r = 0; r < PT_MAX_REGS; r++) {
        pt_ctrl_reg_t *reg = &ctx->ctrl->regs[r];
        if (atomic_load(&reg->key))
            continue;
        reg->access = (uint32_t)access;
        reg->seg = seg;
        reg->off = off;
        reg->len = len;
        uint64_t key = (random_nonce() << 16) | (uint64_t)r;
        atomic_store_explicit(&reg->key, key, memory_order_release);
        *key_out = key;
        st = PT_OK;
        break;
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    return st;
}

pt_status_t pt_ctx_deregister(pt_ctx_t *ctx, uint64_t key)
{
    uint64_t slot = key & 0xffff;
    if (slot >= PT_MAX_REGS)
        return PT_ERR_KEY;
    pthread_rwlock_wrlock(&ctx->serve_lock); /* no tcp request is inside it after this */
    pthread_mutex_lock(&ctx->reg_lock);
    uint64_t expected = key;
    int ok = atomic_compare_exchange_strong(&ctx->ctrl->regs[slot].key, &expected, 0);
    if (ok)
        forget(ctx, key);
    pthread_mutex_unlock(&ctx->reg_lock);
    pthread_rwlock_unlock(&ctx->serve_lock);
    return ok ? PT_OK : PT_ERR_KEY;
}

pt_status_t pt_ctx_limit(pt_ctx_t *ctx, uint64_t key, size_t len)
{
    uint64_t slot = key & 0xffff;
    if (slot >= PT_MAX_REGS || key == 0)
        return PT_ERR_KEY;
    pthread_rwlock_wrlock(&ctx->serve_lock); /* no tcp request is inside it after this */
    pthread_mutex_lock(&ctx->reg_lock);
    pt_ctrl_reg_t *reg = &ctx->ctrl->regs[slot];
    pt_status_t st = PT_ERR_KEY;
    if (atomic_load(&reg->key) == key) {
        pt_segment_t *sg = reg->seg >= 0 ? ctx->segs[reg->seg] : NULL;
        size_t room = sg ? pt_segment_len(sg) - (size_t)reg->off : reg->len;
        st = len <= room ? PT_OK : PT_ERR_BOUNDS;
        if (st == PT_OK)
            reg->len = len;
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    pthread_rwlock_unlock(&ctx->serve_lock);
    return st;
}

pt_status_t pt_ctx_barrier(pt_ctx_t *ctx, int root, const int *ranks, int n, double timeout)
{
    if (root < 0 || root >= ctx->size || n <= 0 || !ctx->peers[root].connected)
        return PT_ERR_INVALID;
    pt_ctrl_t *c = ctx->peers[root].ctrl;
    uint32_t gen = atomic_load_explicit(&c->bar_gen, memory_order_acquire);
    if (atomic_fetch_add(&c->bar_count, 1) + 1 == (uint32_t)n) {
        atomic_store(&c->bar_count, 0);
        atomic_fetch_add_explicit(&c->bar_gen, 1, memory_order_release);
        pt_plat_wake(&c->bar_gen, 1);
        return PT_OK;
    }
    double start = pt__now(), spin = pt__spin_seconds();
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&c->bar_gen, memory_order_acquire) != gen)
            return PT_OK;
        if ((i & 63) != 63)
            continue;
        double now = pt__now();
        if (now - start < spin) {
            pt__relax(now - start);
            continue;
        }
        for (int k = 0; k < n; k++)
            if (pt_ctx_peer_lost(ctx, ranks[k]))
                return PT_ERR_PEER_LOST;
        if (timeout >= 0 && now - start > timeout)
            return PT_ERR_TIMEOUT;
        pt_plat_wait(&c->bar_gen, gen, 0.02, 1);
    }
}
