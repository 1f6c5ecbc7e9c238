/* The Linux profile of platform.h.
 *
 * Segments: page-aligned anonymous shared memory (memfd). A memfd has no name in /dev/shm, so
 * nothing outlives the processes that hold it, even after SIGKILL. Same-host peers map it
 * through /proc/<pid>/fd/<fd>.
 * Wait and wake: futexes, process-private unless the word is shared. Wake-up descriptors:
 * eventfds. Peer death: pidfds (kill(pid, 0) where pidfd_open is missing). A peer's private
 * memory: cross-memory attach (process_vm_readv/writev). Random bytes: getrandom. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"

/* ---- segments ---- */

/* Segments are memfds, mapped by pt__plat_map_shared (map.c). */

pt_status_t pt_plat_segment_create(size_t len, pt_plat_segment_t *out)
{
    pt_status_t st;
    int fd = memfd_create("pooltensor", MFD_CLOEXEC);
    if (fd < 0)
        return pt__sys();
    if (ftruncate(fd, (off_t)len) != 0) {
        st = pt__sys();
        goto err_close;
    }
    void *base = pt__plat_map_shared(fd, len, PROT_READ | PROT_WRITE);
    if (base == MAP_FAILED) {
        st = errno == ENOMEM ? PT_ERR_NOMEM : pt__sys();
        goto err_close;
    }
    out->base = base;
    out->len = len;
    out->handle = fd;
    return PT_OK;
err_close:
    close(fd);
    return st;
}

void pt_plat_segment_destroy(pt_plat_segment_t *seg)
{
    munmap(seg->base, seg->len);
    close(seg->handle);
}

/* Open a peer's fd through /proc; write access when it can be had, else read-only. */
static int open_peer_fd(int32_t pid, int32_t fd, int *writable)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    *writable = 1;
    if (f < 0 && (errno == EACCES || errno == EROFS)) {
        f = open(path, O_RDONLY | O_CLOEXEC);
        *writable = 0;
    }
    return f;
}

pt_status_t pt_plat_segment_map(int32_t pid, int32_t handle, size_t len, int write,
                                void **base_out, int *writable_out)
{
    int writable;
    int fd = open_peer_fd(pid, handle, &writable);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? PT_ERR_PEER_LOST : pt__sys();
    return pt__plat_map_peer(fd, len, write || writable, writable, base_out, writable_out);
}

void pt_plat_segment_unmap(void *base, size_t len) { munmap(base, len); }

/* ---- wait and wake ---- */

void pt_plat_wait(_Atomic uint32_t *addr, uint32_t expected, double timeout, int shared)
{
    struct timespec ts, *tsp = NULL;
    if (timeout >= 0) {
        ts.tv_sec = (time_t)timeout;
        ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
        tsp = &ts;
    }
    int op = shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE;
    syscall(SYS_futex, (uint32_t *)addr, op, expected, tsp, NULL, 0);
}

void pt_plat_wake(_Atomic uint32_t *addr, int shared)
{
    int op = shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE;
    syscall(SYS_futex, (uint32_t *)addr, op, INT_MAX, NULL, NULL, 0);
}

/* ---- wake-up descriptors ---- */

pt_status_t pt_plat_wakefd_open(pt_plat_wakefd_t *out)
{
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0)
        return pt__sys();
    out->rfd = out->wfd = fd;
    return PT_OK;
}

void pt_plat_wakefd_signal(const pt_plat_wakefd_t *w)
{
    if (w->wfd < 0)
        return;
    uint64_t one = 1;
    (void)!write(w->wfd, &one, sizeof(one));
}

void pt_plat_wakefd_drain(const pt_plat_wakefd_t *w)
{
    uint64_t v;
    (void)!read(w->rfd, &v, sizeof(v));
}

void pt_plat_wakefd_close(pt_plat_wakefd_t *w)
{
    if (w->rfd >= 0)
        close(w->rfd);
    if (w->wfd >= 0 && w->wfd != w->rfd)
        close(w->wfd);
    *w = PT_PLAT_WAKEFD_CLOSED;
}

/* ---- peer death ---- */

int pt_plat_peer_watch(int32_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

void pt_plat_peer_unwatch(int fd)
{
    if (fd >= 0)
        close(fd);
}

int pt_plat_peer_gone(int32_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

/* ---- a peer's private memory ---- */

static pt_status_t cma(int32_t pid, uint64_t addr, void *buf, size_t len, int write)
{
    size_t done = 0;
    while (done < len) {
        struct iovec l = {(uint8_t *)buf + done, len - done};
        struct iovec r = {(void *)(uintptr_t)(addr + done), len - done};
        ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == ESRCH)
                return PT_ERR_PEER_LOST;
            return pt__sys();
        }
        if (n == 0)
            return PT_ERR_BOUNDS;
        done += (size_t)n;
    }
    return PT_OK;
}

pt_status_t pt_plat_copy_from_peer(int32_t pid, void *dst, uint64_t addr, size_t len)
{
    return cma(pid, addr, dst, len, 0);
}

void pt_plat_segment_seal(int32_t pid, int32_t handle)
{
    (void)pid;
    (void)handle; /* a memfd has no name */
}

pt_status_t pt_plat_copy_to_peer(int32_t pid, uint64_t addr, const void *src, size_t len)
{
    return cma(pid, addr, (void *)(uintptr_t)src, len, 1);
}

/* ---- random bytes ---- */

pt_status_t pt_plat_random(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        long n = syscall(SYS_getrandom, p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return pt__sys();
        }
        p += n;
        len -= (size_t)n;
    }
    return PT_OK;
}

/* ---- the profile, housekeeping, wrappers ---- */

const char *pt_plat_name(void) { return "linux"; }

void pt_plat_reap(void) {} /* memfds have no names to leave behind */

int pt_plat_socket(int family, int nonblock)
{
    return socket(family, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
}

int pt_plat_accept(int lfd) { return accept4(lfd, NULL, NULL, SOCK_CLOEXEC); }

void pt_plat_keepalive(int fd, int idle, int intvl, int cnt)
{
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

void pt_plat_rwlock_init(pthread_rwlock_t *l)
{
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(l, &a);
    pthread_rwlockattr_destroy(&a);
}

void pt_plat_secure_zero(void *p, size_t len) { explicit_bzero(p, len); }
