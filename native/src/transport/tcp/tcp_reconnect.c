/* Reconnect: a tcp connection that drops is not a dead peer.
 *
 * A connection ends without a BYE for two reasons that look the same on the socket: the peer's
 * process is gone (its kernel closed the socket), or the connection alone went (a reset from
 * the network, a middlebox, a partition that outlived keepalive). Dialing the peer again tells
 * them apart: a refused dial means nothing listens there any more (the process is gone: the
 * peer is marked lost, at once: after REFUSALS in a row, some 30 ms); an accepted one means the peer is alive (its requests go
 * again on the new connection); a dial that cannot get through is retried with backoff until
 * the timeout, then what waited fails with PT_ERR_TIMEOUT (rule 4: nothing waits forever) and
 * the peer is NOT marked lost: a partition that heals leaves it usable (the next call dials
 * again; a machine that vanished stays a Timeout on every call, never a hang). A peer that
 * answers with another incarnation (the HELLO's b: its listener was made anew) restarted: what
 * it held is gone, so what was in flight fails with PT_ERR_RESTARTED.
 *
 * What goes again: requests whose repetition cannot change the outcome: get, put and
 * put_indexed (the same bytes to the same place; no caller has been told a put finished, so
 * nothing can be ordered after it yet), and any request whose first frame never left. Those
 * whose effect depends on being applied once (fetch_add, compare_swap, notify, put_notify)
 * and that were sent fail with PT_ERR_INDOUBT once the peer is known alive: the target may or
 * may not have applied them. Every request of a dropped connection waits for the dialing's
 * outcome, so a dead peer fails them all with PT_ERR_PEER_LOST, a restarted one with
 * PT_ERR_RESTARTED, one unreachable until their deadline with PT_ERR_TIMEOUT.
 *
 * One thread per peer, started the first time a connection to it drops, does the dialing; it
 * waits on a condition variable otherwise and is joined at pt_ctx_destroy. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport/tcp/tcp_client.h"

#define BACKOFF_FIRST 0.01
#define BACKOFF_MAX 0.5
/* Refused dials in a row that make a peer lost: a dead process refuses every time, while a
 * single reset can meet a new connection by chance (a stale connection of the same addresses
 * and ports the partition kept from closing). */
#define REFUSALS 3
/* One dial attempt lasts at most this long: after a partition heals, a fresh SYN goes within
 * a second instead of waiting for the kernel's retransmission backoff of an older one. */
#define DIAL_SLICE 1.0

static int repeatable(const pt_req_t *r)
{
    return r->op == PT_TCP_OP_GET || r->op == PT_TCP_OP_PUT || r->op == PT_TCP_OP_PUT_INDEXED ||
           r->frames_sent == 0;
}

static void *reconnect_main(void *arg);

/* Start rank's reconnect thread if it is not running (rlock held); 0 when it runs. */
static int ensure_thread(pt_tcp_peer_t *p)
{
    if (p->rstop)
        return -1;
    if (!p->rthread_on) {
        if (pthread_create(&p->rthread, NULL, reconnect_main, p) != 0)
            return -1;
        p->rthread_on = 1;
    }
    pthread_cond_signal(&p->rcond);
    return 0;
}

int pt__tcp_orphan(pt_tcp_conn_t *c, pt_req_t *req)
{
    pt_tcp_peer_t *p = c->ctx->peers[c->rank].tcp;
    if (!p || pt__now() >= req->deadline) {
        req->status = PT_ERR_TIMEOUT;
        return 0;
    }
    pthread_mutex_lock(&p->rlock);
    int ok = ensure_thread(p) == 0;
    if (ok) {
        req->next = p->orphans; /* (out of the dead connection's queue: fail_locked) */
        p->orphans = req;
    }
    pthread_mutex_unlock(&p->rlock);
    if (!ok)
        req->status = PT_ERR_CLOSED;
    return ok;
}

void pt__tcp_probe(pt_ctx_t *ctx, int rank)
{
    pt_tcp_peer_t *p = ctx->peers[rank].tcp;
    if (!p)
        return;
    pthread_mutex_lock(&p->rlock);
    if (p->probe_until <= 0)
        p->probe_until = pt__now() + ctx->timeout;
    if (ensure_thread(p) < 0)
        p->probe_until = 0;
    pthread_mutex_unlock(&p->rlock);
}

void pt__tcp_peer_dropped(pt_ctx_t *ctx, int rank)
{
    if (rank < 0 || rank >= ctx->size || atomic_load(&ctx->peers[rank].lost))
        return;
    if (ctx->peers[rank].tcp)
        pt__tcp_probe(ctx, rank); /* we can dial it: find out */
    else
        pt__peer_mark_lost(ctx, rank);
}

/* An orphan's end: status st, published to whoever waits, the dead connection's reference
 * dropped. */
static void complete(pt_req_t *r, pt_status_t st)
{
    r->status = st;
    r->self_read = 0;
    pt__tcp_part_done(r);
    atomic_store_explicit(&r->done, 1, memory_order_release);
    pt_plat_wake(&r->done, 0);
    pt_req_release(r);
}

/* An orphan goes again on the current connection (a fresh start: nothing of it is in flight
 * any more, and no thread holds it: it was published to us only once not busy). */
static void again(pt_tcp_peer_t *p, pt_req_t *r)
{
    r->status = PT_OK;
    r->finished = 0;
    r->busy = 0;
    r->self_read = 0;
    r->sent = 0;
    r->frames_sent = r->replied = 0;
    r->next = NULL;
    atomic_fetch_add(&p->retried, 1);
    pt_stats_count(p->ctx, p->rank, PT_STAT_RETRY);
    pt_status_t st = pt__tcp_resubmit(p->ctx, p->rank, r);
    if (st != PT_OK) {
        complete(r, st);
        return;
    }
    pt_req_release(r); /* the dead connection's reference (the new one holds its own) */
}

static void *reconnect_main(void *arg)
{
    pt_tcp_peer_t *p = arg;
    pt_ctx_t *ctx = p->ctx;
    double backoff = BACKOFF_FIRST;
    int refusals = 0;
    pthread_mutex_lock(&p->rlock);
    while (!p->rstop) {
        if (!p->orphans && p->probe_until <= 0) {
            backoff = BACKOFF_FIRST;
            pthread_cond_wait(&p->rcond, &p->rlock);
            continue;
        }
        double until = p->probe_until;
        for (pt_req_t *r = p->orphans; r; r = r->next)
            until = r->deadline > until ? r->deadline : until;
        pthread_mutex_unlock(&p->rlock);

        double left = until - pt__now();
        int refused = 0, restarted = 0;
        pt_status_t st = PT_ERR_TIMEOUT;
        if (left > 0)
            st = pt__tcp_redial(ctx, p->rank, left < DIAL_SLICE ? left : DIAL_SLICE, &refused,
                                &restarted);
        /* the outcome for everything waiting: OK (go again), or final (fail), or not yet */
        int fin = PT_OK; /* -1: not through yet */
        int lost = 0;
        if (restarted)
            fin = PT_ERR_RESTARTED; /* (and the peer is lost until rejoined: conn_dial) */
        else if (st == PT_OK)
            fin = PT_OK;
        else if (atomic_load(&ctx->peers[p->rank].lost))
            fin = PT_ERR_PEER_LOST;
        else if ((refused && ++refusals >= REFUSALS) || st == PT_ERR_AUTH ||
                 st == PT_ERR_INVALID)
            fin = PT_ERR_PEER_LOST, lost = 1; /* nothing of ours listens there any more */
        else
            fin = -1;
        if (!refused)
            refusals = 0;
        double now = pt__now();
        if (fin == -1 && left <= 0)
            fin = PT_ERR_TIMEOUT; /* unreachable is not dead: the peer stays, calls dial again */
        if (lost)
            pt__peer_mark_lost(ctx, p->rank);

        pthread_mutex_lock(&p->rlock);
        pt_req_t *take = NULL;
        if (fin != -1) {
            take = p->orphans;
            p->orphans = NULL;
            p->probe_until = 0;
            if (st == PT_OK) {
                atomic_fetch_add(&p->reconnects, 1);
                pt_stats_count(ctx, p->rank, PT_STAT_RECONNECT);
            }
        } else {
            /* not through yet: what is past its deadline fails now, the rest waits */
            for (pt_req_t **pp = &p->orphans; *pp;) {
                pt_req_t *r = *pp;
                if (now >= r->deadline) {
                    *pp = r->next;
                    r->next = take;
                    take = r;
                } else {
                    pp = &r->next;
                }
            }
        }
        pthread_mutex_unlock(&p->rlock);
        while (take) {
            pt_req_t *r = take;
            take = r->next;
            r->next = NULL;
            if (fin == PT_OK && repeatable(r)) {
                again(p, r);
            } else if (fin == PT_OK) {
                atomic_fetch_add(&p->indoubt, 1);
                complete(r, PT_ERR_INDOUBT); /* the peer lives: it may have applied it */
            }
            else
                complete(r, fin == -1 ? PT_ERR_TIMEOUT : (pt_status_t)fin);
        }
        pthread_mutex_lock(&p->rlock);
        if (fin == -1 && !p->rstop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + backoff;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
            pthread_cond_timedwait(&p->rcond, &p->rlock, &ts);
            backoff = backoff * 2 < BACKOFF_MAX ? backoff * 2 : BACKOFF_MAX;
        } else {
            backoff = BACKOFF_FIRST;
            refusals = 0;
        }
    }
    pt_req_t *left = p->orphans;
    p->orphans = NULL;
    pthread_mutex_unlock(&p->rlock);
    while (left) {
        pt_req_t *r = left;
        left = r->next;
        r->next = NULL;
        complete(r, PT_ERR_CLOSED);
    }
    return NULL;
}

void pt__tcp_reconnect_stop(pt_tcp_peer_t *p)
{
    pthread_mutex_lock(&p->rlock);
    p->rstop = 1;
    int on = p->rthread_on;
    pthread_cond_broadcast(&p->rcond);
    pthread_mutex_unlock(&p->rlock);
    if (on)
        pthread_join(p->rthread, NULL);
}

void pt_ctx_tcp_peer_stats(pt_ctx_t *ctx, int rank, pt_tcp_peer_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!ctx || rank < 0 || rank >= ctx->size || !ctx->peers[rank].tcp)
        return;
    pt_tcp_peer_t *p = ctx->peers[rank].tcp;
    out->reconnects = atomic_load(&p->reconnects);
    out->restarts = atomic_load(&p->restarts);
    out->retried = atomic_load(&p->retried);
    out->indoubt = atomic_load(&p->indoubt);
}

pt_status_t pt_ctx_tcp_rejoin(pt_ctx_t *ctx, int rank)
{
    if (!ctx || rank < 0 || rank >= ctx->size || rank == ctx->rank || !ctx->peers[rank].tcp)
        return PT_ERR_INVALID;
    pt_tcp_peer_t *p = ctx->peers[rank].tcp;
    pthread_mutex_lock(&p->lock);
    /* the next incarnation it meets is the one rejoined (unless it met it already: a live
     * connection to it is kept from its dial) */
    p->rejoining = !(p->conn && !atomic_load(&p->conn->dead));
    int was = rank;
    atomic_compare_exchange_strong(&ctx->first_lost, &was, -1);
    atomic_store(&ctx->peers[rank].lost, 0);
    pthread_mutex_unlock(&p->lock);
    return PT_OK;
}
