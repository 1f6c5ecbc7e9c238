/* The portable profile of platform.h: only what macOS also has, so the macOS build is this file
 * with another compiler. Built and tested on Linux too ($POOLTENSOR_NATIVE=posix).
 *
 * Segments: shm_open + ftruncate + mmap, named "/pt.<pid>.<n>" (n counts this process's
 * segments), so a peer that knows our pid and the handle n opens the same name: the control
 * block carries no more than it does on Linux. A name is unlinked once every same-host peer
 * has mapped the segment, else when it is destroyed;
 * the names of a process that died without destroying them (SIGKILL) are reaped by the next
 * context made or destroyed on the machine (pt_plat_reap), where the system lists them
 * (/dev/shm; macOS does not list them, see the README).
 * Wait and wake: a word in process-private memory sleeps on a condition variable of a small
 * table hashed by address; a word shared with other processes sleeps in
 * os_sync_wait_on_address on macOS 14.4+ and elsewhere yields the core for 200 us, then naps
 * (a short sleep that grows while the word stays unchanged; callers spin first and check
 * again, as the interface allows). The name of a segment goes as soon as every same-host peer
 * has mapped it (pt_plat_segment_seal). Wake-up descriptors: pipes. Peer death: kqueue
 * EVFILT_PROC on macOS, else kill(pid, 0) asked every 5 ms by the monitor. A peer's private
 * memory: no cross-memory attach (PT_ERR_UNSUPPORTED: the shm transport has the target's
 * native threads serve it). Random bytes: getentropy. */
#if !defined(__APPLE__)
#define _GNU_SOURCE /* glibc: getentropy, MAP_ANONYMOUS under -std=gnu11 anyway */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __APPLE__
#include <sys/event.h>
#include <sys/random.h>
#if __has_include(<os/os_sync_wait_on_address.h>)
#include <os/os_sync_wait_on_address.h>
#define PT_HAVE_OS_SYNC 1
#endif
#endif

#include "platform/platform.h"

/* ---- segments ---- */

static _Atomic int next_handle;

static void seg_name(char *buf, size_t n, int32_t pid, int32_t handle)
{
    snprintf(buf, n, "/pt.%d.%d", (int)pid, (int)handle);
}


pt_status_t pt_plat_segment_create(size_t len, pt_plat_segment_t *out)
{
    pt_status_t st;
    char name[64];
    int32_t handle = atomic_fetch_add(&next_handle, 1);
    seg_name(name, sizeof(name), (int32_t)getpid(), handle);
    shm_unlink(name); /* a dead process that had our pid may have left it */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
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
    close(fd); /* the mapping and the name keep it */
    out->base = base;
    out->len = len;
    out->handle = handle;
    return PT_OK;
err_close:
    close(fd);
    shm_unlink(name);
    return st;
}

const char *pt_plat_segment_kind(void) { return "shm_open"; }

void pt_plat_segment_destroy(pt_plat_segment_t *seg)
{
    char name[64];
    seg_name(name, sizeof(name), (int32_t)getpid(), seg->handle);
    shm_unlink(name);
    munmap(seg->base, seg->len);
}

pt_status_t pt_plat_segment_map(int32_t pid, int32_t handle, size_t len, int write,
                                void **base_out, int *writable_out)
{
    char name[64];
    seg_name(name, sizeof(name), pid, handle);
    int writable = 1;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0 && errno == EACCES && !write) {
        fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
        writable = 0;
    }
    if (fd < 0)
        return errno == ENOENT ? PT_ERR_PEER_LOST : pt__sys();
    return pt__plat_map_peer(fd, len, writable, writable, base_out, writable_out);
}

void pt_plat_segment_unmap(void *base, size_t len) { munmap(base, len); }

void pt_plat_segment_seal(int32_t pid, int32_t handle)
{
    char name[64];
    seg_name(name, sizeof(name), pid, handle);
    shm_unlink(name); /* (ENOENT when another mapper came first) */
}

/* ---- wait and wake ---- */

/* Private words: condition variables hashed by address. A waker changes the word before it
 * takes the bucket's lock, a waiter checks it under the lock: no wake-up is lost. */
#define PT_WAIT_BUCKETS 64

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
} pt_bucket_t;

static pt_bucket_t buckets[PT_WAIT_BUCKETS];
static pthread_once_t buckets_once = PTHREAD_ONCE_INIT;

static void buckets_init(void)
{
    for (int i = 0; i < PT_WAIT_BUCKETS; i++) {
        pthread_mutex_init(&buckets[i].lock, NULL);
#ifdef __APPLE__
        pthread_cond_init(&buckets[i].cond, NULL); /* timed waits are relative there */
#else
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&buckets[i].cond, &ca);
        pthread_condattr_destroy(&ca);
#endif
    }
}

static pt_bucket_t *bucket_of(const void *addr)
{
    pthread_once(&buckets_once, buckets_init);
    uintptr_t a = (uintptr_t)addr;
    return &buckets[((a >> 3) ^ (a >> 11)) % PT_WAIT_BUCKETS];
}

static void private_wait(_Atomic uint32_t *addr, uint32_t expected, double timeout)
{
    pt_bucket_t *b = bucket_of(addr);
    pthread_mutex_lock(&b->lock);
    if (atomic_load(addr) == expected) {
        if (timeout < 0) {
            pthread_cond_wait(&b->cond, &b->lock);
        } else {
            struct timespec ts;
#ifdef __APPLE__
            ts.tv_sec = (time_t)timeout;
            ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait_relative_np(&b->cond, &b->lock, &ts);
#else
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double t = (double)ts.tv_nsec * 1e-9 + timeout;
            ts.tv_sec += (time_t)t;
            ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
            pthread_cond_timedwait(&b->cond, &b->lock, &ts);
#endif
        }
    }
    pthread_mutex_unlock(&b->lock);
}

static void private_wake(_Atomic uint32_t *addr)
{
    pt_bucket_t *b = bucket_of(addr);
    pthread_mutex_lock(&b->lock);
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

/* Shared words where the system cannot sleep on them. For the first 200 us that the same
 * thread keeps waiting on the same unchanged word it yields the core (to the peer it waits
 * for, on a machine with more ranks than cores) instead of sleeping: the shortest nanosleep
 * lasts the timer slack (about 50 us on Linux), far longer than a peer's answer. Then it naps,
 * 5 us at first, doubling up to 500 us. */
static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap(_Atomic uint32_t *addr, uint32_t expected, double timeout)
{
    static _Thread_local const void *last_addr;
    static _Thread_local uint32_t last_expected;
    static _Thread_local double step, since;
    double now = mono_now();
    if (last_addr != (const void *)addr || last_expected != expected || step <= 0 ||
        now - since > 1.0) {
        step = 5e-6;
        since = now;
    }
    last_addr = addr;
    last_expected = expected;
    if (now - since < 2e-4) {
        sched_yield();
        return;
    }
    double s = timeout >= 0 && timeout < step ? timeout : step;
    if (step < 5e-4)
        step *= 2;
    if (s <= 0)
        return;
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

void pt_plat_wait(_Atomic uint32_t *addr, uint32_t expected, double timeout, int shared)
{
    if (!shared) {
        private_wait(addr, expected, timeout);
        return;
    }
#ifdef PT_HAVE_OS_SYNC
    if (__builtin_available(macOS 14.4, *)) {
        if (timeout < 0)
            os_sync_wait_on_address((void *)addr, expected, 4, OS_SYNC_WAIT_ON_ADDRESS_SHARED);
        else
            os_sync_wait_on_address_with_timeout((void *)addr, expected, 4,
                                                 OS_SYNC_WAIT_ON_ADDRESS_SHARED,
                                                 OS_CLOCK_MACH_ABSOLUTE_TIME,
                                                 (uint64_t)(timeout * 1e9));
        return;
    }
#endif
    nap(addr, expected, timeout);
}

void pt_plat_wake(_Atomic uint32_t *addr, int shared)
{
    if (!shared) {
        private_wake(addr);
        return;
    }
#ifdef PT_HAVE_OS_SYNC
    if (__builtin_available(macOS 14.4, *))
        os_sync_wake_by_address_all((void *)addr, 4, OS_SYNC_WAKE_BY_ADDRESS_SHARED);
#endif
    /* nappers look again by themselves */
}

/* ---- a socket's sleeper: none here (each connection's thread reads alone) ---- */

int pt_plat_sleeper_open(int fd)
{
    (void)fd;
    return -1;
}

void pt_plat_sleeper_arm(int sp, int fd, int on)
{
    (void)sp;
    (void)fd;
    (void)on;
}

void pt_plat_sleeper_wait(int sp, int timeout_ms)
{
    (void)sp;
    (void)timeout_ms;
}

int pt_plat_sleeper_timer(int sp)
{
    (void)sp;
    return -1;
}

void pt_plat_sleeper_alarm(int t, double seconds)
{
    (void)t;
    (void)seconds;
}

int pt_plat_sleeper_rang(int t)
{
    (void)t;
    return 0;
}

void pt_plat_sleeper_close(int sp) { (void)sp; }

/* ---- wake-up descriptors: a pipe ---- */

static int fd_flags(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
           fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ? -1 : 0;
}

pt_status_t pt_plat_wakefd_open(pt_plat_wakefd_t *out)
{
    int p[2];
    if (pipe(p) != 0)
        return pt__sys();
    if (fd_flags(p[0]) < 0 || fd_flags(p[1]) < 0) {
        pt_status_t st = pt__sys();
        close(p[0]);
        close(p[1]);
        return st;
    }
    out->rfd = p[0];
    out->wfd = p[1];
    return PT_OK;
}

void pt_plat_wakefd_signal(const pt_plat_wakefd_t *w)
{
    if (w->wfd < 0)
        return;
    char one = 1;
    (void)!write(w->wfd, &one, 1); /* a full pipe is signalled already */
}

void pt_plat_wakefd_drain(const pt_plat_wakefd_t *w)
{
    char buf[64];
    while (read(w->rfd, buf, sizeof(buf)) == (ssize_t)sizeof(buf))
        ;
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

int pt_plat_peer_watch(int32_t pid)
{
#ifdef __APPLE__
    /* a kqueue with one EVFILT_PROC NOTE_EXIT event polls readable once pid exits */
    int kq = kqueue();
    if (kq < 0)
        return -1;
    struct kevent ev;
    EV_SET(&ev, (uintptr_t)pid, EVFILT_PROC, EV_ADD | EV_ONESHOT, NOTE_EXIT, 0, NULL);
    if (kevent(kq, &ev, 1, NULL, 0, NULL) < 0 || fcntl(kq, F_SETFD, FD_CLOEXEC) < 0) {
        close(kq);
        return -1;
    }
    return kq;
#else
    (void)pid;
    return -1; /* the monitor asks pt_plat_peer_gone */
#endif
}

void pt_plat_peer_unwatch(int fd)
{
    if (fd >= 0)
        close(fd);
}

/* kill(pid, 0) succeeds on a zombie (dead, not yet waited for by its parent); on Linux its
 * state in /proc says so, so a rank whose parent waits for another first is still seen gone. */
int pt_plat_peer_gone(int32_t pid)
{
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
#ifdef __linux__
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
#else
    return 0;
#endif
}

/* ---- a peer's private memory: not on this profile ---- */

pt_status_t pt_plat_copy_from_peer(int32_t pid, void *dst, uint64_t addr, size_t len)
{
    return PT_ERR_UNSUPPORTED;
}

pt_status_t pt_plat_copy_to_peer(int32_t pid, uint64_t addr, const void *src, size_t len)
{
    return PT_ERR_UNSUPPORTED;
}

/* ---- random bytes ---- */

pt_status_t pt_plat_random(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        size_t n = len < 256 ? len : 256; /* getentropy's limit */
        if (getentropy(p, n) != 0)
            return pt__sys();
        p += n;
        len -= n;
    }
    return PT_OK;
}

/* ---- the profile, housekeeping, wrappers ---- */

const char *pt_plat_name(void) { return "posix"; }

void pt_plat_reap(void)
{
    DIR *d = opendir("/dev/shm"); /* where the system lists shm_open names */
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid, n, end = 0;
        if (sscanf(e->d_name, "pt.%d.%d%n", &pid, &n, &end) != 2 || e->d_name[end] != 0 ||
            pid <= 0)
            continue;
        if (pt_plat_peer_gone(pid)) {
            char name[300];
            snprintf(name, sizeof(name), "/%s", e->d_name);
            shm_unlink(name);
        }
    }
    closedir(d);
}

int pt_plat_socket(int family, int nonblock)
{
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    int fl = fcntl(fd, F_GETFL);
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ||
        (nonblock && (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0))) {
        close(fd);
        return -1;
    }
#ifdef SO_NOSIGPIPE
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
    return fd;
}

int pt_plat_accept(int lfd)
{
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return -1;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
#ifdef SO_NOSIGPIPE
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
    return fd;
}

void pt_plat_keepalive(int fd, int idle, int intvl, int cnt)
{
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
#if defined(__APPLE__) && defined(TCP_KEEPALIVE)
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPALIVE, &idle, sizeof(idle));
#elif defined(TCP_KEEPIDLE)
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
#endif
#ifdef TCP_KEEPINTVL
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
#endif
#ifdef TCP_KEEPCNT
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
#endif
}

void pt_plat_unacked_timeout(int fd, double seconds)
{
#ifdef TCP_USER_TIMEOUT
    unsigned ms = seconds > 4e6 ? 4000000000u : (unsigned)(seconds * 1000.0);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
#else
    (void)fd;
    (void)seconds;
#endif
}

void pt_plat_rwlock_init(pthread_rwlock_t *l) { pthread_rwlock_init(l, NULL); }

void pt_plat_secure_zero(void *p, size_t len)
{
    volatile uint8_t *v = p;
    while (len--)
        *v++ = 0;
}
