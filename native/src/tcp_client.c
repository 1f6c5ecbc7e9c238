/* The tcp initiator: one connection per peer, made on first use, with many requests in flight.
 *
 * A request takes a slot in the connection's table (its id picks the slot) and is sent as one
 * or more frames: small ones by the calling thread when nothing is queued ahead, the rest by
 * the connection's sender thread, which takes one frame from each queued request in turn so a
 * small request never waits behind more than one chunk of a large one. The receiver thread
 * reads replies, matches them by id and receives get payloads straight into the caller's
 * buffer. A request completes when every frame has its reply; the connection failing
 * (peer closed, reset, a request past its deadline) completes every request in it.
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
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_proto.h"

typedef struct pt_tcp_conn {
    pt_ctx_t *ctx;
    int rank, fd;
    _Atomic int abort;          /* set once, when the connection fails */
    _Atomic int dead;
    pt_status_t fail;           /* what its requests failed with */
    pthread_mutex_t lock;       /* slots, queue and the tcp fields of its requests */
    pthread_cond_t cond;        /* queue not empty / dead (the sender waits on it) */
    pthread_cond_t slot_cond;   /* a slot freed / dead (callers at PT_TCP_MAX_INFLIGHT) */
    int slot_waiters;
    pthread_mutex_t send_lock;  /* one frame at a time on the socket */
    pt_req_t *slots[PT_TCP_MAX_INFLIGHT];
    int inflight;
    uint64_t next_id;
    pt_req_t *q_head, *q_tail;  /* requests with frames still to send (sender thread) */
    int reading;                /* who reads replies now: READ_NONE, READ_RECEIVER, READ_WAITER */
    int rx_watching;            /* the receiver only watches for the peer's end */
    int rx_kicked;              /* rx_wake written since the receiver last looked */
    int rx_wake;                /* eventfd: the receiver must look at `reading` again */
    pthread_t sender, receiver;
    struct pt_tcp_conn *older;
} pt_tcp_conn_t;

typedef struct pt_tcp_peer {
    char host[256];
    int port;
    pthread_mutex_t lock;       /* making a connection */
    pt_tcp_conn_t *conn;        /* the current one (may have failed) */
} pt_tcp_peer_t;

/* Who reads the socket. A synchronous call that finds nobody reading reads its own reply
 * (and any other that comes first) in its own thread: no hand-off, no wake-up. Otherwise the
 * receiver thread reads while requests are in flight; with none, it only watches for the
 * peer's end (POLLRDHUP), so replies to a reading caller never wake it. */
enum { READ_NONE, READ_RECEIVER, READ_WAITER };

/* Make the receiver look at `reading` again (lock held). */
static void kick_locked(pt_tcp_conn_t *c)
{
    if (c->rx_watching && !c->rx_kicked) {
        uint64_t one = 1;
        c->rx_kicked = 1;
        (void)!write(c->rx_wake, &one, sizeof(one));
    }
}

/* ---- completion ---- */

static void publish(pt_req_t *req)
{
    atomic_store_explicit(&req->done, 1, memory_order_release);
    if (!req->self_read) /* (its caller reads replies itself: it does not sleep on done) */
        pt__futex_wake(&req->done, 0);
    pt_req_release(req); /* the connection's reference */
}

/* Decide a request's outcome (lock held): out of the table, published unless a thread is
 * still moving its bytes (that thread publishes when it lets go). */
static void finish_locked(pt_tcp_conn_t *c, pt_req_t *req, pt_status_t st)
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
        publish(req);
}

/* busy counts the threads moving a request's bytes (sender and receiver may both be). */
static void unbusy_locked(pt_req_t *req)
{
    if (--req->busy == 0 && req->finished)
        publish(req);
}

/* The connection fails: every request in it completes with st; no new ones are taken. */
static void fail_locked(pt_tcp_conn_t *c, pt_status_t st)
{
    if (!atomic_load(&c->dead)) {
        c->fail = st;
        atomic_store(&c->dead, 1);
        atomic_store(&c->abort, 1);
        if (st != PT_ERR_PEER_LOST && pthread_mutex_trylock(&c->send_lock) == 0) {
            /* we give up on a live peer (timeout, close): say so between two frames, so
             * that it does not take this connection's end for our death */
            uint8_t hb[PT_TCP_HDR];
            pt_tcp_hdr_t h = {.magic = PT_TCP_MAGIC, .op = PT_TCP_OP_BYE};
            pt__hdr_pack(&h, hb);
            (void)!send(c->fd, hb, sizeof(hb), MSG_DONTWAIT | MSG_NOSIGNAL);
            pthread_mutex_unlock(&c->send_lock);
        }
        shutdown(c->fd, SHUT_RDWR);
        if (st == PT_ERR_PEER_LOST)
            pt__peer_mark_lost(c->ctx, c->rank);
    }
    c->q_head = c->q_tail = NULL;
    for (int i = 0; i < PT_TCP_MAX_INFLIGHT; i++)
        if (c->slots[i])
            finish_locked(c, c->slots[i], st);
    pthread_cond_broadcast(&c->cond);
    pthread_cond_broadcast(&c->slot_cond);
    c->rx_kicked = 0;
    kick_locked(c);
}

static void conn_fail(pt_tcp_conn_t *c, pt_status_t st)
{
    pthread_mutex_lock(&c->lock);
    fail_locked(c, st);
    pthread_mutex_unlock(&c->lock);
}

/* ---- sending ---- */

static uint32_t frame_count(const pt_req_t *r)
{
    if (r->op == PT_TCP_OP_GET || r->op == PT_TCP_OP_PUT)
        return r->len ? (uint32_t)((r->len + PT_TCP_CHUNK - 1) / PT_TCP_CHUNK) : 1;
    if (r->op == PT_TCP_OP_PUT_INDEXED) {
        size_t per = PT_TCP_CHUNK / (8 + r->itemsize);
        per = per ? per : 1;
        return (uint32_t)((r->n + per - 1) / per);
    }
    return 1;
}

/* Write the request's next frame (send_lock held; the caller marked it busy). */
static int send_next(pt_tcp_conn_t *c, pt_req_t *r)
{
    pt_tcp_hdr_t h = {.magic = PT_TCP_MAGIC, .op = (uint16_t)r->op, .id = r->id, .key = r->key,
                      .off = r->off, .a = r->a, .b = r->b};
    uint8_t hb[PT_TCP_HDR];
    struct iovec iov[3] = {{hb, PT_TCP_HDR}};
    int n = 1;
    size_t step = 0;
    if (r->op == PT_TCP_OP_GET || r->op == PT_TCP_OP_PUT) {
        step = r->len - r->sent < PT_TCP_CHUNK ? r->len - r->sent : PT_TCP_CHUNK;
        h.off = r->off + r->sent;
        h.len = step;
        if (r->op == PT_TCP_OP_PUT && step)
            iov[n++] = (struct iovec){(uint8_t *)r->buf + r->sent, step};
    } else if (r->op == PT_TCP_OP_PUT_INDEXED) {
        size_t per = PT_TCP_CHUNK / (8 + r->itemsize);
        per = per ? per : 1;
        step = r->n - r->sent < per ? r->n - r->sent : per;
        h.off = r->lo;
        h.a = (int64_t)r->span;
        h.b = (int64_t)r->itemsize;
        h.len = step * (8 + r->itemsize);
        iov[n++] = (struct iovec){(void *)(uintptr_t)(r->offs + r->sent), 8 * step};
        iov[n++] = (struct iovec){(uint8_t *)r->buf + r->sent * r->itemsize, step * r->itemsize};
    }
    pt__hdr_pack(&h, hb);
    if (pt__tcp_sendv(c->fd, iov, n, -1, &c->abort) < 0)
        return -1;
    r->sent += step;
    return 0;
}

static void *sender_main(void *arg)
{
    pt_tcp_conn_t *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->q_head && !atomic_load(&c->dead))
            pthread_cond_wait(&c->cond, &c->lock);
        if (atomic_load(&c->dead))
            break;
        pt_req_t *r = c->q_head;
        c->q_head = r->next;
        if (!c->q_head)
            c->q_tail = NULL;
        r->next = NULL;
        r->busy++;
        r->frames_sent++; /* counted before it goes: its reply may beat us back to the lock */
        atomic_fetch_add(&r->refs, 1);
        pthread_mutex_unlock(&c->lock);
        pthread_mutex_lock(&c->send_lock);
        int rc = send_next(c, r);
        pthread_mutex_unlock(&c->send_lock);
        pthread_mutex_lock(&c->lock);
        if (rc < 0 && !atomic_load(&c->dead))
            fail_locked(c, PT_ERR_PEER_LOST);
        if (rc == 0 && !r->finished && r->frames_sent < r->frames) {
            /* round robin: its next frame after one of every other queued request */
            if (c->q_tail)
                c->q_tail->next = r;
            else
                c->q_head = r;
            c->q_tail = r;
        }
        unbusy_locked(r);
        pt_req_release(r);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
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
            fail_locked(c, PT_ERR_TIMEOUT);
            break;
        }
    pthread_mutex_unlock(&c->lock);
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
        op > PT_TCP_OP_PUT_INDEXED || h->flags)
        return -1;
    pt_status_t st = reply_status(h->status);
    pthread_mutex_lock(&c->lock);
    pt_req_t *r = c->slots[h->id % PT_TCP_MAX_INFLIGHT];
    if (!r || r->id != h->id || r->op != op || r->replied >= r->frames_sent) {
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
        pthread_mutex_unlock(&c->lock);
        int rc = pt__tcp_recv(c->fd, (uint8_t *)r->buf + (h->off - r->off), (size_t)h->len,
                              pt__now() + PT_TCP_IO_TIMEOUT, &c->abort, NULL);
        pthread_mutex_lock(&c->lock);
        int gone = r->finished; /* failed meanwhile: the connection is going */
        unbusy_locked(r);       /* (may free r when gone) */
        if (rc < 0 || gone) {
            pthread_mutex_unlock(&c->lock);
            return -1;
        }
    }
    if (st != PT_OK && r->status == PT_OK)
        r->status = st;
    r->old = h->a;
    if (++r->replied == r->frames)
        finish_locked(c, r, r->status);
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
    if ((size_t)n < sizeof(hb) &&
        pt__tcp_recv(c->fd, hb + n, sizeof(hb) - (size_t)n, pt__now() + PT_TCP_IO_TIMEOUT,
                     &c->abort, NULL) < 0)
        return -1;
    pt_tcp_hdr_t h;
    pt__hdr_unpack(hb, &h);
    return on_reply(c, &h) < 0 ? -1 : 1;
}

static void *receiver_main(void *arg)
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
        struct pollfd pf[2] = {{.fd = c->fd, .events = (short)(mine ? POLLIN | POLLRDHUP
                                                                    : POLLRDHUP)},
                               {.fd = c->rx_wake, .events = POLLIN}};
        int rc = poll(pf, 2, mine ? 100 : 1000);
        if (atomic_load(&c->dead))
            return NULL;
        if (rc < 0 && errno != EINTR)
            break;
        if (rc > 0 && (pf[1].revents & POLLIN)) {
            uint64_t v;
            (void)!read(c->rx_wake, &v, sizeof(v));
        }
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
                struct pollfd w = {.fd = c->rx_wake, .events = POLLIN};
                (void)!poll(&w, 1, 10);
            }
        }
    }
    conn_fail(c, PT_ERR_PEER_LOST);
    return NULL;
}

/* A synchronous call's wait when it took the reading (READ_WAITER): read replies in this
 * thread until r has its outcome, then hand the reading back (to the receiver if more are
 * due). r may be finished and not yet published (the sender thread still letting go of it):
 * that last step wakes us through done as usual. */
static pt_status_t wait_reading(pt_tcp_conn_t *c, pt_req_t *r)
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
            conn_fail(c, PT_ERR_PEER_LOST);
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
        kick_locked(c);
    pthread_mutex_unlock(&c->lock);
    return pt_req_wait(r, -1);
}

/* ---- connections ---- */

static pt_status_t dial(pt_tcp_peer_t *p, double timeout, int *fd_out)
{
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", p->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    if (getaddrinfo(p->host, ps, &hints, &ai) != 0 || !ai)
        return PT_ERR_INVALID;
    pt_status_t st = PT_ERR_PEER_LOST;
    double deadline = pt__now() + timeout;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            double left;
            do {
                left = deadline - pt__now();
                rc = left > 0 ? poll(&pf, 1, (int)(left * 1000) + 1) : 0;
            } while (rc < 0 && errno == EINTR);
            if (rc == 0) {
                close(fd);
                st = PT_ERR_TIMEOUT;
                break;
            }
            int err = 0;
            socklen_t el = sizeof(err);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            rc = err ? -1 : 0;
            errno = err;
        }
        if (rc == 0 && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0) {
            freeaddrinfo(ai);
            *fd_out = fd;
            return PT_OK;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return st;
}

/* The client half of the challenge-response (see tcp_proto.h). */
static pt_status_t authenticate(pt_ctx_t *ctx, int fd, double deadline)
{
    uint8_t hb[PT_TCP_HDR], ns[PT_TCP_NONCE], pl[PT_TCP_NONCE + PT_TCP_MAC], mac[PT_TCP_MAC];
    pt_tcp_hdr_t h;
    if (pt__tcp_recv(fd, hb, sizeof(hb), deadline, NULL, NULL) < 0)
        return errno == ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_PEER_LOST;
    pt__hdr_unpack(hb, &h);
    if (h.magic != PT_TCP_MAGIC || h.op != PT_TCP_OP_HELLO || h.len != PT_TCP_NONCE ||
        h.a != PT_TCP_VERSION)
        return PT_ERR_INVALID;
    if (pt__tcp_recv(fd, ns, sizeof(ns), deadline, NULL, NULL) < 0)
        return errno == ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_PEER_LOST;
    if (pt__tcp_random(pl, PT_TCP_NONCE) < 0)
        return pt__sys();
    pt__tcp_mac(ctx, 0, ns, pl, ctx->rank, pl + PT_TCP_NONCE);
    h = (pt_tcp_hdr_t){.magic = PT_TCP_MAGIC, .op = PT_TCP_OP_AUTH, .len = sizeof(pl),
                       .a = ctx->rank};
    pt__hdr_pack(&h, hb);
    struct iovec iov[2] = {{hb, sizeof(hb)}, {pl, sizeof(pl)}};
    if (pt__tcp_sendv(fd, iov, 2, deadline, NULL) < 0)
        return PT_ERR_PEER_LOST;
    if (pt__tcp_recv(fd, hb, sizeof(hb), deadline, NULL, NULL) < 0)
        return errno == ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_PEER_LOST;
    pt__hdr_unpack(hb, &h);
    if (h.magic != PT_TCP_MAGIC || h.op != PT_TCP_OP_AUTH_OK)
        return PT_ERR_INVALID;
    if (h.status != 0 || h.len != PT_TCP_MAC)
        return PT_ERR_AUTH;
    if (pt__tcp_recv(fd, mac, sizeof(mac), deadline, NULL, NULL) < 0)
        return errno == ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_PEER_LOST;
    uint8_t want[PT_TCP_MAC];
    pt__tcp_mac(ctx, 1, ns, pl, ctx->rank, want);
    return pt__ct_equal(want, mac, PT_TCP_MAC) ? PT_OK : PT_ERR_AUTH;
}

static pt_status_t conn_open(pt_ctx_t *ctx, int rank, pt_tcp_peer_t *p, pt_tcp_conn_t **out)
{
    if (ctx->secret_len == 0)
        return PT_ERR_INVALID;
    int fd;
    pt_status_t st = dial(p, ctx->timeout, &fd);
    if (st != PT_OK)
        return st;
    double deadline = pt__now() + (ctx->timeout < PT_TCP_IO_TIMEOUT ? ctx->timeout
                                                                    : PT_TCP_IO_TIMEOUT);
    if (pt__tcp_tune(fd, 0.25) < 0) {
        st = pt__sys();
        goto err_fd;
    }
    st = authenticate(ctx, fd, deadline);
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
    c->rx_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->rx_wake < 0) {
        st = pt__sys();
        free(c);
        goto err_fd;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->send_lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    pthread_cond_init(&c->slot_cond, NULL);
    if (pthread_create(&c->receiver, NULL, receiver_main, c) != 0) {
        st = PT_ERR_SYS;
        goto err_conn;
    }
    if (pthread_create(&c->sender, NULL, sender_main, c) != 0) {
        conn_fail(c, PT_ERR_CLOSED);
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
    close(c->rx_wake);
    free(c);
err_fd:
    close(fd);
    return st;
}

/* The live connection to rank, made now if there is none (a failed one is kept until destroy:
 * threads may still hold it). */
static pt_status_t conn_get(pt_ctx_t *ctx, int rank, pt_tcp_conn_t **out)
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
        st = atomic_load(&ctx->peers[rank].lost) ? PT_ERR_PEER_LOST
                                                  : conn_open(ctx, rank, p, &nc);
        /* a failure before the handshake is over (refused, closed during HELLO/AUTH, timed
         * out) fails this call only: the peer may be restarting, or a crowd of connections
         * may have pushed ours out; the next call dials again. Only an established,
         * authenticated connection that breaks marks the peer lost (fail_locked). */
        if (st == PT_OK) {
            nc->older = c;
            p->conn = c = nc;
        }
    }
    pthread_mutex_unlock(&p->lock);
    if (st == PT_OK)
        *out = c;
    return st;
}

/* Put req in flight on rank's connection. On PT_OK the connection holds a reference, *cout is
 * the connection and *reader says whether the caller (a synchronous one: `sync`) took the
 * reading of replies, which it then must do (wait_sync). */
static pt_status_t submit(pt_ctx_t *ctx, int rank, pt_req_t *r, int sync, pt_tcp_conn_t **cout,
                          int *reader)
{
    pt_tcp_conn_t *c;
    pt_status_t st = conn_get(ctx, rank, &c);
    if (st != PT_OK)
        return st;
    r->deadline = pt__now() + ctx->timeout;
    r->frames = frame_count(r);
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
        st = c->fail;
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    while (c->slots[c->next_id % PT_TCP_MAX_INFLIGHT])
        c->next_id++;
    r->id = c->next_id++;
    c->slots[r->id % PT_TCP_MAX_INFLIGHT] = r;
    c->inflight++;
    atomic_fetch_add(&r->refs, 1); /* the connection's */
    *cout = c;
    *reader = 0;
    if (c->reading == READ_NONE) {
        if (sync) {
            c->reading = READ_WAITER;
            *reader = 1;
            r->self_read = 1;
        } else {
            kick_locked(c);
        }
    }
    size_t payload = r->op == PT_TCP_OP_PUT ? r->len
                     : r->op == PT_TCP_OP_PUT_INDEXED ? r->n * (8 + r->itemsize) : 0;
    if (c->q_head || r->frames > 1 || payload > PT_TCP_INLINE_MAX) {
        if (c->q_tail)
            c->q_tail->next = r;
        else
            c->q_head = r;
        c->q_tail = r;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
        return PT_OK;
    }
    /* small and nothing queued: write it from this thread */
    r->busy++;
    r->frames_sent = 1;
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_lock(&c->send_lock);
    int rc = send_next(c, r);
    pthread_mutex_unlock(&c->send_lock);
    pthread_mutex_lock(&c->lock);
    if (rc < 0 && !atomic_load(&c->dead))
        fail_locked(c, PT_ERR_PEER_LOST);
    unbusy_locked(r);
    pthread_mutex_unlock(&c->lock);
    return PT_OK;
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
    pt_status_t st = reader ? wait_reading(c, r) : pt_req_wait(r, -1);
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

pt_status_t pt__tcp_rw(pt_ctx_t *ctx, int rank, int put, uint64_t key, uint64_t off, void *buf,
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
    pt_tcp_conn_t *c;
    int reader;
    st = submit(ctx, rank, r, !async_out, &c, &reader);
    if (st != PT_OK) {
        pt_req_release(r);
        return st;
    }
    if (async_out) {
        *async_out = r;
        return PT_OK;
    }
    return wait_sync(c, reader, r, NULL);
}

pt_status_t pt__tcp_atomic(pt_ctx_t *ctx, int rank, int op, uint64_t key, uint64_t off,
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
    pt_tcp_conn_t *c;
    int reader;
    if ((st = submit(ctx, rank, r, 1, &c, &reader)) != PT_OK) {
        pt_req_release(r);
        return st;
    }
    return wait_sync(c, reader, r, old_out);
}

pt_status_t pt__tcp_put_indexed(pt_ctx_t *ctx, int rank, uint64_t key, const uint64_t *offs,
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
    pt_tcp_conn_t *c;
    int reader;
    if ((st = submit(ctx, rank, r, 1, &c, &reader)) != PT_OK) {
        pt_req_release(r);
        return st;
    }
    return wait_sync(c, reader, r, NULL);
}

pt_status_t pt_ctx_tcp_open(pt_ctx_t *ctx, int rank)
{
    pt_tcp_conn_t *c;
    pt_status_t st = check_peer(ctx, rank);
    return st == PT_OK ? conn_get(ctx, rank, &c) : st;
}

pt_status_t pt_ctx_connect_tcp(pt_ctx_t *ctx, int rank, const char *host, int port)
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
        return PT_OK;
    }
    pt_tcp_peer_t *p = calloc(1, sizeof(*p));
    if (!p)
        return PT_ERR_NOMEM;
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    pthread_mutex_init(&p->lock, NULL);
    pe->tcp = p;
    return PT_OK;
}

static void conn_close(pt_tcp_conn_t *c)
{
    /* (a connection that is still up says BYE on its way out: see fail_locked) */
    conn_fail(c, PT_ERR_CLOSED);
    pthread_join(c->sender, NULL);
    pthread_join(c->receiver, NULL);
    close(c->fd);
    close(c->rx_wake);
    pthread_cond_destroy(&c->cond);
    pthread_cond_destroy(&c->slot_cond);
    pthread_mutex_destroy(&c->send_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void pt__tcp_client_stop(pt_ctx_t *ctx)
{
    for (int r = 0; r < ctx->size; r++) {
        pt_tcp_peer_t *p = ctx->peers[r].tcp;
        if (!p)
            continue;
        for (pt_tcp_conn_t *c = p->conn; c;) {
            pt_tcp_conn_t *older = c->older;
            conn_close(c);
            c = older;
        }
        pthread_mutex_destroy(&p->lock);
        free(p);
        ctx->peers[r].tcp = NULL;
    }
}
