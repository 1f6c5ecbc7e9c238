/* The tcp initiator: one connection per peer (plus the stripes large gets and puts are split
 * over: tcp_stripe.c), made on first use, with many requests in flight.
 *
 * A request takes a slot in the connection's table (its id picks the slot) and is sent as one
 * or more frames: small ones (and gets of a few frames, whose frames are headers only) by the
 * calling thread when nothing is queued ahead, the rest by
 * the connection's sender thread, which takes one frame from each queued request in turn so a
 * small request never waits behind more than one chunk of a large one. The receiver thread
 * reads replies, matches them by id and receives get payloads straight into the caller's
 * buffer. A request completes when every frame has its reply; the connection failing
 * (a request past its deadline) completes every request in it; a connection that drops
 * (peer closed, reset) hands its requests to reconnect (tcp_reconnect.c), which dials again
 * and repeats what is safe to repeat. A call that finds no live connection dials with backoff
 * until its deadline (dial_until).
 *
 * Sync operations are async ones waited for; the receiver fails any request older than the
 * context's timeout, so no wait outlives it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/transport.h"
#include "transport/tcp/tcp_client.h"

/* ---- connections ---- */

static pt_status_t conn_open(pt_ctx_t *ctx, int rank, pt_tcp_peer_t *p, double timeout,
                             pt_tcp_conn_t **out, int *refused, uint64_t *inc)
{
    if (ctx->secret_len == 0)
        return PT_ERR_INVALID;
    int fd;
    pt_status_t st = pt__tcp_dial(p, timeout, &fd, refused);
    if (st != PT_OK)
        return st;
    /* the handshake: as long as the dial may take (at least a second: a loaded machine),
     * never past the timeout or PT_TCP_IO_TIMEOUT */
    double hs = timeout < 1.0 ? 1.0 : timeout;
    hs = hs < ctx->timeout ? hs : ctx->timeout;
    double deadline = pt__now() + (hs < PT_TCP_IO_TIMEOUT ? hs : PT_TCP_IO_TIMEOUT);
    if (pt__tcp_tune(fd, 0.25) < 0) {
        st = pt__sys();
        goto err_fd;
    }
    /* bytes unacknowledged for the timeout end the connection, as a request unanswered for
     * that long does: what is written without a request (put_notify_quiet) leaves nothing
     * to time out, and after a partition a connection whose bytes sat out tcp's
     * retransmission backoff would hold every later frame behind them for seconds more; a
     * dropped connection is dialed again at once */
    pt_plat_unacked_timeout(fd, ctx->timeout);
    st = pt__tcp_authenticate(ctx, fd, deadline, inc);
    if (st != PT_OK)
        goto err_fd;
    pt_tcp_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        st = PT_ERR_NOMEM;
        goto err_fd;
    }
    c->ctx = ctx;
    c->rank = rank;
    c->fd = fd;
    c->next_id = 1;
    st = pt_plat_wakefd_open(&c->rx_wake);
    if (st != PT_OK) {
        free(c);
        goto err_fd;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->send_lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    pthread_cond_init(&c->slot_cond, NULL);
    if (pthread_create(&c->receiver, NULL, pt__tcp_receiver_main, c) != 0) {
        st = PT_ERR_SYS;
        goto err_conn;
    }
    if (pthread_create(&c->sender, NULL, pt__tcp_sender_main, c) != 0) {
        pt__tcp_conn_fail(c, PT_ERR_CLOSED);
        pthread_join(c->receiver, NULL);
        st = PT_ERR_SYS;
        goto err_conn;
    }
    *out = c;
    return PT_OK;
err_conn:
    pthread_cond_destroy(&c->cond);
    pthread_cond_destroy(&c->slot_cond);
    pthread_mutex_destroy(&c->send_lock);
    pthread_mutex_destroy(&c->lock);
    pt_plat_wakefd_close(&c->rx_wake);
    free(c);
err_fd:
    close(fd);
    return st;
}

pt_status_t pt__tcp_conn_open(pt_ctx_t *ctx, int rank, double timeout, pt_tcp_conn_t **out,
                              uint64_t *inc)
{
    int refused = 0;
    return conn_open(ctx, rank, ctx->peers[rank].tcp, timeout, out, &refused, inc);
}

/* The live connection to rank, made now if there is none (a failed one is kept until destroy:
 * threads may still hold it); the dial may take `timeout`. *refused: the dial was refused;
 * *restarted: the new connection met another incarnation of the peer than the last one. */
static pt_status_t conn_dial(pt_ctx_t *ctx, int rank, double timeout, pt_tcp_conn_t **out,
                             int *refused, int *restarted)
{
    pt_tcp_peer_t *p = ctx->peers[rank].tcp;
    if (atomic_load(&ctx->peers[rank].lost))
        return PT_ERR_PEER_LOST;
    pt_tcp_conn_t *c = p->conn;
    if (c && !atomic_load(&c->dead)) {
        *out = c;
        return PT_OK;
    }
    pthread_mutex_lock(&p->lock);
    pt_status_t st = PT_OK;
    c = p->conn;
    if (!c || atomic_load(&c->dead)) {
        pt_tcp_conn_t *nc = NULL;
        uint64_t inc = 0;
        st = atomic_load(&ctx->peers[rank].lost)
                 ? PT_ERR_PEER_LOST
                 : conn_open(ctx, rank, p, timeout, &nc, refused, &inc);
        if (st == PT_OK && inc) {
            if (p->incarnation && p->incarnation != inc) {
                /* another process answers there now: the one we knew is gone, and what it
                 * held (our keys mean nothing to the new one). Lost, until the caller has
                 * rejoined it (pt_ctx_tcp_rejoin); the connection is kept for then */
                atomic_fetch_add(&p->restarts, 1);
                *restarted = 1;
                if (!p->rejoining) {
                    pt__peer_mark_lost(ctx, rank);
                    st = PT_ERR_RESTARTED;
                }
            }
            p->incarnation = inc;
            p->rejoining = 0;
        }
        /* a failure before the handshake is over (refused, closed during HELLO/AUTH, timed
         * out) fails this call only: the peer may be restarting, or a crowd of connections
         * may have pushed ours out; the next call dials again. Only an established,
         * authenticated connection that breaks marks the peer lost (pt__tcp_fail_locked). */
        if (st == PT_OK || st == PT_ERR_RESTARTED) {
            nc->older = c;
            p->conn = c = nc;
        }
    }
    pthread_mutex_unlock(&p->lock);
    if (st == PT_OK)
        *out = c;
    return st;
}

static pt_status_t conn_get(pt_ctx_t *ctx, int rank, pt_tcp_conn_t **out)
{
    int refused = 0, restarted = 0;
    return conn_dial(ctx, rank, ctx->timeout, out, &refused, &restarted);
}

pt_status_t pt__tcp_redial(pt_ctx_t *ctx, int rank, double timeout, int *refused,
                           int *restarted)
{
    pt_tcp_conn_t *c;
    return conn_dial(ctx, rank, timeout, &c, refused, restarted);
}

/* rank's live connection for a request due by `deadline`: a dial that fails without a
 * verdict (no route, packets dropped, a handshake cut short: a partition, or a peer coming
 * back) is tried again with backoff (*backoff, doubled up to 0.5 s) until the deadline, then
 * PT_ERR_TIMEOUT. A refused dial (nothing listens: gone, or not up yet) fails this call with
 * PT_ERR_PEER_LOST at once without marking the peer lost; a lost peer, a wrong secret or
 * protocol likewise at once. */
static pt_status_t dial_until(pt_ctx_t *ctx, int rank, double deadline, double *backoff,
                              pt_tcp_conn_t **c)
{
    for (;;) {
        double left = deadline - pt__now();
        int refused = 0, restarted = 0;
        pt_status_t st = conn_dial(ctx, rank, left > 1.0 ? 1.0 : left > 0 ? left : 0.001, c,
                                   &refused, &restarted);
        if (st == PT_OK || refused || atomic_load(&ctx->peers[rank].lost) ||
            (st != PT_ERR_PEER_LOST && st != PT_ERR_TIMEOUT))
            return st;
        left = deadline - pt__now();
        if (left <= 0)
            return PT_ERR_TIMEOUT;
        double nap = *backoff < left ? *backoff : left;
        struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
        nanosleep(&ts, NULL);
        *backoff = *backoff * 2 < 0.5 ? *backoff * 2 : 0.5;
    }
}

/* Put req in flight on connection c. On PT_OK the connection holds a reference and *reader
 * says whether the caller (a synchronous one: `sync`) took the reading of replies, which it
 * then must do (wait_sync). PT__TCP_DROPPED: c dropped before req went. */
static pt_status_t submit_on(pt_tcp_conn_t *c, pt_req_t *r, int sync, int *reader)
{
    pthread_mutex_lock(&c->lock);
    while (c->inflight >= PT_TCP_MAX_INFLIGHT && !atomic_load(&c->dead)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        c->slot_waiters++;
        pthread_cond_timedwait(&c->slot_cond, &c->lock, &ts);
        c->slot_waiters--;
        if (pt__now() > r->deadline) {
            pthread_mutex_unlock(&c->lock);
            return PT_ERR_TIMEOUT;
        }
    }
    if (atomic_load(&c->dead)) {
        pt_status_t st = c->fail;
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    while (c->slots[c->next_id % PT_TCP_MAX_INFLIGHT])
        c->next_id++;
    r->id = c->next_id++;
    c->slots[r->id % PT_TCP_MAX_INFLIGHT] = r;
    c->inflight++;
    atomic_fetch_add(&r->refs, 1); /* the connection's */
    *reader = 0;
    if (c->reading == READ_NONE) {
        if (sync) {
            c->reading = READ_WAITER;
            *reader = 1;
            r->self_read = 1;
        } else {
            pt__tcp_kick_locked(c);
        }
    }
    size_t payload = r->op == PT_TCP_OP_PUT ? r->len
                     : r->op == PT_TCP_OP_PUT_NOTIFY ? r->len + 8
                     : r->op == PT_TCP_OP_PUT_INDEXED ? r->n * (8 + r->itemsize) : 0;
    /* a get of a few frames goes whole from here too: its frames are headers only, and the
     * server answers them in order either way */
    int get_all = r->op == PT_TCP_OP_GET && r->frames > 1 &&
                  r->frames <= PT_TCP_INLINE_FRAMES;
    /* a synchronous put of a few frames, frame by frame from here: the send lock is taken
     * for each, so another request's frame waits for one chunk at most, as it does behind
     * the sender thread */
    int put_all = sync && (r->op == PT_TCP_OP_PUT || r->op == PT_TCP_OP_PUT_NOTIFY) &&
                  r->frames > 1 && r->frames <= PT_TCP_INLINE_FRAMES;
    if (c->q_head || (r->frames > 1 && !get_all && !put_all) ||
        (payload > PT_TCP_INLINE_MAX && !put_all)) {
        if (c->q_tail)
            c->q_tail->next = r;
        else
            c->q_head = r;
        c->q_tail = r;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
        return PT_OK;
    }
    /* small, or a few frames, and nothing queued: write it from this thread */
    r->busy++;
    r->frames_sent = r->frames; /* counted before they go: replies may beat us back */
    pthread_mutex_unlock(&c->lock);
    int rc = 0;
    do {
        pthread_mutex_lock(&c->send_lock);
        rc = get_all ? pt__tcp_send_get_all(c, r) : pt__tcp_send_next(c, r);
        pthread_mutex_unlock(&c->send_lock);
    } while (put_all && rc == 0 && r->sent < r->len && !atomic_load(&c->dead));
    pthread_mutex_lock(&c->lock);
    if (rc < 0 && !atomic_load(&c->dead))
        pt__tcp_fail_locked(c, PT_ERR_PEER_LOST);
    pt__tcp_unbusy_locked(c, r);
    pthread_mutex_unlock(&c->lock);
    return PT_OK;
}

/* Put req in flight on rank's connection, dialed until req's deadline (as submit_on; *cout:
 * the connection). */
static pt_status_t submit(pt_ctx_t *ctx, int rank, pt_req_t *r, int sync, pt_tcp_conn_t **cout,
                          int *reader)
{
    if (r->deadline == 0) /* (a request going again keeps its first deadline) */
        r->deadline = pt__now() + ctx->timeout;
    r->frames = pt__tcp_frame_count(r);
    double backoff = 0.01;
    for (;;) {
        pt_tcp_conn_t *c;
        pt_status_t st = dial_until(ctx, rank, r->deadline, &backoff, &c);
        if (st != PT_OK)
            return st;
        st = submit_on(c, r, sync, reader);
        if (st == PT_OK)
            *cout = c;
        if (st != PT__TCP_DROPPED)
            return st;
        if (pt__now() >= r->deadline)
            return PT_ERR_TIMEOUT;
        /* dropped before ours went: dial again */
    }
}

pt_status_t pt__tcp_submit_async(pt_ctx_t *ctx, int rank, pt_tcp_conn_t *c, pt_req_t *r)
{
    int reader;
    if (!c)
        return submit(ctx, rank, r, 0, &c, &reader);
    if (r->deadline == 0)
        r->deadline = pt__now() + ctx->timeout;
    r->frames = pt__tcp_frame_count(r);
    return submit_on(c, r, 0, &reader);
}

pt_status_t pt__tcp_resubmit(pt_ctx_t *ctx, int rank, pt_req_t *r)
{
    pt_tcp_conn_t *c;
    int reader;
    return submit(ctx, rank, r, 0, &c, &reader);
}

static pt_req_t *req_new(int op, int rank, uint64_t key, uint64_t off, void *buf, size_t len)
{
    pt_req_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    atomic_store(&r->refs, 1);
    r->op = op;
    r->is_put = op != PT_TCP_OP_GET;
    r->rank = rank;
    r->key = key;
    r->off = off;
    r->buf = buf;
    r->len = len;
    return r;
}

/* Wait for a request submitted by a synchronous call, then drop it. */
static pt_status_t wait_sync(pt_tcp_conn_t *c, int reader, pt_req_t *r, int64_t *old)
{
    pt_status_t st = reader ? pt__tcp_wait_reading(c, r) : pt_req_wait(r, -1);
    if (old && st == PT_OK)
        *old = r->old;
    pt_req_release(r);
    return st;
}

static pt_status_t check_peer(pt_ctx_t *ctx, int rank)
{
    if (rank < 0 || rank >= ctx->size || !ctx->peers[rank].tcp)
        return PT_ERR_INVALID;
    return PT_OK;
}

/* Send r to rank. async_out: hand r back there in flight; else wait for it (old_out, if
 * given, receives an atomic's old value). r is released on every path but the asynchronous
 * success. */
static pt_status_t issue(pt_ctx_t *ctx, int rank, pt_req_t *r, pt_req_t **async_out,
                         int64_t *old_out)
{
    pt_tcp_conn_t *c = NULL;
    int reader = 0;
    pt_status_t st = submit(ctx, rank, r, !async_out, &c, &reader);
    if (st != PT_OK) {
        pt_req_release(r);
        return st;
    }
    if (async_out) {
        *async_out = r;
        return PT_OK;
    }
    return wait_sync(c, reader, r, old_out);
}

/* ---- the transport's operations (pt_transport_tcp) ---- */

static pt_status_t tcp_rw(pt_ctx_t *ctx, int rank, int put, uint64_t key, uint64_t off, void *buf,
                          size_t len, pt_req_t **async_out)
{
    pt_status_t st = check_peer(ctx, rank);
    if (st != PT_OK)
        return st;
    if (len && !buf)
        return PT_ERR_INVALID;
    pt_req_t *r = req_new(put ? PT_TCP_OP_PUT : PT_TCP_OP_GET, rank, key, off, buf, len);
    if (!r)
        return PT_ERR_NOMEM;
    int parts = pt__tcp_stripes_for(ctx, len);
    if (parts > 1)
        return pt__tcp_issue_striped(ctx, rank, r, parts, async_out);
    return issue(ctx, rank, r, async_out, NULL);
}

static pt_status_t tcp_atomic(pt_ctx_t *ctx, int rank, int op, uint64_t key, uint64_t off,
                              int64_t a, int64_t b, int64_t *old_out)
{
    pt_status_t st = check_peer(ctx, rank);
    if (st != PT_OK)
        return st;
    pt_req_t *r = req_new(op, rank, key, off, NULL, 8);
    if (!r)
        return PT_ERR_NOMEM;
    r->a = a;
    r->b = b;
    return issue(ctx, rank, r, NULL, old_out);
}

static pt_status_t tcp_put_indexed(pt_ctx_t *ctx, int rank, uint64_t key, const uint64_t *offs,
                                   size_t n, size_t itemsize, const void *src)
{
    pt_status_t st = check_peer(ctx, rank);
    if (st != PT_OK)
        return st;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return PT_ERR_UNSUPPORTED; /* offsets go on the wire as they are: little-endian only */
#endif
    if (itemsize > PT_TCP_MAX_PAYLOAD - 8)
        return PT_ERR_UNSUPPORTED;
    uint64_t lo = offs[0], hi = offs[0];
    for (size_t i = 1; i < n; i++) {
        lo = offs[i] < lo ? offs[i] : lo;
        hi = offs[i] > hi ? offs[i] : hi;
    }
    if (hi > UINT64_MAX - itemsize || hi - lo + itemsize > (uint64_t)INT64_MAX)
        return PT_ERR_BOUNDS;
    pt_req_t *r = req_new(PT_TCP_OP_PUT_INDEXED, rank, key, lo, (void *)(uintptr_t)src, 0);
    if (!r)
        return PT_ERR_NOMEM;
    r->offs = offs;
    r->n = n;
    r->itemsize = itemsize;
    r->lo = lo;
    r->span = hi - lo + itemsize;
    return issue(ctx, rank, r, NULL, NULL);
}

/* A put whose bytes are in memory before the int64 at (nkey, noff) grows by v (PUT_NOTIFY);
 * waited for here, or in flight when out is set. */
static pt_status_t tcp_put_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                        const void *src, size_t len, uint64_t nkey,
                                        uint64_t noff, int64_t v, pt_req_t **out)
{
    pt_status_t st = check_peer(ctx, rank);
    if (st != PT_OK)
        return st;
    if (len && !src)
        return PT_ERR_INVALID;
    pt_req_t *r = req_new(PT_TCP_OP_PUT_NOTIFY, rank, key, off, (void *)(uintptr_t)src, len);
    if (!r)
        return PT_ERR_NOMEM;
    r->a = (int64_t)nkey;
    r->b = (int64_t)noff;
    pt__le_put(r->value, (uint64_t)v, 8);
    return issue(ctx, rank, r, out, NULL);
}

static pt_status_t tcp_put_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                  const void *src, size_t len, uint64_t nkey, uint64_t noff,
                                  int64_t v)
{
    return tcp_put_notify_async(ctx, rank, key, off, src, len, nkey, noff, v, NULL);
}

/* Write the frames of one quiet put on c (its send lock held): head then src at off, in
 * frames of at most PT_TCP_QUIET_FRAME bytes, the notify with the last one (the frames before
 * it add 0: the target neither bumps nor wakes). 0: all written; 1: nothing went (c was dead
 * already); -1 with errno: the stream broke after *sent bytes went. */
static int quiet_frames(pt_tcp_conn_t *c, uint64_t key, uint64_t off, const uint8_t *head,
                        size_t hlen, const uint8_t *src, size_t len, uint64_t nkey,
                        uint64_t noff, int64_t v, double deadline, size_t *sent)
{
    size_t total = hlen + len, at = 0;
    *sent = 0;
    if (atomic_load(&c->dead))
        return 1;
    do {
        size_t n = total - at < PT_TCP_QUIET_FRAME ? total - at : PT_TCP_QUIET_FRAME;
        int last = at + n == total;
        uint8_t hb[PT_TCP_HDR], vb[8];
        pt_tcp_hdr_t h = {.magic = PT_TCP_MAGIC, .op = PT_TCP_OP_PUT_NOTIFY_QUIET, .key = key,
                          .off = off + at, .len = 8 + n, .a = (int64_t)nkey, .b = (int64_t)noff};
        pt__hdr_pack(&h, hb);
        pt__le_put(vb, last ? (uint64_t)v : 0, 8);
        struct iovec iov[4] = {{hb, PT_TCP_HDR}, {vb, 8}};
        int k = 2;
        if (at < hlen) {
            size_t m = hlen - at < n ? hlen - at : n;
            iov[k++] = (struct iovec){(void *)(uintptr_t)(head + at), m};
            if (m < n)
                iov[k++] = (struct iovec){(void *)(uintptr_t)src, n - m};
        } else {
            iov[k++] = (struct iovec){(void *)(uintptr_t)(src + (at - hlen)), n};
        }
        if (pt__tcp_sendv(c->fd, iov, k, deadline, &c->abort) < 0)
            return -1;
        at += n;
        *sent = at;
    } while (at < total);
    return 0;
}

/* PUT_NOTIFY_QUIET (pt_put_notify_quiet_head): written here, under the connection's send lock
 * like every frame (so it never splits another one), and nothing waited for: one frame, or
 * several in a row where head and bytes pass PT_TCP_QUIET_FRAME. No request takes a slot: no
 * reply comes, so neither the receiver thread nor a waiter wakes for it. The write has the
 * context's timeout: a peer that stopped reading fills the socket, and a frame cut short
 * breaks the stream, so the connection then fails (the next call dials again). */
static pt_status_t tcp_put_notify_quiet(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                        const void *head, size_t hlen, const void *src,
                                        size_t len, uint64_t nkey, uint64_t noff, int64_t v)
{
    pt_status_t st = check_peer(ctx, rank);
    if (st != PT_OK)
        return st;
    if ((len && !src) || (hlen && !head))
        return PT_ERR_INVALID;
    double deadline = pt__now() + ctx->timeout, backoff = 0.01;
    for (;;) {
        pt_tcp_conn_t *c;
        st = dial_until(ctx, rank, deadline, &backoff, &c);
        if (st != PT_OK)
            return st;
        size_t sent;
        pthread_mutex_lock(&c->send_lock);
        int rc = quiet_frames(c, key, off, head, hlen, src, len, nkey, noff, v, deadline, &sent);
        int err = errno;
        pthread_mutex_unlock(&c->send_lock);
        if (rc == 0)
            return PT_OK;
        if (rc > 0) {
            /* dead before ours went: dial again (a new connection), within the deadline */
            if (pt__now() >= deadline)
                return PT_ERR_TIMEOUT;
            continue;
        }
        /* part of the put may be on the wire: this connection is over */
        pt__tcp_conn_fail(c, err == ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_PEER_LOST);
        if (err == ETIMEDOUT)
            return PT_ERR_TIMEOUT;
        /* the connection dropped under the frame: a gone peer (a refused dial) is PEER_LOST,
         * as for every request of a dropped connection; a live one may have applied it */
        if (atomic_load(&ctx->peers[rank].lost))
            return PT_ERR_PEER_LOST;
        st = dial_until(ctx, rank, deadline, &backoff, &c);
        return st == PT_OK ? PT_ERR_INDOUBT : st;
    }
}

/* A notify in flight: *out completes with the target's answer. */
static pt_status_t tcp_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                    int64_t v, pt_req_t **out)
{
    pt_status_t st = check_peer(ctx, rank);
    if (st != PT_OK)
        return st;
    pt_req_t *r = req_new(PT_TCP_OP_NOTIFY, rank, key, off, NULL, 8);
    if (!r)
        return PT_ERR_NOMEM;
    r->a = v;
    return issue(ctx, rank, r, out, NULL);
}

static pt_status_t tcp_get(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst,
                           size_t len)
{
    return tcp_rw(ctx, rank, 0, key, off, dst, len, NULL);
}

static pt_status_t tcp_put(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                           size_t len)
{
    return tcp_rw(ctx, rank, 1, key, off, (void *)(uintptr_t)src, len, NULL);
}

/* in flight on its socket; no progress thread takes part */
static pt_status_t tcp_get_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst,
                                 size_t len, pt_req_t **out)
{
    return tcp_rw(ctx, rank, 0, key, off, dst, len, out);
}

static pt_status_t tcp_put_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                 const void *src, size_t len, pt_req_t **out)
{
    return tcp_rw(ctx, rank, 1, key, off, (void *)(uintptr_t)src, len, out);
}

static pt_status_t tcp_fetch_add(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                                 int64_t *old_out)
{
    return tcp_atomic(ctx, rank, PT_TCP_OP_FETCH_ADD, key, off, v, 0, old_out);
}

static pt_status_t tcp_compare_swap(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                    int64_t expected, int64_t desired, int64_t *old_out)
{
    return tcp_atomic(ctx, rank, PT_TCP_OP_CSWAP, key, off, expected, desired, old_out);
}

static pt_status_t tcp_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v)
{
    return tcp_atomic(ctx, rank, PT_TCP_OP_NOTIFY, key, off, v, 0, NULL);
}

pt_status_t pt_ctx_tcp_open(pt_ctx_t *ctx, int rank)
{
    pt_tcp_conn_t *c;
    pt_status_t st = check_peer(ctx, rank);
    return st == PT_OK ? conn_get(ctx, rank, &c) : st;
}

/* The tcp address of rank; reach: every operation to it goes over tcp from now on (else the
 * address only serves what the same-machine transport cannot reach itself). */
static pt_status_t peer_address(pt_ctx_t *ctx, int rank, const char *host, int port, int reach)
{
    if (!ctx || rank < 0 || rank >= ctx->size || rank == ctx->rank || !host || !*host ||
        port <= 0 || port > 65535 || strlen(host) >= sizeof(((pt_tcp_peer_t *)0)->host))
        return PT_ERR_INVALID;
    pt_peer_t *pe = &ctx->peers[rank];
    if (pe->tcp) {
        pthread_mutex_lock(&pe->tcp->lock);
        snprintf(pe->tcp->host, sizeof(pe->tcp->host), "%s", host);
        pe->tcp->port = port;
        pthread_mutex_unlock(&pe->tcp->lock);
    } else {
        pt_tcp_peer_t *p = calloc(1, sizeof(*p));
        if (!p)
            return PT_ERR_NOMEM;
        snprintf(p->host, sizeof(p->host), "%s", host);
        p->port = port;
        p->ctx = ctx;
        p->rank = rank;
        pthread_mutex_init(&p->lock, NULL);
        pthread_mutex_init(&p->rlock, NULL);
        pthread_cond_init(&p->rcond, NULL);
        pe->tcp = p;
    }
    if (reach)
        pe->ops = &pt_transport_tcp; /* from now on, whether or not it is also connected */
    return PT_OK;
}

pt_status_t pt_ctx_connect_tcp(pt_ctx_t *ctx, int rank, const char *host, int port)
{
    return peer_address(ctx, rank, host, port, 1);
}

pt_status_t pt_ctx_connect_tcp_served(pt_ctx_t *ctx, int rank, const char *host, int port)
{
    return peer_address(ctx, rank, host, port, 0);
}

void pt__tcp_conn_close(pt_tcp_conn_t *c)
{
    /* (a connection that is still up says BYE on its way out: see pt__tcp_fail_locked) */
    pt__tcp_conn_fail(c, PT_ERR_CLOSED);
    pthread_join(c->sender, NULL);
    pthread_join(c->receiver, NULL);
    close(c->fd);
    pt_plat_wakefd_close(&c->rx_wake);
    pthread_cond_destroy(&c->cond);
    pthread_cond_destroy(&c->slot_cond);
    pthread_mutex_destroy(&c->send_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static void client_stop(pt_ctx_t *ctx)
{
    for (int r = 0; r < ctx->size; r++) {
        pt_tcp_peer_t *p = ctx->peers[r].tcp;
        if (!p)
            continue;
        pt__tcp_reconnect_stop(p); /* (its orphans hold their old connections: first) */
        for (int i = 0; i < PT_TCP_MAX_STRIPES; i++)
            for (pt_tcp_conn_t *c = i ? p->stripe[i] : p->conn; c;) {
                pt_tcp_conn_t *older = c->older;
                pt__tcp_conn_close(c);
                c = older;
            }
        pthread_mutex_destroy(&p->lock);
        pthread_mutex_destroy(&p->rlock);
        pthread_cond_destroy(&p->rcond);
        free(p);
        ctx->peers[r].tcp = NULL;
        if (ctx->peers[r].ops == &pt_transport_tcp)
            ctx->peers[r].ops = NULL; /* not reached over tcp any more (core/transport.h) */
    }
}

/* Serving first (nothing touches our memory after), then our own connections. */
static void tcp_stop(pt_ctx_t *ctx)
{
    pt__tcp_server_stop(ctx);
    client_stop(ctx);
}

/* Nothing to map: the memory is on another machine. */
const pt_transport_ops_t pt_transport_tcp = {
    .name = "tcp",
    .id = 2,
    .caps = PT_CAP_GET | PT_CAP_PUT | PT_CAP_ASYNC | PT_CAP_FETCH_ADD | PT_CAP_COMPARE_SWAP |
            PT_CAP_NOTIFY | PT_CAP_PUT_NOTIFY | PT_CAP_PUT_INDEXED,
    .get = tcp_get,
    .put = tcp_put,
    .get_async = tcp_get_async,
    .put_async = tcp_put_async,
    .fetch_add = tcp_fetch_add,
    .compare_swap = tcp_compare_swap,
    .notify = tcp_notify,
    .notify_async = tcp_notify_async,
    .put_notify = tcp_put_notify,
    .put_notify_async = tcp_put_notify_async,
    .put_notify_quiet = tcp_put_notify_quiet,
    .put_indexed = tcp_put_indexed,
    .map = pt_transport_unsupported_map,
    .stop = tcp_stop,
    .release = NULL,
};
