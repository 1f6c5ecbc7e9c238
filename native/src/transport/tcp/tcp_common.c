/* What the tcp client and server share: socket I/O with deadlines, the handshake MAC, and the
 * context's tcp settings (secret, timeout). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp_proto.h"

/* Congestion control: the first of POOLTENSOR_TCP_CONGESTION's names (comma separated;
 * default PT_TCP_CONGESTION) that the kernel lets this process set, or the system's own for
 * "system". Why not the system's: BBR, the default of many distributions, paces every
 * socket with a timer when the link has no fq qdisc (a veth, a plain NIC queue); in a
 * virtual machine each timer is an exit to the hypervisor. Measured across two namespaces
 * on 2 cores, bench/tcp.py: a 16 MiB allreduce 5.4-5.8 ms against 8.1-12.1 under BBR, gets
 * of 1-4 MiB 2-4x faster. Why reno, not cubic: cubic leaves slow start early where the
 * round trip is short (HyStart reads the spread of a train of acknowledgements against a
 * round trip of 10-20 us as a queue building up). After a few hundred small collectives its
 * window was stuck at 120-126 segments (ssthresh too), and the next 1 MiB calls needed ~730
 * in flight: they ran 2-4x slower for a thousand calls or more (0.47-1.13 ms against
 * 0.22-0.28 with reno, bench/tcp.py across the namespaces, alternating runs; 16 MiB 9.2-12.5
 * against 5.2-6.9). Reno has no such exit; on a loss it halves its window where cubic keeps
 * 0.7 of it, which costs little on a LAN's short round trips. And reno is allowed to every
 * process; cubic only where the administrator made it so (or made it the default). */
static void congestion(int fd)
{
#ifdef TCP_CONGESTION
    const char *e = getenv("POOLTENSOR_TCP_CONGESTION");
    char names[128];
    snprintf(names, sizeof(names), "%s", e && *e ? e : PT_TCP_CONGESTION);
    if (!strcmp(names, "system"))
        return;
    char *save = NULL;
    for (char *n = strtok_r(names, ", ", &save); n; n = strtok_r(NULL, ", ", &save))
        if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, n, (socklen_t)strlen(n)) == 0)
            return;
#else
    (void)fd;
#endif
}

int pt__tcp_tune(int fd, double slice)
{
    int one = 1;
    struct timeval tv = {(time_t)slice, (suseconds_t)((slice - (double)(time_t)slice) * 1e6)};
    /* keepalive: a peer whose machine vanished (no FIN, no RST) is noticed within ~20 s */
    int idle = 10, intvl = 3, cnt = 3;
    pt_plat_keepalive(fd, idle, intvl, cnt);
    /* socket buffers: the kernel's autotuning unless POOLTENSOR_TCP_SOCKBUF says (bytes;
     * a size set by hand turns autotuning off for the socket, and the kernel caps it at
     * net.core.[rw]mem_max). Measured: see README's POOLTENSOR_TCP_SOCKBUF. */
    const char *e = getenv("POOLTENSOR_TCP_SOCKBUF");
    long buf = e && *e ? atol(e) : 0;
    if (buf > 0 && buf <= (1L << 30)) {
        int b = (int)buf;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
    }
    congestion(fd);
    /* TCP_NODELAY: a request or reply is written whole (header and payload in one sendmsg),
     * so nothing is gained by Nagle's waiting and a small request would wait for an ack */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
        return -1;
    return fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* Keep waiting after a receive/send timeout slice? 0: yes; -1: give up (errno set). */
static int slice_over(double deadline, _Atomic int *abort)
{
    if (abort && atomic_load_explicit(abort, memory_order_relaxed)) {
        errno = ECANCELED;
        return -1;
    }
    if (deadline >= 0 && pt__now() > deadline) {
        errno = ETIMEDOUT;
        return -1;
    }
    return 0;
}

/* After a failed recv/send (errno set): 1 to try again (interrupted, or a timeout slice with
 * time left); 0 to give up, a reset connection reported as EPIPE. */
static int retry_io(double deadline, _Atomic int *abort)
{
    if (errno == EINTR)
        return 1;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && slice_over(deadline, abort) == 0)
        return 1;
    if (errno == ECONNRESET)
        errno = EPIPE;
    return 0;
}

int pt__tcp_recv(int fd, void *buf, size_t len, double deadline, _Atomic int *abort,
                 size_t *got)
{
    uint8_t *p = buf;
    size_t done = 0;
    int rc = 0;
    while (done < len) {
        ssize_t n = recv(fd, p + done, len - done, MSG_WAITALL);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0) {
            errno = EPIPE;
            rc = -1;
            break;
        }
        if (retry_io(deadline, abort))
            continue;
        rc = -1;
        break;
    }
    if (got)
        *got = done;
    return rc;
}

int pt__tcp_recv_spin(int fd, void *buf, size_t len, double deadline, _Atomic int *abort)
{
    uint8_t *p = buf;
    size_t done = 0;
    double spin = pt__spin_seconds(), t0 = pt__now();
    while (done < len && spin > 0) {
        ssize_t n = recv(fd, p + done, len - done, MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            t0 = pt__now();
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            break; /* (the blocking read below reports it) */
        double el = pt__now() - t0;
        if (el >= spin || slice_over(deadline, abort) < 0)
            break;
        pt__relax(el);
    }
    return done == len ? 0 : pt__tcp_recv(fd, p + done, len - done, deadline, abort, NULL);
}

int pt__tcp_sendv(int fd, struct iovec *iov, int n, double deadline, _Atomic int *abort)
{
    while (n > 0) {
        if (iov->iov_len == 0) {
            iov++;
            n--;
            continue;
        }
        struct msghdr m = {0};
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)n;
        ssize_t w = sendmsg(fd, &m, PT_PLAT_MSG_NOSIGNAL);
        if (w < 0) {
            if (retry_io(deadline, abort))
                continue;
            return -1;
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

void pt__tcp_mac(const pt_ctx_t *ctx, int server, const uint8_t *ns, const uint8_t *nc,
                 int64_t rank, uint8_t out[PT_TCP_MAC])
{
    static const char cl[] = "pooltensor-tcp-client", sl[] = "pooltensor-tcp-server";
    uint8_t r[8];
    pt__le_put(r, (uint64_t)rank, 8);
    const void *parts[4] = {server ? sl : cl, ns, nc, r};
    size_t lens[4] = {sizeof(cl) - 1, PT_TCP_NONCE, PT_TCP_NONCE, 8};
    pt__hmac_parts(ctx->secret, ctx->secret_len, parts, lens, 4, out);
}

pt_status_t pt_ctx_set_secret(pt_ctx_t *ctx, const void *secret, size_t len)
{
    if (!ctx || !secret || len < 16)
        return PT_ERR_INVALID;
    if (len > 64) {
        /* HMAC uses a key longer than its block as its SHA-256: keep that, the same MACs */
        pt_sha256(secret, len, ctx->secret);
        ctx->secret_len = 32;
        return PT_OK;
    }
    memcpy(ctx->secret, secret, len);
    ctx->secret_len = len;
    return PT_OK;
}

pt_status_t pt_ctx_set_timeout(pt_ctx_t *ctx, double seconds)
{
    if (!ctx || !(seconds > 0))
        return PT_ERR_INVALID;
    ctx->timeout = seconds;
    return PT_OK;
}
