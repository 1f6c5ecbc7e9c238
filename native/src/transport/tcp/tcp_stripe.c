/* Large gets and puts striped over several connections to a peer.
 *
 * One tcp stream on a fast link is bound by what one core does for it on each end (the copies
 * between socket buffers and memory, the protocol work), so a large transfer goes faster
 * as parts that move side by side, each a request of its own on a connection of its own, each
 * with its own sender and receiver threads here and its own serving thread at the target.
 * Parts point into the caller's buffer: no copy beyond the socket's own on either end. Part 0
 * goes on the peer's main connection, part i on stripe connection i, made (and authenticated,
 * like every connection) on first use. Each part keeps every rule of a request: its deadline
 * is the whole's, a dropped stripe is a dropped connection (its parts go again through
 * reconnect, on the main connection, when that is safe, in doubt otherwise), and a stripe that
 * cannot be had at once (a dial that fails, another incarnation) sends its part on the main
 * connection instead. The whole completes when its last part does, with the first status of a
 * part that was not PT_OK. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "transport/tcp/tcp_client.h"

/* Measured with bench/tcp_stripes.py on the 2-core test machine (loopback and across
 * tests/netns.py's namespaces, load 4-7): at 64 MiB 2-4 stripes moved a median 1.3x one
 * connection's bytes (up to 2.8x), at 2 MiB and often at 8 MiB fewer (0.6-1.0x: a part's
 * threads cost more than they bring), so a part is 4 MiB at least and a transfer goes over 4
 * connections (3 and 4 tied; bench/README.md). */
int pt__tcp_stripes_for(pt_ctx_t *ctx, size_t len)
{
    int s = atomic_load_explicit(&ctx->tcp_stripes, memory_order_relaxed);
    size_t part = atomic_load_explicit(&ctx->tcp_stripe_part, memory_order_relaxed);
    if (!s || !part) {
        s = (int)pt__env_long("POOLTENSOR_TCP_STRIPES", PT_TCP_DEFAULT_STRIPES, 1,
                              PT_TCP_MAX_STRIPES);
        part = (size_t)pt__env_long("POOLTENSOR_TCP_STRIPE_PART", PT_TCP_STRIPE_PART,
                                    PT_TCP_CHUNK, 1L << 40);
        atomic_store_explicit(&ctx->tcp_stripe_part, part, memory_order_relaxed);
        atomic_store_explicit(&ctx->tcp_stripes, s, memory_order_relaxed);
    }
    size_t n = len / part;
    return n < (size_t)s ? (int)n : s;
}

void pt__tcp_part_done(pt_req_t *r)
{
    pt_req_t *w = r->whole;
    if (!w)
        return;
    r->whole = NULL;
    int ok = PT_OK;
    if (r->status != PT_OK)
        atomic_compare_exchange_strong(&w->part_status, &ok, (int)r->status);
    if (atomic_fetch_sub(&w->parts, 1) == 1) {
        w->status = (pt_status_t)atomic_load(&w->part_status);
        atomic_store_explicit(&w->done, 1, memory_order_release);
        pt_plat_wake(&w->done, 0);
        if (atomic_fetch_sub(&w->refs, 1) == 1) /* the parts' reference */
            free(w);
    }
}

/* Stripe connection i to rank, made now if it is not live; NULL when it cannot be had by the
 * deadline (or within a second) or the main connection is not live. */
static pt_tcp_conn_t *stripe_conn(pt_ctx_t *ctx, int rank, int i, double deadline)
{
    pt_tcp_peer_t *p = ctx->peers[rank].tcp;
    pthread_mutex_lock(&p->lock);
    pt_tcp_conn_t *c = p->stripe[i];
    if (c && !atomic_load(&c->dead)) {
        pthread_mutex_unlock(&p->lock);
        return c;
    }
    double left = deadline - pt__now();
    pt_tcp_conn_t *nc = NULL;
    uint64_t inc = 0;
    if (left > 0 && !atomic_load(&ctx->peers[rank].lost) && p->conn &&
        !atomic_load(&p->conn->dead) &&
        pt__tcp_conn_open(ctx, rank, left < 1.0 ? left : 1.0, &nc, &inc) == PT_OK) {
        if (inc && p->incarnation && inc != p->incarnation) {
            /* another process listens there: the main connection finds out (conn_dial) */
            pt__tcp_conn_close(nc);
            nc = NULL;
        } else {
            nc->older = c;
            p->stripe[i] = nc;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return nc;
}

pt_status_t pt__tcp_issue_striped(pt_ctx_t *ctx, int rank, pt_req_t *w, int nparts,
                                  pt_req_t **async_out)
{
    size_t part = (w->len + (size_t)nparts - 1) / (size_t)nparts;
    part = (part + PT_TCP_CHUNK - 1) / PT_TCP_CHUNK * PT_TCP_CHUNK; /* whole frames */
    nparts = (int)((w->len + part - 1) / part);
    w->deadline = pt__now() + ctx->timeout;
    atomic_store(&w->parts, nparts);
    atomic_store(&w->part_status, PT_OK);
    atomic_fetch_add(&w->refs, 1); /* the parts', dropped by the last one */
    for (int i = 0; i < nparts; i++) {
        size_t at = (size_t)i * part, len = w->len - at < part ? w->len - at : part;
        pt_req_t *r = calloc(1, sizeof(*r));
        pt_status_t st = PT_ERR_NOMEM;
        if (r) {
            atomic_store(&r->refs, 1);
            r->op = w->op;
            r->is_put = w->is_put;
            r->rank = rank;
            r->key = w->key;
            r->off = w->off + at;
            r->buf = (uint8_t *)w->buf + at;
            r->len = len;
            r->deadline = w->deadline;
            r->whole = w;
            pt_tcp_conn_t *c = i ? stripe_conn(ctx, rank, i, w->deadline) : NULL;
            st = c ? pt__tcp_submit_async(ctx, rank, c, r) : PT__TCP_DROPPED;
            if (st == PT__TCP_DROPPED) /* part 0, or no stripe now: the main connection */
                st = pt__tcp_submit_async(ctx, rank, NULL, r);
        }
        if (i == 0 && st != PT_OK) {
            /* nothing went: fail the call as an unstriped one would */
            free(r);
            free(w);
            return st;
        }
        if (st != PT_OK && r) {
            r->status = st;
            pt__tcp_part_done(r);
        } else if (st != PT_OK) {
            pt_req_t none = {.status = st, .whole = w};
            pt__tcp_part_done(&none);
        }
        if (r)
            pt_req_release(r);
    }
    if (async_out) {
        *async_out = w;
        return PT_OK;
    }
    pt_status_t st = pt_req_wait(w, -1);
    pt_req_release(w);
    return st;
}
