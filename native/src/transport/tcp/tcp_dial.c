/* The tcp initiator's way in: a socket to the peer within a time limit (a refused one told
 * apart: nothing listens there), then the client half of the challenge-response, which also
 * learns the listener's incarnation (tcp_proto.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp_client.h"

pt_status_t pt__tcp_dial(pt_tcp_peer_t *p, double timeout, int *fd_out, int *refused)
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
        int fd = pt_plat_socket(a->ai_family, 1);
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
        if (rc < 0 && errno == ECONNREFUSED)
            *refused = 1; /* nothing listens there (a process that is gone) */
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
pt_status_t pt__tcp_authenticate(pt_ctx_t *ctx, int fd, double deadline, uint64_t *inc)
{
    uint8_t hb[PT_TCP_HDR], ns[PT_TCP_NONCE], pl[PT_TCP_NONCE + PT_TCP_MAC], mac[PT_TCP_MAC];
    pt_tcp_hdr_t h;
    if (pt__tcp_recv(fd, hb, sizeof(hb), deadline, NULL, NULL) < 0)
        return errno == ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_PEER_LOST;
    pt__hdr_unpack(hb, &h);
    if (h.magic != PT_TCP_MAGIC || h.op != PT_TCP_OP_HELLO || h.len != PT_TCP_NONCE ||
        h.a != PT_TCP_VERSION)
        return PT_ERR_INVALID;
    *inc = (uint64_t)h.b; /* the listener's incarnation (0: not told) */
    if (pt__tcp_recv(fd, ns, sizeof(ns), deadline, NULL, NULL) < 0)
        return errno == ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_PEER_LOST;
    pt_status_t st = pt_plat_random(pl, PT_TCP_NONCE);
    if (st != PT_OK)
        return st;
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

