/* The plain-socket peer bench/tcp.py compares the tcp transport with (built there with cc into
 * the temp folder, loaded with ctypes): a 16-byte request {op, len}; op 0 (get): the server
 * sends len bytes of its buffer; op 1 (put): it receives len bytes into it and acks with 8.
 * No framing, no checks: what the kernel's tcp and memcpy allow for one connection. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static int rd(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {  /* pieces of at most 256 KiB: a huge recv delays window updates */
        ssize_t k = recv(fd, c, n < (256u << 10) ? n : (256u << 10), MSG_WAITALL);
        if (k <= 0) return -1;
        c += k; n -= (size_t)k;
    }
    return 0;
}
static int wrv(int fd, struct iovec *v, int cnt) {
    while (cnt) {
        ssize_t k = writev(fd, v, cnt);
        if (k <= 0) return -1;
        while (cnt && (size_t)k >= v->iov_len) { k -= (ssize_t)v->iov_len; v++; cnt--; }
        if (cnt) { v->iov_base = (char *)v->iov_base + k; v->iov_len -= (size_t)k; }
    }
    return 0;
}
/* TCP_NODELAY, and the congestion control the tcp transport picks (POOLTENSOR_TCP_CONGESTION,
 * default reno): the same kernel path as ours */
static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const char *e = getenv("POOLTENSOR_TCP_CONGESTION");
    char names[128], *save = NULL;
    snprintf(names, sizeof names, "%s", e && *e ? e : "reno");
    if (!strcmp(names, "system")) return;
    for (char *n = strtok_r(names, ", ", &save); n; n = strtok_r(NULL, ", ", &save))
        if (!setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, n, (socklen_t)strlen(n))) return;
}

int pp_listen(const char *host, int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16)) { close(fd); return -1; }
    return fd;
}
int pp_port(int fd) {
    struct sockaddr_in a; socklen_t l = sizeof a;
    return getsockname(fd, (struct sockaddr *)&a, &l) ? -1 : ntohs(a.sin_port);
}
struct conn { int fd; char *buf; size_t cap; };
static void *serve_one(void *arg) {
    struct conn c = *(struct conn *)arg;
    free(arg);
    uint64_t req[2];
    while (rd(c.fd, req, sizeof req) == 0) {
        size_t n = req[1] < c.cap ? req[1] : c.cap;
        if (req[0] == 0) {
            struct iovec v = {c.buf, n};
            if (wrv(c.fd, &v, 1)) break;
        } else {
            uint64_t ack = n;
            struct iovec v = {&ack, 8};
            if (rd(c.fd, c.buf, n) || wrv(c.fd, &v, 1)) break;
        }
    }
    close(c.fd);
    return NULL;
}
int pp_serve(int lfd, char *buf, size_t cap) {
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) return -1;
        nodelay(fd);
        struct conn *c = malloc(sizeof *c);
        c->fd = fd; c->buf = buf; c->cap = cap;
        pthread_t t;
        pthread_create(&t, NULL, serve_one, c);
        pthread_detach(t);
    }
}
int pp_connect(const char *host, int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    nodelay(fd);
    return fd;
}
int pp_get(int fd, char *dst, size_t n) {
    uint64_t req[2] = {0, n};
    struct iovec v = {req, sizeof req};
    return wrv(fd, &v, 1) || rd(fd, dst, n) ? -1 : 0;
}
int pp_put(int fd, const char *src, size_t n) {
    uint64_t req[2] = {1, n}, ack;
    struct iovec v[2] = {{req, sizeof req}, {(void *)src, n}};
    return wrv(fd, v, 2) || rd(fd, &ack, 8) ? -1 : 0;
}
/* One connection accepted from lfd (the allreduce part's plain-socket contender). */
int pp_accept(int lfd) {
    int fd = accept(lfd, NULL, NULL);
    if (fd >= 0) nodelay(fd);
    return fd;
}
/* Send n bytes of src and receive n into dst at once, as a two-rank allreduce must (each
 * rank's whole input to the other: the fewest bytes any algorithm moves for two ranks), from
 * one thread with non-blocking calls and poll, as MPI libraries progress a socket. -1 on an
 * error or after 10 s without progress. */
int pp_exchange(int fd, const char *src, char *dst, size_t n) {
    size_t out = 0, in = 0;
    while (out < n || in < n) {
        int moved = 0;
        if (out < n) {
            ssize_t k = send(fd, src + out, n - out, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0) out += (size_t)k, moved = 1;
            else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        }
        if (in < n) {
            ssize_t k = recv(fd, dst + in, n - in, MSG_DONTWAIT);
            if (k > 0) in += (size_t)k, moved = 1;
            else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -1;
        }
        if (!moved) {
            struct pollfd p = {fd, (short)((in < n ? POLLIN : 0) | (out < n ? POLLOUT : 0)), 0};
            if (poll(&p, 1, 10000) <= 0) return -1;
        }
    }
    return 0;
}
