/* A rank waiting for a world peer's unanswered frames (a collective's messages) reads them
 * itself (pt__tcp_help, where the platform has a sleeper: Linux): a frame served by the
 * connection's thread costs two wake-ups (that thread's, then the waiter's), one read by the
 * waiter costs one, as in MPI libraries where the rank reads its own sockets. Whoever holds a
 * connection's reader token (rd) reads its socket; its thread (tcp_server.c) sleeps without
 * the token on the platform's sleeper, whose interest the helper switches off while it reads
 * (that wakes nobody) and on again after. A helper whose frame came leaves the interest off
 * and sets the sleeper's alarm instead (PT_TCP_LINGER): a collective's next frame from that
 * peer comes while its rank is between calls, and would wake the thread for nothing but to be
 * read by it; the rank's next wait reads it. Should the rank not come back, the alarm wakes
 * the thread, which takes the socket back. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include "transport/tcp/tcp_server.h"

int pt__tcp_readable(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    return poll(&pf, 1, 0) > 0;
}

int pt__tcp_helpable(pt_tcp_sconn_t *c, serve_t *s)
{
    if (!c->srv->help || s->from < 0)
        return 0;
    c->ep = pt_plat_sleeper_open(c->fd);
    if (c->ep < 0)
        return 0;
    c->alarm = pt_plat_sleeper_timer(c->ep);
    c->s = s;
    pthread_mutex_lock(&c->rd);
    pthread_mutex_lock(&c->srv->lock);
    atomic_store(&c->rank, s->from);
    pthread_mutex_unlock(&c->srv->lock);
    return 1;
}

static int64_t now_ns(void)
{
    return (int64_t)(pt__now() * 1e9);
}

void pt__tcp_sleep_unlocked(pt_tcp_sconn_t *c)
{
    for (;;) {
        if (!atomic_load(&c->linger))
            pt_plat_sleeper_arm(c->ep, c->fd, 1);
        pthread_mutex_unlock(&c->rd);
        pt_plat_sleeper_wait(c->ep, 500);
        pthread_mutex_lock(&c->rd);
        if (!atomic_load(&c->linger))
            return;
        /* woken while a helper lingered (its alarm, most likely): a helper that read a frame
         * since moved the deadline, and the socket stays the rank's until then; after it,
         * the socket is ours again */
        (void)pt_plat_sleeper_rang(c->alarm);
        int64_t left = atomic_load(&c->linger_ns) - now_ns();
        if (left <= 0 || atomic_load(&c->srv->stopping)) {
            atomic_store(&c->linger, 0);
            return;
        }
        pt_plat_sleeper_alarm(c->alarm, (double)left * 1e-9);
    }
}

/* Serve the next PUT_NOTIFY_QUIET frame on c, or the one begun (the helper holds rd), as far
 * as it comes before `until`: 1 when a frame is all in, 0 when it is not yet (or nothing, or
 * only part of a header, is there), -1 when the next input is not one (another request, the
 * end, an error): the thread reads that once the helper gives the token back. A frame is
 * never waited for past `until`: its rank waits with a deadline of its own, and the rest of
 * a frame cut off by a partition is read by whoever holds the token next (pt_tcp_part_t).
 * The header and its value are peeked, then read with the payload. A broken stream is shut
 * down; its thread ends it. */
static int help_one(pt_tcp_sconn_t *c, double until)
{
    pt_tcp_server_t *srv = c->srv;
    serve_t *s = c->s;
    if (!s->part.on) {
        uint8_t hb[PT_TCP_HDR + 8];
        ssize_t got = recv(c->fd, hb, sizeof(hb), MSG_PEEK | MSG_DONTWAIT);
        if (got < PT_TCP_HDR) {
            if (got == 0 ||
                (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                return -1;
            return 0;
        }
        pt_tcp_hdr_t h;
        pt__hdr_unpack(hb, &h);
        if (h.op != PT_TCP_OP_PUT_NOTIFY_QUIET || !pt__tcp_valid_request(&h))
            return -1;
        if (got < (ssize_t)sizeof(hb))
            return 0; /* the value still arriving */
        atomic_fetch_add(&srv->requests, 1);
        pt__tcp_part_begin(s, &h, (int64_t)pt__le_get(hb + PT_TCP_HDR, 8), sizeof(hb));
    }
    int r = pt__tcp_part_read(s, until);
    if (r < 0) {
        atomic_fetch_add(&srv->bad_frames, 1);
        shutdown(c->fd, SHUT_RDWR);
        return -1;
    }
    if (r > 0)
        atomic_fetch_add(&srv->helped, 1);
    return r;
}

#define HELP_CONNS 8

int pt__tcp_help(pt_ctx_t *ctx, int rank, const void *counter, int64_t value, double spin,
                 double slice)
{
    pt_tcp_server_t *srv = ctx ? ctx->server : NULL;
    if (!srv || !srv->help || rank < 0 || atomic_load(&srv->stopping))
        return -1;
    _Atomic int64_t *ctr = (_Atomic int64_t *)(uintptr_t)counter;
    /* every connection from rank, or none: one left to its thread could carry the frame
     * while the helper sleeps on the others */
    pt_tcp_sconn_t *mine[HELP_CONNS];
    int k = 0, all = 1;
    pthread_mutex_lock(&srv->lock);
    for (pt_tcp_sconn_t *x = srv->conns; x && all; x = x->next) {
        if (x->fd < 0 || atomic_load(&x->rank) != rank)
            continue;
        if (k < HELP_CONNS && pthread_mutex_trylock(&x->rd) == 0)
            mine[k++] = x;
        else
            all = 0;
    }
    pthread_mutex_unlock(&srv->lock);
    if (!all || k == 0) {
        while (k)
            pthread_mutex_unlock(&mine[--k]->rd);
        return -1;
    }
    for (int i = 0; i < k; i++) /* (a lingering one's interest is off already) */
        if (!atomic_load(&mine[i]->linger))
            pt_plat_sleeper_arm(mine[i]->ep, mine[i]->fd, 0);
    double t0 = pt__now();
    int rc = 0, stop = 0, read = 0;
    for (;;) {
        if (atomic_load_explicit(ctr, memory_order_acquire) >= value) {
            rc = 1;
            break;
        }
        int more = 0;
        for (int i = 0; i < k && !stop; i++) {
            /* every frame there: a slot's release behind this call's message is read now,
             * not left in the socket until the next wait */
            int r;
            while ((r = help_one(mine[i], t0 + slice)) > 0)
                more = 1;
            stop = r < 0;
        }
        read |= more;
        if (more)
            continue; /* (the counter) */
        double el = pt__now() - t0;
        if (stop || el >= slice || atomic_load(&srv->stopping)) {
            rc = stop ? -1 : 0;
            break;
        }
        if (el < spin) { /* poll the sockets briefly, as a wait polls its counter */
            pt__relax(el);
            continue;
        }
        struct pollfd pf[HELP_CONNS];
        for (int i = 0; i < k; i++)
            pf[i] = (struct pollfd){.fd = mine[i]->fd, .events = POLLIN};
        (void)poll(pf, (nfds_t)k, (int)((slice - el) * 1e3) + 1);
    }
    int64_t until = now_ns() + (int64_t)(PT_TCP_LINGER * 1e9);
    for (int i = 0; i < k; i++) {
        if (rc == 1 && !stop && mine[i]->alarm >= 0) {
            /* the frame came: the next one will be waited for soon (see the top). Only a
             * helper that read moves the deadline: one whose frame was read before it came
             * would otherwise keep the socket from its thread as long as it kept coming. A
             * request behind the frames (stop) goes to the thread now */
            if (read || !atomic_load(&mine[i]->linger))
                atomic_store(&mine[i]->linger_ns, until);
            if (!atomic_exchange(&mine[i]->linger, 1))
                pt_plat_sleeper_alarm(mine[i]->alarm, PT_TCP_LINGER);
        } else {
            atomic_store(&mine[i]->linger, 0);
            pt_plat_sleeper_arm(mine[i]->ep, mine[i]->fd, 1);
        }
        pthread_mutex_unlock(&mine[i]->rd);
    }
    return rc;
}
