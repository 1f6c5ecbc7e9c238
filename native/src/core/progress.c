/* Asynchronous requests: a queue served by the context's progress threads, so a get_async or
 * put_async returns at once and completes off the calling thread. Waiters poll briefly, then
 * block on the request's done word (pt_plat_wait) with a timeout. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "core/transport.h"

static void req_unref(pt_req_t *req)
{
    if (atomic_fetch_sub(&req->refs, 1) == 1)
        free(req);
}

static void *progress_main(void *arg)
{
    pt_ctx_t *ctx = arg;
    for (;;) {
        pthread_mutex_lock(&ctx->q_lock);
        while (!ctx->q_head && !ctx->stopping)
            pthread_cond_wait(&ctx->q_cond, &ctx->q_lock);
        pt_req_t *req = ctx->q_head;
        if (req) {
            ctx->q_head = req->next;
            if (!ctx->q_head)
                ctx->q_tail = NULL;
        }
        int stop = ctx->stopping && !req;
        pthread_mutex_unlock(&ctx->q_lock);
        if (stop)
            return NULL;
        /* (through the table, not pt_get/pt_put: the request is counted as one async op) */
        const pt_transport_ops_t *o = pt__peer_ops(ctx, req->rank);
        req->status = req->is_put ? o->put(ctx, req->rank, req->key, req->off, req->buf, req->len)
                                  : o->get(ctx, req->rank, req->key, req->off, req->buf, req->len);
        atomic_store_explicit(&req->done, 1, memory_order_release);
        pt_plat_wake(&req->done, 0);
        req_unref(req);
    }
}

pt_status_t pt__progress_start(pt_ctx_t *ctx)
{
    ctx->threads = calloc((size_t)ctx->nthreads, sizeof(pthread_t));
    if (!ctx->threads)
        return PT_ERR_NOMEM;
    for (int i = 0; i < ctx->nthreads; i++) {
        if (pthread_create(&ctx->threads[i], NULL, progress_main, ctx) != 0) {
            ctx->nthreads = i;
            pt__progress_stop(ctx);
            return PT_ERR_SYS;
        }
    }
    return PT_OK;
}

void pt__progress_stop(pt_ctx_t *ctx)
{
    pthread_mutex_lock(&ctx->q_lock);
    ctx->stopping = 1;
    pthread_cond_broadcast(&ctx->q_cond);
    pthread_mutex_unlock(&ctx->q_lock);
    for (int i = 0; i < ctx->nthreads; i++)
        pthread_join(ctx->threads[i], NULL);
    free(ctx->threads);
    ctx->threads = NULL;
    ctx->nthreads = 0;
}

pt_status_t pt__progress_submit(pt_ctx_t *ctx, int is_put, int rank, uint64_t key, uint64_t off,
                                void *buf, size_t len, pt_req_t **out)
{
    if (!out || rank < 0 || rank >= ctx->size)
        return PT_ERR_INVALID;
    pt_req_t *req = calloc(1, sizeof(*req));
    if (!req)
        return PT_ERR_NOMEM;
    req->is_put = is_put;
    req->rank = rank;
    req->key = key;
    req->off = off;
    req->buf = buf;
    req->len = len;
    atomic_store(&req->refs, 2); /* the caller's and the queue's */
    pthread_mutex_lock(&ctx->q_lock);
    if (ctx->stopping) {
        pthread_mutex_unlock(&ctx->q_lock);
        free(req);
        return PT_ERR_CLOSED;
    }
    if (ctx->q_tail)
        ctx->q_tail->next = req;
    else
        ctx->q_head = req;
    ctx->q_tail = req;
    pthread_cond_signal(&ctx->q_cond);
    pthread_mutex_unlock(&ctx->q_lock);
    *out = req;
    return PT_OK;
}

/* The transport puts the request in flight (tcp: on its socket), or hands it to the progress
 * threads (shm: pt__progress_submit). Counted once its caller sees it complete. */
static pt_status_t start_counted(pt_ctx_t *ctx, int is_put, int rank, uint64_t key, uint64_t off,
                                 void *buf, size_t len, pt_req_t **out)
{
    if (!out)
        return PT_ERR_INVALID;
    const pt_transport_ops_t *o = pt__peer_ops(ctx, rank);
    int op = is_put ? PT_STAT_OP_PUT : PT_STAT_OP_GET;
    uint64_t t0 = pt__stats_t0();
    pt_status_t st = is_put ? o->put_async(ctx, rank, key, off, buf, len, out)
                            : o->get_async(ctx, rank, key, off, buf, len, out);
    if (t0 && st == PT_OK)
        pt__stats_req_start(ctx->stats, *out, rank, o->id, op, len, t0);
    else if (t0)
        pt__stats_op(ctx->stats, rank, o->id, op, len, st, t0);
    return st;
}

pt_status_t pt_get_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst, size_t len,
                         pt_req_t **out)
{
    return start_counted(ctx, 0, rank, key, off, dst, len, out);
}

pt_status_t pt_put_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                         size_t len, pt_req_t **out)
{
    return start_counted(ctx, 1, rank, key, off, (void *)(uintptr_t)src, len, out);
}

int pt_req_test(pt_req_t *req, pt_status_t *st)
{
    if (!atomic_load_explicit(&req->done, memory_order_acquire))
        return 0;
    pt__stats_req_end(req);
    if (st)
        *st = req->status;
    return 1;
}

pt_status_t pt_req_wait(pt_req_t *req, double timeout)
{
    double start = pt__now(), spin = pt__spin_seconds();
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&req->done, memory_order_acquire)) {
            pt__stats_req_end(req);
            return req->status;
        }
        if ((i & 63) != 63)
            continue;
        double el = pt__now() - start;
        if (el < spin) {
            pt__relax(el);
            continue;
        }
        if (timeout >= 0 && el >= timeout)
            return PT_ERR_TIMEOUT;
        double slice = timeout < 0 ? 0.1 : timeout - el;
        pt_plat_wait(&req->done, 0, slice > 0.1 ? 0.1 : slice, 0);
    }
}

void pt_req_release(pt_req_t *req)
{
    if (req) {
        pt__stats_req_end(req);
        req_unref(req);
    }
}
