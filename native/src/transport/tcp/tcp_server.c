/* The tcp target: a listener thread accepts connections and one thread per connection serves
 * its requests in order, straight between the socket and the registered memory (no staging
 * copy for get and put). The context's Python never takes part.
 *
 * Every request is checked against this process's own registration table (key, bounds, mode),
 * under serve_lock so that a deregistration waits for accesses in progress. Anything malformed
 * closes that connection only, and is counted; nothing is allocated from a length a peer sent
 * beyond PT_TCP_MAX_PAYLOAD. See tcp_proto.h for the frames.
 *
 * A rank waiting for a world peer's unanswered frames (a collective's messages) reads them
 * itself where the platform has a sleeper (Linux): tcp_help.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp_server.h"

static double io_deadline(const serve_t *s)
{
    return s->hs_deadline > 0 ? s->hs_deadline : pt__now() + PT_TCP_IO_TIMEOUT;
}

static int send_frame(serve_t *s, const pt_tcp_hdr_t *h, const void *payload, size_t len)
{
    uint8_t hb[PT_TCP_HDR];
    pt__hdr_pack(h, hb);
    struct iovec iov[2] = {{hb, PT_TCP_HDR}, {(void *)(uintptr_t)payload, len}};
    if (pt__tcp_sendv(s->fd, iov, payload && len ? 2 : 1, io_deadline(s), &s->srv->stopping) < 0)
        return -2;
    atomic_fetch_add(&s->srv->bytes_out, PT_TCP_HDR + (payload ? len : 0));
    return 0;
}

/* Handlers return 0, -1 for a malformed or truncated frame (counted), -2 when the client
 * stopped reading or went away (not counted). */
static int recv_bytes(serve_t *s, void *buf, size_t len)
{
    if (pt__tcp_recv(s->fd, buf, len, io_deadline(s), &s->srv->stopping, NULL) < 0)
        return -1;
    atomic_fetch_add(&s->srv->bytes_in, len);
    return 0;
}

/* A put's payload: recv_bytes, polling while it streams in (pt__tcp_recv_spin). */
static int recv_payload(serve_t *s, void *buf, size_t len)
{
    if (pt__tcp_recv_spin(s->fd, buf, len, io_deadline(s), &s->srv->stopping) < 0)
        return -1;
    atomic_fetch_add(&s->srv->bytes_in, len);
    return 0;
}

static int reply(serve_t *s, const pt_tcp_hdr_t *req, pt_status_t st, int64_t a)
{
    pt_tcp_hdr_t h = *req;
    h.op = (uint16_t)(req->op | PT_TCP_REPLY);
    h.status = (uint32_t)st;
    h.a = a;
    return send_frame(s, &h, NULL, 0);
}

/* Drain a refused request's payload so the stream stays in step. */
static int discard(serve_t *s, uint64_t len)
{
    uint8_t buf[16384];
    while (len) {
        size_t n = len < sizeof(buf) ? (size_t)len : sizeof(buf);
        if (recv_bytes(s, buf, n) < 0)
            return -1;
        len -= n;
    }
    return 0;
}

/* Serve one request whose header is in h. Returns -1 when the connection must close. */
static int serve_get(serve_t *s, const pt_tcp_hdr_t *h)
{
    pt_ctx_t *ctx = s->ctx;
    uint8_t *p = NULL;
    pthread_rwlock_rdlock(&ctx->serve_lock);
    int in_seg;
    pt_status_t st = pt__reg_local(ctx, h->key, h->off, (size_t)h->len, 0, &p, &in_seg);
    pt_tcp_hdr_t r = *h;       /* the bytes asked for, or the status and no payload */
    r.op = (uint16_t)(h->op | PT_TCP_REPLY);
    r.status = (uint32_t)st;
    if (st != PT_OK)
        r.len = 0;
    int rc = send_frame(s, &r, st == PT_OK ? p : NULL, (size_t)r.len);
    pthread_rwlock_unlock(&ctx->serve_lock);
    return rc;
}

static int serve_put(serve_t *s, const pt_tcp_hdr_t *h)
{
    pt_ctx_t *ctx = s->ctx;
    uint8_t *p = NULL;
    pthread_rwlock_rdlock(&ctx->serve_lock);
    int in_seg;
    pt_status_t st = pt__reg_local(ctx, h->key, h->off, (size_t)h->len, 1, &p, &in_seg);
    int rc = st == PT_OK ? recv_payload(s, p, (size_t)h->len) : discard(s, h->len);
    pthread_rwlock_unlock(&ctx->serve_lock);
    if (rc < 0)
        return -1;
    return reply(s, h, st, 0);
}

/* The int64 at (key, off) that an atomic or a notify changes (serve_lock held): writable and
 * 8-byte aligned, in one of our segments or not (served here, an atomic of this process's own:
 * same-machine peers send what they cannot do on memory outside our segments here too). */
static pt_status_t counter(pt_ctx_t *ctx, uint64_t key, uint64_t off, uint8_t **ptr)
{
    int in_seg = 0;
    pt_status_t st = pt__reg_local(ctx, key, off, 8, 1, ptr, &in_seg);
    if (st == PT_OK && ((uintptr_t)*ptr & 7))
        st = PT_ERR_ALIGN;
    return st;
}

/* Add v to the int64 at p and wake pt_wait_local on its low word (as the shm notify does),
 * unless no waiter of this process is asleep (pt__asleep): a rank that reads its own frames
 * (tcp_help.c) is awake, and a wake-up for nobody is a system call a frame. Only this
 * process waits on its windows' counters. */
static int64_t bump(uint8_t *p, int64_t v)
{
    int64_t old = atomic_fetch_add((_Atomic int64_t *)(uintptr_t)p, v);
    if (atomic_load(&pt__asleep))
        pt_plat_wake(pt__low_word(p), 1);
    return old;
}

/* A put whose bytes are all in memory before the counter (a, b) moves (tcp_proto.h). Both
 * targets are checked before anything is written: a refusal changes nothing. PUT_NOTIFY_QUIET
 * is not answered: a refusal is only counted. */
static int serve_put_notify(serve_t *s, const pt_tcp_hdr_t *h)
{
    uint8_t vb[8];
    if (recv_bytes(s, vb, sizeof(vb)) < 0)
        return -1;
    pt__tcp_part_begin(s, h, (int64_t)pt__le_get(vb, 8), 0);
    if (pt__tcp_part_read(s, -1) < 0)
        return -1;
    return h->op == PT_TCP_OP_PUT_NOTIFY_QUIET ? 0 : reply(s, h, s->part.st, s->part.old);
}

void pt__tcp_part_begin(serve_t *s, const pt_tcp_hdr_t *h, int64_t v, uint32_t head)
{
    s->part = (pt_tcp_part_t){.h = *h, .v = v, .head = head, .st = PT_OK, .on = 1};
}

/* What comes of s->part while it streams in, polled as pt__tcp_recv_spin polls (up to the
 * spin time since the last bytes), never past `until`: 0, or -1 when the stream broke. The
 * header and value (peeked) come out with the first payload bytes, in one read. */
static int part_take(serve_t *s, uint8_t *p, uint64_t n, double until)
{
    pt_tcp_part_t *q = &s->part;
    uint8_t head[PT_TCP_HDR + 8], junk[16384];
    double spin = pt__spin_seconds(), last = pt__now();
    while (q->head || q->done < n) {
        size_t want = (size_t)(n - q->done);
        if (!p && want > sizeof(junk))
            want = sizeof(junk);
        struct iovec iov[2] = {{head, q->head}, {p ? p : junk, want}};
        struct msghdr m = {.msg_iov = q->head ? iov : iov + 1, .msg_iovlen = q->head ? 2 : 1};
        ssize_t r = recvmsg(s->fd, &m, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            double now = pt__now();
            if (now - last >= spin || now >= until)
                return 0;
            pt__relax(now - last);
            continue;
        }
        if (r <= 0)
            return -1;
        last = pt__now();
        atomic_fetch_add(&s->srv->bytes_in, (uint64_t)r);
        size_t h = (size_t)r < q->head ? (size_t)r : q->head;
        q->head -= (uint32_t)h;
        q->done += (uint64_t)r - h;
        if (p)
            p += (size_t)r - h;
    }
    return 0;
}

int pt__tcp_part_read(serve_t *s, double until)
{
    pt_tcp_part_t *q = &s->part;
    pt_ctx_t *ctx = s->ctx;
    uint64_t n = q->h.len - 8;
    uint8_t *p = NULL, *ctr = NULL, head[PT_TCP_HDR + 8];
    int in_seg, rc;
    pthread_rwlock_rdlock(&ctx->serve_lock);
    /* the place of the rest, looked up again: a deregistration between two parts refuses
     * the rest (read and dropped) */
    if (q->st == PT_OK)
        q->st = pt__reg_local(ctx, q->h.key, q->h.off + q->done, (size_t)(n - q->done), 1,
                              &p, &in_seg);
    if (q->st == PT_OK)
        q->st = counter(ctx, (uint64_t)q->h.a, (uint64_t)q->h.b, &ctr);
    if (q->st != PT_OK)
        p = NULL;
    if (until >= 0) {
        rc = part_take(s, p, n, until);
    } else {
        rc = q->head ? recv_bytes(s, head, q->head) : 0;
        uint64_t left = n - q->done;
        if (rc == 0 && left)
            rc = p ? recv_payload(s, p, (size_t)left) : discard(s, left);
        if (rc == 0)
            q->head = 0, q->done = n;
    }
    if (rc == 0 && !q->head && q->done == n) {
        int quiet = q->h.op == PT_TCP_OP_PUT_NOTIFY_QUIET;
        /* a frame of a longer quiet put before its last adds nothing: no wake-up either */
        if (q->st == PT_OK && (q->v || !quiet))
            q->old = bump(ctr, q->v);
        else if (q->st != PT_OK && quiet)
            atomic_fetch_add(&s->srv->quiet_refused, 1);
#ifdef TCP_QUICKACK
        if (quiet && q->v && q->h.len >= PT_TCP_QUICKACK_MIN) { /* (see there) */
            int one = 1;
            (void)setsockopt(s->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
        }
#endif
        q->on = 0;
        rc = 1;
    }
    pthread_rwlock_unlock(&ctx->serve_lock);
    return rc;
}

static int serve_atomic(serve_t *s, const pt_tcp_hdr_t *h)
{
    pt_ctx_t *ctx = s->ctx;
    uint8_t *p = NULL;
    int64_t old = 0;
    pthread_rwlock_rdlock(&ctx->serve_lock);
    pt_status_t st = counter(ctx, h->key, h->off, &p);
    if (st == PT_OK && h->op == PT_TCP_OP_NOTIFY) {
        old = bump(p, h->a);
    } else if (st == PT_OK) {
        _Atomic int64_t *v = (_Atomic int64_t *)(uintptr_t)p;
        if (h->op == PT_TCP_OP_CSWAP) {
            int64_t e = h->a;
            atomic_compare_exchange_strong(v, &e, h->b);
            old = e;
        } else {
            old = atomic_fetch_add(v, h->a);
        }
    }
    pthread_rwlock_unlock(&ctx->serve_lock);
    return reply(s, h, st, old);
}

static int serve_put_indexed(serve_t *s, const pt_tcp_hdr_t *h)
{
    pt_ctx_t *ctx = s->ctx;
    uint64_t isz = (uint64_t)h->b, span = (uint64_t)h->a;
    if (h->b <= 0 || isz > PT_TCP_MAX_PAYLOAD || h->len == 0 || h->len % (8 + isz) ||
        h->a <= 0 || span < isz)
        return -1;
    size_t n = (size_t)(h->len / (8 + isz));
    if (s->scratch_len < h->len) {
        uint8_t *b = realloc(s->scratch, (size_t)h->len);
        if (!b)
            return -1;
        s->scratch = b;
        s->scratch_len = (size_t)h->len;
    }
    if (recv_bytes(s, s->scratch, (size_t)h->len) < 0)
        return -1;
    const uint8_t *offs = s->scratch, *items = s->scratch + 8 * n;
    pthread_rwlock_rdlock(&ctx->serve_lock);
    uint8_t *base = NULL;
    int in_seg;
    pt_status_t st = pt__reg_local(ctx, h->key, h->off, (size_t)span, 1, &base, &in_seg);
    for (size_t i = 0; st == PT_OK && i < n; i++) {
        uint64_t o = pt__le_get(offs + 8 * i, 8);
        if (o < h->off || o - h->off > span - isz)
            st = PT_ERR_BOUNDS;
    }
    for (size_t i = 0; st == PT_OK && i < n; i++) {
        uint64_t o = pt__le_get(offs + 8 * i, 8) - h->off;
        memcpy(base + o, items + i * isz, (size_t)isz);
    }
    pthread_rwlock_unlock(&ctx->serve_lock);
    return reply(s, h, st, 0);
}

/* The connection leaves the handshake budget for the authenticated one; -1 when it was closed
 * to make room meanwhile, or the authenticated ones are at their cap. */
static int admit(serve_t *s)
{
    pt_tcp_server_t *srv = s->srv;
    int rc = 0;
    pthread_mutex_lock(&srv->lock);
    if (atomic_load(&s->conn->evicted)) {
        rc = -1;
    } else {
        srv->pending--;
        s->conn->authed = 1;
        if (srv->authed >= PT_TCP_MAX_CONNS) {
            s->conn->authed = 0;
            atomic_store(&s->conn->evicted, 1); /* (not pending any more either) */
            atomic_fetch_add(&srv->refused, 1);
            rc = -1;
        } else {
            srv->authed++;
        }
    }
    pthread_mutex_unlock(&srv->lock);
    return rc;
}

/* The challenge-response, within PT_TCP_HANDSHAKE_TIMEOUT; 0 when the client proved the
 * secret (and was admitted: it then holds one of the authenticated connections' places). */
static int handshake(serve_t *s)
{
    pt_tcp_server_t *srv = s->srv;
    uint8_t ns[PT_TCP_NONCE], in[PT_TCP_HDR], pl[PT_TCP_NONCE + PT_TCP_MAC], mac[PT_TCP_MAC];
    if (pt_plat_random(ns, sizeof(ns)) != PT_OK)
        return -1;
    pt_tcp_hdr_t h = {.magic = PT_TCP_MAGIC, .op = PT_TCP_OP_HELLO, .len = PT_TCP_NONCE,
                      .a = PT_TCP_VERSION, .b = (int64_t)srv->incarnation};
    if (send_frame(s, &h, ns, sizeof(ns)) < 0)
        return -1;
    size_t got = 0;
    if (pt__tcp_recv(s->fd, in, sizeof(in), io_deadline(s), &srv->stopping, &got) < 0) {
        if (got == 0)
            return -1; /* closed (or silent) before saying anything: not a frame */
        goto bad;
    }
    atomic_fetch_add(&srv->bytes_in, sizeof(in));
    pt__hdr_unpack(in, &h);
    if (h.magic != PT_TCP_MAGIC || h.op != PT_TCP_OP_AUTH || h.len != sizeof(pl) || h.flags)
        goto bad;
    if (recv_bytes(s, pl, sizeof(pl)) < 0)
        goto bad;
    pt__tcp_mac(s->ctx, 0, ns, pl, h.a, mac);
    if (!pt__ct_equal(mac, pl + PT_TCP_NONCE, PT_TCP_MAC)) {
        atomic_fetch_add(&srv->auth_failures, 1);
        pt_tcp_hdr_t r = {.magic = PT_TCP_MAGIC, .op = PT_TCP_OP_AUTH_OK,
                          .status = PT_ERR_AUTH};
        send_frame(s, &r, NULL, 0);
        return -1;
    }
    /* admitted before AUTH_OK goes: once the client has it, only a failure of ours or the
     * client's end closes the connection (never the listener making room) */
    if (admit(s) < 0)
        return -1;
    pt__tcp_mac(s->ctx, 1, ns, pl, h.a, mac);
    pt_tcp_hdr_t r = {.magic = PT_TCP_MAGIC, .op = PT_TCP_OP_AUTH_OK, .len = PT_TCP_MAC};
    if (send_frame(s, &r, mac, sizeof(mac)) < 0)
        return -1;
    /* a world rank we also reach over tcp: its connection dropping is looked into */
    if (h.a >= 0 && h.a < s->ctx->size && h.a != s->ctx->rank) {
        s->from = (int)h.a;
        if (s->ctx->peers[h.a].tcp)
            s->rank = (int)h.a;
    }
    return 0;
bad:
    if (!atomic_load(&srv->stopping) && !atomic_load(&s->conn->evicted))
        atomic_fetch_add(&srv->bad_frames, 1);
    return -1;
}

int pt__tcp_valid_request(const pt_tcp_hdr_t *h)
{
    if (h->magic != PT_TCP_MAGIC || h->flags || h->status || h->rsvd)
        return 0;
    switch (h->op) {
    case PT_TCP_OP_GET:
    case PT_TCP_OP_PUT:
    case PT_TCP_OP_PUT_INDEXED:
        return h->len <= PT_TCP_MAX_PAYLOAD;
    case PT_TCP_OP_PUT_NOTIFY:
    case PT_TCP_OP_PUT_NOTIFY_QUIET:
        return h->len >= 8 && h->len <= PT_TCP_MAX_PAYLOAD;
    case PT_TCP_OP_FETCH_ADD:
    case PT_TCP_OP_CSWAP:
    case PT_TCP_OP_NOTIFY:
    case PT_TCP_OP_BYE:
        return h->len == 0;
    }
    return 0;
}

static void *serve_main(void *arg)
{
    pt_tcp_sconn_t *c = arg;
    pt_tcp_server_t *srv = c->srv;
    serve_t s = {.srv = srv, .conn = c, .ctx = srv->ctx, .fd = c->fd, .rank = -1, .from = -1,
                 .hs_deadline = pt__now() + PT_TCP_HANDSHAKE_TIMEOUT};
    int clean = 0;
    if (pt__tcp_tune(c->fd, 0.5) < 0 || handshake(&s) < 0)
        goto out;
    s.hs_deadline = 0;
    int help = pt__tcp_helpable(c, &s); /* from here on, rd is held except while asleep */
    int quiet = 0; /* the last request was PUT_NOTIFY_QUIET */
    for (;;) {
        uint8_t hb[PT_TCP_HDR];
        /* poll briefly before blocking: a client issuing requests back to back (a loop of
         * synchronous calls) sends the next one within microseconds, and taking it without
         * the sleep and wake-up halves a small request's round trip (pt__relax gives the
         * core away after a few microseconds; POOLTENSOR_SPIN_US=0 turns this off). Not
         * after an unanswered frame: its sender is not waiting for us, and the thread our
         * notify just woke (a collective's receiver) wants the core (measured across two
         * namespaces on 2 cores: a 4 KiB allreduce 1.5-2x slower with the poll) */
        int ready = 0;
        for (double t0 = pt__now(), el = 0, spin = quiet ? 0 : pt__spin_seconds(); el < spin;
             el = pt__now() - t0) {
            struct pollfd pf = {.fd = c->fd, .events = POLLIN};
            if (poll(&pf, 1, 0) != 0) {
                ready = 1;
                break;
            }
            pt__relax(el);
        }
        if (help && !ready && !pt__tcp_readable(c->fd)) {
            /* asleep without the token: a waiting rank may read meanwhile */
            pt__tcp_sleep_unlocked(c);
            if (atomic_load(&srv->stopping)) {
                clean = 1;
                break;
            }
            continue; /* (what woke us may have been read by a helper already) */
        }
        if (s.part.on) { /* a frame a helper began: the rest of it first */
            if (pt__tcp_part_read(&s, -1) < 0) {
                if (!atomic_load(&srv->stopping))
                    atomic_fetch_add(&srv->bad_frames, 1);
                clean = atomic_load(&srv->stopping);
                break;
            }
            quiet = 1;
            continue;
        }
        /* wait for the next header in recv itself (one system call a request, no poll);
         * the socket's receive timeout brings us back here to look at stopping */
        ssize_t n = recv(c->fd, hb, sizeof(hb), MSG_WAITALL);
        if (atomic_load(&srv->stopping)) {
            clean = 1;
            break;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            continue;
        if (n <= 0)
            break; /* closed or reset between frames */
        size_t got = 0;
        if ((size_t)n < sizeof(hb) &&
            pt__tcp_recv(c->fd, hb + n, sizeof(hb) - (size_t)n, io_deadline(&s),
                         &srv->stopping, &got) < 0) {
            if (!atomic_load(&srv->stopping))
                atomic_fetch_add(&srv->bad_frames, 1); /* truncated header */
            clean = atomic_load(&srv->stopping);
            break;
        }
        atomic_fetch_add(&srv->bytes_in, sizeof(hb));
        pt_tcp_hdr_t h;
        pt__hdr_unpack(hb, &h);
        if (!pt__tcp_valid_request(&h)) {
            atomic_fetch_add(&srv->bad_frames, 1);
            break;
        }
        if (h.op == PT_TCP_OP_BYE) {
            clean = 1;
            break;
        }
        atomic_fetch_add(&srv->requests, 1);
        quiet = h.op == PT_TCP_OP_PUT_NOTIFY_QUIET;
        int rc;
        switch (h.op) {
        case PT_TCP_OP_GET: rc = serve_get(&s, &h); break;
        case PT_TCP_OP_PUT: rc = serve_put(&s, &h); break;
        case PT_TCP_OP_PUT_INDEXED: rc = serve_put_indexed(&s, &h); break;
        case PT_TCP_OP_PUT_NOTIFY:
        case PT_TCP_OP_PUT_NOTIFY_QUIET: rc = serve_put_notify(&s, &h); break;
        default: rc = serve_atomic(&s, &h); break;
        }
        if (rc < 0) {
            if (rc == -1 && !atomic_load(&srv->stopping))
                atomic_fetch_add(&srv->bad_frames, 1);
            clean = atomic_load(&srv->stopping);
            break;
        }
    }
    if (!clean && s.rank >= 0)
        pt__tcp_peer_dropped(s.ctx, s.rank); /* dropped or dead? (tcp_reconnect.c) */
out:
    free(s.scratch);
    /* closed here, at once (not at the next accept): a peer still sending gets a reset
     * instead of a half-closed socket that keeps taking its bytes. Under the list lock, so
     * that the listener never shuts down a descriptor number reused meanwhile, and so that
     * no helper picks this connection any more (it picks under that lock; rd is ours). */
    pthread_mutex_lock(&srv->lock);
    close(c->fd);
    c->fd = -1;
    atomic_store(&c->rank, -1);
    if (c->ep >= 0) {
        pt_plat_sleeper_close(c->alarm);
        pt_plat_sleeper_close(c->ep);
        c->ep = c->alarm = -1;
        pthread_mutex_unlock(&c->rd);
    }
    if (c->authed)
        srv->authed--;
    else if (!atomic_load(&c->evicted))
        srv->pending--;
    pthread_mutex_unlock(&srv->lock);
    atomic_fetch_sub(&srv->active, 1);
    atomic_store(&c->done, 1);
    return NULL;
}

/* Join and free connections whose thread has finished (all of them when `all`). The joins
 * happen outside the lock: a finishing thread takes it to give back its place. */
static void reap(pt_tcp_server_t *srv, int all)
{
    pt_tcp_sconn_t *gone = NULL;
    pthread_mutex_lock(&srv->lock);
    pt_tcp_sconn_t **pp = &srv->conns;
    while (*pp) {
        pt_tcp_sconn_t *c = *pp;
        if (all && c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
        if (all || atomic_load(&c->done)) {
            *pp = c->next;
            c->next = gone;
            gone = c;
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&srv->lock);
    while (gone) {
        pt_tcp_sconn_t *c = gone;
        gone = c->next;
        pthread_join(c->thread, NULL);
        pthread_mutex_destroy(&c->rd);
        free(c);
    }
}

/* Make room for a new connection: close the oldest one still in its handshake (lock held). */
static void evict_oldest_locked(pt_tcp_server_t *srv)
{
    pt_tcp_sconn_t *old = NULL;
    for (pt_tcp_sconn_t *c = srv->conns; c; c = c->next)
        if (!c->authed && !atomic_load(&c->evicted) && c->fd >= 0 &&
            (!old || c->seq < old->seq))
            old = c;
    if (!old)
        return;
    atomic_store(&old->evicted, 1);
    shutdown(old->fd, SHUT_RDWR); /* its thread sees the end and leaves */
    srv->pending--;
    atomic_fetch_add(&srv->refused, 1);
}

static void *listen_main(void *arg)
{
    pt_tcp_server_t *srv = arg;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (;;) {
        struct pollfd pf[2] = {{.fd = srv->lfd, .events = POLLIN},
                               {.fd = srv->wake.rfd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (atomic_load(&srv->stopping))
            break;
        if (!(pf[0].revents & POLLIN))
            continue;
        int fd = pt_plat_accept(srv->lfd);
        if (fd < 0)
            continue;
        reap(srv, 0);
        atomic_fetch_add(&srv->accepted, 1);
        pt_tcp_sconn_t *c = calloc(1, sizeof(*c));
        pthread_mutex_lock(&srv->lock);
        if (!c || srv->authed >= PT_TCP_MAX_CONNS) {
            pthread_mutex_unlock(&srv->lock);
            atomic_fetch_add(&srv->refused, 1);
            close(fd);
            free(c);
            continue;
        }
        /* unauthenticated connections cost nothing to open: they share a budget of their
         * own, and the newest one displaces the oldest (rather than being refused) */
        if (srv->pending >= PT_TCP_MAX_PENDING)
            evict_oldest_locked(srv);
        c->srv = srv;
        c->fd = fd;
        c->ep = c->alarm = -1;
        atomic_store(&c->linger, 0);
        atomic_store(&c->rank, -1);
        pthread_mutex_init(&c->rd, NULL);
        c->seq = srv->seq++;
        atomic_fetch_add(&srv->active, 1);
        if (pthread_create(&c->thread, &attr, serve_main, c) != 0) {
            pthread_mutex_unlock(&srv->lock);
            atomic_fetch_sub(&srv->active, 1);
            close(fd);
            pthread_mutex_destroy(&c->rd);
            free(c);
            continue;
        }
        srv->pending++; /* (the thread takes the lock before it changes pending) */
        c->next = srv->conns;
        srv->conns = c;
        pthread_mutex_unlock(&srv->lock);
    }
    pthread_attr_destroy(&attr);
    return NULL;
}

pt_status_t pt_ctx_listen(pt_ctx_t *ctx, const char *host, int port, int *port_out)
{
    if (!ctx || port < 0 || port > 65535 || !port_out)
        return PT_ERR_INVALID;
    if (ctx->secret_len == 0 || ctx->server)
        return PT_ERR_INVALID;
    if (!host || !*host)
        host = "127.0.0.1";
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai)
        return PT_ERR_INVALID;
    pt_status_t st = PT_ERR_SYS;
    int lfd = pt_plat_socket(ai->ai_family, 0);
    if (lfd < 0) {
        st = pt__sys();
        goto err_ai;
    }
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(lfd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(lfd, 128) < 0) {
        st = pt__sys();
        goto err_sock;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(lfd, (struct sockaddr *)&ss, &sl) < 0) {
        st = pt__sys();
        goto err_sock;
    }
    int bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    pt_tcp_server_t *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        st = PT_ERR_NOMEM;
        goto err_sock;
    }
    srv->ctx = ctx;
    srv->lfd = lfd;
    const char *he = getenv("POOLTENSOR_TCP_HELP");
    srv->help = !(he && *he == '0');
    while (!srv->incarnation && pt_plat_random(&srv->incarnation, 8) == PT_OK) {
    }
    pthread_mutex_init(&srv->lock, NULL);
    st = pt_plat_wakefd_open(&srv->wake);
    if (st != PT_OK)
        goto err_srv;
    if (pthread_create(&srv->thread, NULL, listen_main, srv) != 0) {
        st = PT_ERR_SYS;
        goto err_wake;
    }
    ctx->server = srv;
    freeaddrinfo(ai);
    *port_out = bound;
    return PT_OK;
err_wake:
    pt_plat_wakefd_close(&srv->wake);
err_srv:
    free(srv);
err_sock:
    close(lfd);
err_ai:
    freeaddrinfo(ai);
    return st;
}

void pt__tcp_server_stop(pt_ctx_t *ctx)
{
    pt_tcp_server_t *srv = ctx->server;
    if (!srv)
        return;
    atomic_store(&srv->stopping, 1);
    pt_plat_wakefd_signal(&srv->wake);
    pthread_join(srv->thread, NULL);
    reap(srv, 1);
    close(srv->lfd);
    pt_plat_wakefd_close(&srv->wake);
    pthread_mutex_destroy(&srv->lock);
    ctx->server = NULL;
    free(srv);
}

void pt_ctx_tcp_stats(pt_ctx_t *ctx, pt_tcp_stats_t *out)
{
    pt_tcp_server_t *srv = ctx ? ctx->server : NULL;
    memset(out, 0, sizeof(*out));
    if (!srv)
        return;
    out->accepted = atomic_load(&srv->accepted);
    out->active = atomic_load(&srv->active);
    out->auth_failures = atomic_load(&srv->auth_failures);
    out->bad_frames = atomic_load(&srv->bad_frames);
    out->requests = atomic_load(&srv->requests);
    out->bytes_in = atomic_load(&srv->bytes_in);
    out->bytes_out = atomic_load(&srv->bytes_out);
    out->refused = atomic_load(&srv->refused);
    out->quiet_refused = atomic_load(&srv->quiet_refused);
    out->helped = atomic_load(&srv->helped);
}
