/* The tcp initiator's reading side: replies read (by the receiver thread, or by a synchronous
 * caller in its own thread), matched to their requests by id, get payloads received straight
 * into the caller's buffer, and requests completed; a connection's failure completes every
 * request in it. See tcp_client.c for the sending side. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp_client.h"

/* Make the receiver look at `reading` again (lock held). */
void pt__tcp_kick_locked(pt_tcp_conn_t *c)
{
    if (c->rx_watching && !c->rx_kicked) {
        c->rx_kicked = 1;
        pt_plat_wakefd_signal(&c->rx_wake);
    }
}

/* ---- completion ---- */

static void publish(pt_tcp_conn_t *c, pt_req_t *req)
{
    if (req->status == PT__TCP_DROPPED && pt__tcp_orphan(c, req))
        return; /* it goes again on a new connection (tcp_reconnect.c) */
    pt__tcp_part_done(req);
    atomic_store_explicit(&req->done, 1, memory_order_release);
    if (!req->self_read) /* (its caller reads replies itself: it does not sleep on done) */
        pt_plat_wake(&req->done, 0);
    pt_req_release(req); /* the connection's reference */
}

/* Decide a request's outcome (lock held): out of the table, published unless a thread is
 * still moving its bytes (that thread publishes when it lets go). */
void pt__tcp_finish_locked(pt_tcp_conn_t *c, pt_req_t *req, pt_status_t st)
{
    if (req->finished)
        return;
    if (req->status == PT_OK)
        req->status = st;
    req->finished = 1;
    pt_req_t **slot = &c->slots[req->id % PT_TCP_MAX_INFLIGHT];
    if (*slot == req) {
        *slot = NULL;
        c->inflight--;
        if (c->slot_waiters)
            pthread_cond_broadcast(&c->slot_cond);
    }
    if (!req->busy)
        publish(c, req);
}

/* busy counts the threads moving a request's bytes (sender and receiver may both be). */
void pt__tcp_unbusy_locked(pt_tcp_conn_t *c, pt_req_t *req)
{
    if (--req->busy == 0 && req->finished)
        publish(c, req);
}

/* The connection fails: every request in it completes with st; no new ones are taken. A
 * connection that broke (st PT_ERR_PEER_LOST: end of stream, reset, failed send) while its
 * peer is not known lost has dropped, which does not say the peer is gone: its requests fail
 * with PT__TCP_DROPPED (those safe to repeat go again on a new connection) and the peer is
 * dialed again (pt__tcp_probe), which tells a drop from a death. */
void pt__tcp_fail_locked(pt_tcp_conn_t *c, pt_status_t st)
{
    if (st == PT_ERR_PEER_LOST && !atomic_load(&c->dead) &&
        !atomic_load(&c->ctx->peers[c->rank].lost))
        st = PT__TCP_DROPPED;
    if (!atomic_load(&c->dead)) {
        c->fail = st;
        atomic_store(&c->dead, 1);
        atomic_store(&c->abort, 1);
        if (st != PT_ERR_PEER_LOST && st != PT__TCP_DROPPED &&
            pthread_mutex_trylock(&c->send_lock) == 0) {
            /* we give up on a live peer (timeout, close): say so between two frames, so
             * that it does not take this connection's end for our death */
            uint8_t hb[PT_TCP_HDR];
            pt_tcp_hdr_t h = {.magic = PT_TCP_MAGIC, .op = PT_TCP_OP_BYE};
            pt__hdr_pack(&h, hb);
            (void)!send(c->fd, hb, sizeof(hb), MSG_DONTWAIT | PT_PLAT_MSG_NOSIGNAL);
            pthread_mutex_unlock(&c->send_lock);
        }
        shutdown(c->fd, SHUT_RDWR);
        if (st == PT_ERR_PEER_LOST)
            pt__peer_mark_lost(c->ctx, c->rank);
        else if (st == PT__TCP_DROPPED)
            pt__tcp_probe(c->ctx, c->rank);
    }
    c->q_head = c->q_tail = NULL;
    for (int i = 0; i < PT_TCP_MAX_INFLIGHT; i++)
        if (c->slots[i])
            pt__tcp_finish_locked(c, c->slots[i], st);
    pthread_cond_broadcast(&c->cond);
    pthread_cond_broadcast(&c->slot_cond);
    c->rx_kicked = 0;
    pt__tcp_kick_locked(c);
}

void pt__tcp_conn_fail(pt_tcp_conn_t *c, pt_status_t st)
{
    pthread_mutex_lock(&c->lock);
    pt__tcp_fail_locked(c, st);
    pthread_mutex_unlock(&c->lock);
}

/* ---- receiving ---- */

static void check_deadlines(pt_tcp_conn_t *c, double *last)
{
    double now = pt__now();
    if (now - *last < 0.1)
        return; /* a scan of the table at most ten times a second */
    *last = now;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < PT_TCP_MAX_INFLIGHT; i++)
        if (c->slots[i] && now > c->slots[i]->deadline) {
            pt__tcp_fail_locked(c, PT_ERR_TIMEOUT);
            break;
        }
    pthread_mutex_unlock(&c->lock);
}

/* When a read in the middle of a reply must be over: the earliest deadline of the requests
 * in flight (one past it fails the connection, as check_deadlines does between replies), and
 * never later than PT_TCP_IO_TIMEOUT from now. A payload cut off by a partition would
 * otherwise hold every request of the connection for PT_TCP_IO_TIMEOUT, past the context's
 * timeout. Called with c->lock held. */
static double mid_reply_deadline_locked(pt_tcp_conn_t *c)
{
    double d = pt__now() + PT_TCP_IO_TIMEOUT;
    for (int i = 0; i < PT_TCP_MAX_INFLIGHT; i++)
        if (c->slots[i] && c->slots[i]->deadline > 0 && c->slots[i]->deadline < d)
            d = c->slots[i]->deadline;
    return d;
}

/* A read in the middle of a reply failed: past a request's deadline, the connection fails
 * with PT_ERR_TIMEOUT (as check_deadlines would have failed it); -1 either way (the stream
 * is broken: the caller fails the connection, which is a no-op once it failed here). */
static int mid_reply_failed(pt_tcp_conn_t *c)
{
    if (errno == ETIMEDOUT)
        pt__tcp_conn_fail(c, PT_ERR_TIMEOUT);
    return -1;
}

static pt_status_t reply_status(uint32_t s)
{
    /* only the refusals a target sends; anything else from the wire is a protocol error */
    switch (s) {
    case PT_OK: case PT_ERR_KEY: case PT_ERR_BOUNDS: case PT_ERR_MODE: case PT_ERR_ALIGN:
    case PT_ERR_INVALID: case PT_ERR_UNSUPPORTED:
        return (pt_status_t)s;
    }
    return PT_ERR_INVALID;
}

/* Handle one reply; -1: the stream is broken (malformed reply or failed read). */
static int on_reply(pt_tcp_conn_t *c, const pt_tcp_hdr_t *h)
{
    int op = h->op & ~PT_TCP_REPLY;
    if (h->magic != PT_TCP_MAGIC || !(h->op & PT_TCP_REPLY) || op < PT_TCP_OP_GET ||
        op > PT_TCP_OP_PUT_NOTIFY || op == PT_TCP_OP_BYE || h->flags)
        return -1;
    pt_status_t st = reply_status(h->status);
    pthread_mutex_lock(&c->lock);
    pt_req_t *r = c->slots[h->id % PT_TCP_MAX_INFLIGHT];
    /* (a put_notify's frames before its last are plain puts) */
    int same = r && (r->op == op || (r->op == PT_TCP_OP_PUT_NOTIFY && op == PT_TCP_OP_PUT));
    if (!same || r->id != h->id || r->replied >= r->frames_sent) {
        pthread_mutex_unlock(&c->lock);
        return -1;
    }
    if (op == PT_TCP_OP_GET && st == PT_OK && r->len) {
        /* exactly one of the chunks this request asked for, nothing outside its buffer */
        uint64_t at = h->off - r->off;
        if (h->off < r->off || at >= r->len || at % PT_TCP_CHUNK ||
            h->len != (r->len - at < PT_TCP_CHUNK ? r->len - at : PT_TCP_CHUNK)) {
            pthread_mutex_unlock(&c->lock);
            return -1;
        }
        r->busy++;
        double until = mid_reply_deadline_locked(c);
        pthread_mutex_unlock(&c->lock);
        int rc = pt__tcp_recv_spin(c->fd, (uint8_t *)r->buf + (h->off - r->off),
                                   (size_t)h->len, until, &c->abort);
        int why = errno;
        pthread_mutex_lock(&c->lock);
        int gone = r->finished; /* failed meanwhile: the connection is going */
        pt__tcp_unbusy_locked(c, r);    /* (may free r when gone) */
        if (rc < 0 || gone) {
            pthread_mutex_unlock(&c->lock);
            errno = why;
            return rc < 0 ? mid_reply_failed(c) : -1;
        }
    }
    if (st != PT_OK && r->status == PT_OK)
        r->status = st;
    r->old = h->a;
    if (++r->replied == r->frames)
        pt__tcp_finish_locked(c, r, r->status);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

/* Read one reply and handle it. 1: one was handled; 0: none came within the socket's receive
 * timeout slice; -1: the stream is broken or ended (the caller fails the connection). */
static int read_reply(pt_tcp_conn_t *c)
{
    uint8_t hb[PT_TCP_HDR];
    ssize_t n = recv(c->fd, hb, sizeof(hb), MSG_WAITALL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return atomic_load(&c->dead) ? -1 : 0;
    if (n <= 0)
        return -1;
    if ((size_t)n < sizeof(hb)) {
        pthread_mutex_lock(&c->lock);
        double until = mid_reply_deadline_locked(c);
        pthread_mutex_unlock(&c->lock);
        if (pt__tcp_recv(c->fd, hb + n, sizeof(hb) - (size_t)n, until, &c->abort, NULL) < 0)
            return mid_reply_failed(c);
    }
    pt_tcp_hdr_t h;
    pt__hdr_unpack(hb, &h);
    return on_reply(c, &h) < 0 ? -1 : 1;
}

void *pt__tcp_receiver_main(void *arg)
{
    pt_tcp_conn_t *c = arg;
    double last = 0;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        if (c->reading == READ_NONE && c->inflight > 0)
            c->reading = READ_RECEIVER;
        int mine = c->reading == READ_RECEIVER, waiter = c->reading == READ_WAITER;
        c->rx_watching = !mine;
        c->rx_kicked = 0;
        pthread_mutex_unlock(&c->lock);
        if (atomic_load(&c->dead))
            return NULL;
        /* not ours to read: watch for the peer's end (POLLRDHUP); where the system has no
         * such event, for anything to read while nobody reads (with nothing in flight that is
         * the end, or a failure), which the branch below takes over to see */
        short idle = PT_PLAT_POLLRDHUP ? PT_PLAT_POLLRDHUP : waiter ? 0 : POLLIN;
        struct pollfd pf[2] = {{.fd = c->fd, .events = (short)(mine ? POLLIN | PT_PLAT_POLLRDHUP
                                                                    : idle)},
                               {.fd = c->rx_wake.rfd, .events = POLLIN}};
        int rc = poll(pf, 2, mine ? 100 : 1000);
        if (atomic_load(&c->dead))
            return NULL;
        if (rc < 0 && errno != EINTR)
            break;
        if (rc > 0 && (pf[1].revents & POLLIN))
            pt_plat_wakefd_drain(&c->rx_wake);
        if (mine) {
            if (rc > 0 && pf[0].revents && read_reply(c) < 0)
                break;
            check_deadlines(c, &last);
            pthread_mutex_lock(&c->lock);
            if (c->inflight == 0)
                c->reading = READ_NONE; /* a synchronous call may read its own reply now */
            pthread_mutex_unlock(&c->lock);
        } else if (rc > 0 && pf[0].revents) {
            /* the peer ended (or the socket failed): whoever reads sees it; if nobody does,
             * take the reading over to see it ourselves */
            pthread_mutex_lock(&c->lock);
            if (c->reading == READ_NONE)
                c->reading = READ_RECEIVER;
            pthread_mutex_unlock(&c->lock);
            if (waiter) {
                struct pollfd w = {.fd = c->rx_wake.rfd, .events = POLLIN};
                (void)!poll(&w, 1, 10);
            }
        }
    }
    pt__tcp_conn_fail(c, PT_ERR_PEER_LOST);
    return NULL;
}

/* A synchronous call's wait when it took the reading (READ_WAITER): read replies in this
 * thread until r has its outcome, then hand the reading back (to the receiver if more are
 * due). r may be finished and not yet published (the sender thread still letting go of it):
 * that last step wakes us through done as usual. */
pt_status_t pt__tcp_wait_reading(pt_tcp_conn_t *c, pt_req_t *r)
{
    double last = pt__now(), spin = pt__spin_seconds();
    int finished = 0;
    while (!finished && !atomic_load(&c->dead)) {
        /* poll briefly before blocking in recv: a reply within the spin time (a loopback or
         * fast-link round trip) is taken without the sleep and wake-up (pt__relax gives the
         * core away after a few microseconds, for an oversubscribed machine) */
        for (double t0 = pt__now(), el = 0; el < spin; el = pt__now() - t0) {
            struct pollfd pf = {.fd = c->fd, .events = POLLIN};
            if (poll(&pf, 1, 0) != 0)
                break;
            pt__relax(el);
        }
        int rc = read_reply(c);
        if (rc < 0) {
            pt__tcp_conn_fail(c, PT_ERR_PEER_LOST);
            break;
        }
        check_deadlines(c, &last);
        pthread_mutex_lock(&c->lock);
        finished = r->finished;
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_lock(&c->lock);
    c->reading = READ_NONE;
    r->self_read = 0; /* from now on we may sleep on done: publish must wake us */
    if (c->inflight > 0)
        pt__tcp_kick_locked(c);
    pthread_mutex_unlock(&c->lock);
    return pt_req_wait(r, -1);
}

