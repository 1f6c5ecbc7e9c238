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

void pt__tcp_sleep_unlocked(pt_tcp_sconn_t *c)
{
    if (!atomic_load(&c->linger))
        pt_plat_sleeper_arm(c->ep, c->fd, 1);
    pthread_mutex_unlock(&c->rd);
    pt_plat_sleeper_wait(c->ep, 500);
    pthread_mutex_lock(&c->rd);
    /* woken while a helper lingered (its alarm, most likely): the socket is ours again */
    if (atomic_exchange(&c->linger, 0))
        (void)pt_plat_sleeper_rang(c->alarm);
}

/* Serve the complete PUT_NOTIFY_QUIET frames waiting on c (the helper holds rd): how many,
 * or -1 when the next input is not one (another request, the end, an error): the thread
 * reads that once the helper gives the token back. A frame cut short breaks the stream: the
 * connection is shut down and its thread ends it. */
static int help_one(pt_tcp_sconn_t *c)
{
    pt_tcp_server_t *srv = c->srv;
    int n = 0;
    for (;;) {
        uint8_t hb[PT_TCP_HDR];
        ssize_t got = recv(c->fd, hb, sizeof(hb), MSG_PEEK | MSG_DONTWAIT);
        if (got < (ssize_t)sizeof(hb)) {
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                return -1;
            return n; /* nothing yet, or a header still arriving */
        }
        pt_tcp_hdr_t h;
        pt__hdr_unpack(hb, &h);
        if (h.op != PT_TCP_OP_PUT_NOTIFY_QUIET || !pt__tcp_valid_request(&h))
            return n ? n : -1;
        if (recv(c->fd, hb, sizeof(hb), MSG_DONTWAIT) != (ssize_t)sizeof(hb))
            return -1;
        atomic_fetch_add(&srv->bytes_in, sizeof(hb));
        atomic_fetch_add(&srv->requests, 1);
        if (pt__tcp_serve_put_notify(c->s, &h) < 0) {
            atomic_fetch_add(&srv->bad_frames, 1);
            shutdown(c->fd, SHUT_RDWR);
            return -1;
        }
        atomic_fetch_add(&srv->helped, 1);
        n++;
    }
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
    for (int i = 0; i < k; i++)
        pt_plat_sleeper_arm(mine[i]->ep, mine[i]->fd, 0);
    double t0 = pt__now();
    int rc = 0, stop = 0;
    for (;;) {
        if (atomic_load_explicit(ctr, memory_order_acquire) >= value) {
            rc = 1;
            break;
        }
        for (int i = 0; i < k && !stop; i++)
            if (help_one(mine[i]) < 0)
                stop = 1;
        if (atomic_load_explicit(ctr, memory_order_acquire) >= value) {
            rc = 1;
            break;
        }
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
    for (int i = 0; i < k; i++) {
        if (rc == 1 && mine[i]->alarm >= 0) {
            /* the frame came: the next one will be waited for soon (see the top) */
            atomic_store(&mine[i]->linger, 1);
            pt_plat_sleeper_alarm(mine[i]->alarm, PT_TCP_LINGER);
        } else {
            atomic_store(&mine[i]->linger, 0);
            pt_plat_sleeper_arm(mine[i]->ep, mine[i]->fd, 1);
        }
        pthread_mutex_unlock(&mine[i]->rd);
    }
    return rc;
}
