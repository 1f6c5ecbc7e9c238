/* The Linux profile of platform.h.
 *
 * Segments: page-aligned anonymous shared memory: a memfd, or, where shmem transparent huge
 * pages are off, a nameless file of a private tmpfs mounted huge=within_size (below). Either
 * has no name anywhere, so nothing outlives the processes that hold it, even after SIGKILL.
 * Same-host peers map it through /proc/<pid>/fd/<fd>.
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
#include <sched.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"

/* ---- segments ---- */

/* Segments are memfds or files of the huge tmpfs, mapped by pt__plat_map_shared (map.c).
 *
 * Why a tmpfs of our own: with /sys/kernel/mm/transparent_hugepage/shmem_enabled at "never"
 * a memfd gets 4 KiB pages whatever we advise, and a stream over pool memory pays a fault (and
 * a TLB miss) per 4 KiB where numpy's anonymous memory gets 2 MiB pages. A tmpfs mounted with
 * huge=within_size gets 2 MiB pages whatever that setting says (only "deny" and "force"
 * override a mount's choice), and an unprivileged process may mount a tmpfs inside a user and
 * mount namespace of its own. So once per process a helper is cloned into new user and mount
 * namespaces; it maps our ids, makes the tmpfs (fsmount: a mount attached nowhere; on kernels
 * before 5.2 mounted over a directory of its own namespace) and opens its root O_PATH, then
 * exits. It shares our memory and descriptor table (CLONE_VM | CLONE_FILES: the descriptor is
 * simply there for us, and no page of ours is made copy-on-write as a fork would) while we
 * wait for it (CLONE_VFORK); no fork handlers run, every signal is blocked, and it makes
 * system calls only (async-signal-safe: we may have threads), from strings we prepared. The
 * mount lives while that descriptor is held (until this process exits; the namespaces die
 * with the helper), and files made in it with O_TMPFILE never have a name. Its size is the
 * machine's memory (a memfd has no limit either); pages are charged to whoever touches them,
 * as a memfd's are.
 *
 * $POOLTENSOR_SEGMENTS: "memfd" never tries the tmpfs, "tmpfs" tries it whatever the setting,
 * otherwise (auto) it is tried when shmem_enabled is "never". Where it cannot be had (user
 * namespaces off, seccomp, an old kernel) segments are memfds, silently. */

static int huge_dir = -1;            /* O_PATH root of the huge tmpfs, or -1: memfds */
static pthread_once_t huge_once = PTHREAD_ONCE_INIT;

struct huge_child {
    char uid_map[48], gid_map[48], size[24], opts[96];
    volatile int dir;                /* the helper's answer: the root, or -1 */
    volatile int step;               /* where it stopped (0: done), for a debugger */
};

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

#ifndef SYS_fsopen                  /* the new mount API (Linux 5.2): the same number everywhere */
#define SYS_fsopen 430
#define SYS_fsconfig 431
#define SYS_fsmount 432
#endif

/* The tmpfs as a mount attached nowhere (fsopen, fsmount): its root, O_PATH, or -1. */
static int huge_fsmount(const struct huge_child *c)
{
    int fs = (int)syscall(SYS_fsopen, "tmpfs", 1 /* FSOPEN_CLOEXEC */);
    if (fs < 0)
        return -1;
    static const char *const keys[] = {"huge", "size", "nr_inodes", "mode"};
    const char *vals[] = {"within_size", c->size, "0", "0700"};
    int dir = -1;
    for (int i = 0; i < 4; i++)
        if (syscall(SYS_fsconfig, fs, 1 /* FSCONFIG_SET_STRING */, keys[i], vals[i], 0) != 0)
            goto out;
    if (syscall(SYS_fsconfig, fs, 6 /* FSCONFIG_CMD_CREATE */, NULL, NULL, 0) != 0)
        goto out;
    /* FSMOUNT_CLOEXEC; MOUNT_ATTR_NOSUID | NODEV | NOEXEC */
    dir = (int)syscall(SYS_fsmount, fs, 1, 0x2 | 0x4 | 0x8);
out:
    close(fs);
    return dir;
}

/* Before the new mount API: mounted on a directory of the helper's namespace (its own copy of
 * the tree, so nothing outside sees it); its root, O_PATH, or -1. Not "/": a process's root
 * is not covered by what is mounted over it. */
static int huge_mount(const struct huge_child *c)
{
    static const char *const dirs[] = {"/tmp", "/dev/shm", "/mnt", "/var/tmp"};
    for (int i = 0; i < 4; i++) {
        struct stat before, after;
        if (stat(dirs[i], &before) != 0 || !S_ISDIR(before.st_mode) ||
            mount("pooltensor", dirs[i], "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  c->opts) != 0)
            continue;
        int dir = open(dirs[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir >= 0 && fstat(dir, &after) == 0 && after.st_dev != before.st_dev)
            return dir;
        if (dir >= 0)
            close(dir);
    }
    return -1;
}

/* The helper, born in its new namespaces: system calls only. */
static int huge_child_main(void *arg)
{
    struct huge_child *c = arg;
    c->step = 1;
    if (write_file("/proc/self/setgroups", "deny") != 0 ||
        write_file("/proc/self/uid_map", c->uid_map) != 0 ||
        write_file("/proc/self/gid_map", c->gid_map) != 0)
        _exit(1);
    c->step = 2;
    int dir = huge_fsmount(c);
    if (dir < 0)
        dir = huge_mount(c);
    if (dir < 0)
        _exit(2);
    c->dir = dir;
    c->step = 0;
    _exit(0);
}

/* Whether auto mode wants the tmpfs: shmem_enabled says "[never]". */
static int shmem_thp_off(void)
{
    char buf[128] = {0};
    int fd = open("/sys/kernel/mm/transparent_hugepage/shmem_enabled", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    return n > 0 && strstr(buf, "[never]") != NULL;
}

static _Alignas(16) char huge_stack[64 << 10];   /* the helper's, only while we wait */

static void huge_open(void)
{
    const char *want = getenv("POOLTENSOR_SEGMENTS");
    if (want && strcmp(want, "memfd") == 0)
        return;
    if (!(want && strcmp(want, "tmpfs") == 0) && !shmem_thp_off())
        return;
    static struct huge_child c;
    c.dir = -1;
    c.step = -1;
    snprintf(c.uid_map, sizeof(c.uid_map), "%u %u 1\n", (unsigned)geteuid(), (unsigned)geteuid());
    snprintf(c.gid_map, sizeof(c.gid_map), "%u %u 1\n", (unsigned)getegid(), (unsigned)getegid());
    unsigned long long mem = (unsigned long long)sysconf(_SC_PHYS_PAGES) *
                             (unsigned long long)sysconf(_SC_PAGESIZE);
    snprintf(c.size, sizeof(c.size), "%llu", mem);
    snprintf(c.opts, sizeof(c.opts), "huge=within_size,size=%llu,nr_inodes=0,mode=0700", mem);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* exit signal 0: no SIGCHLD, and only a wait with __WALL or __WCLONE can reap it, so
     * nobody else's waitpid(-1) takes it from us; CLONE_VFORK: back here once it has gone */
    pid_t pid = clone(huge_child_main, huge_stack + sizeof(huge_stack),
                      CLONE_VM | CLONE_VFORK | CLONE_FILES | CLONE_NEWUSER | CLONE_NEWNS, &c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid > 0)
        while (waitpid(pid, NULL, __WCLONE) < 0 && errno == EINTR)
            ;
    huge_dir = pid > 0 ? c.dir : -1;
}

const char *pt_plat_segment_kind(void)
{
    pthread_once(&huge_once, huge_open);
    return huge_dir >= 0 ? "tmpfs" : "memfd";
}

/* A nameless file of the huge tmpfs, or a memfd. */
static int segment_fd(void)
{
    pthread_once(&huge_once, huge_open);
    if (huge_dir >= 0) {
        int fd = openat(huge_dir, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0)
            return fd;
    }
    return memfd_create("pooltensor", MFD_CLOEXEC);
}

pt_status_t pt_plat_segment_create(size_t len, pt_plat_segment_t *out)
{
    pt_status_t st;
    int fd = segment_fd();
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

/* ---- a socket's sleeper ---- */

int pt_plat_sleeper_open(int fd)
{
    int sp = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLONESHOT};
    if (sp >= 0 && epoll_ctl(sp, EPOLL_CTL_ADD, fd, &ev) < 0) {
        close(sp);
        return -1;
    }
    return sp;
}

void pt_plat_sleeper_arm(int sp, int fd, int on)
{
    /* a disarmed one-shot interest reports nothing, and changing it wakes nobody */
    struct epoll_event ev = {.events = EPOLLONESHOT | (on ? EPOLLIN : 0u)};
    (void)epoll_ctl(sp, EPOLL_CTL_MOD, fd, &ev);
}

void pt_plat_sleeper_wait(int sp, int timeout_ms)
{
    struct epoll_event ev;
    (void)epoll_wait(sp, &ev, 1, timeout_ms);
}

void pt_plat_sleeper_close(int sp)
{
    if (sp >= 0)
        close(sp);
}

int pt_plat_sleeper_timer(int sp)
{
    if (sp < 0)
        return -1;
    int t = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    /* edge-triggered: each ring wakes the sleeper once, read or not */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
    if (t >= 0 && epoll_ctl(sp, EPOLL_CTL_ADD, t, &ev) < 0) {
        close(t);
        return -1;
    }
    return t;
}

void pt_plat_sleeper_alarm(int t, double seconds)
{
    if (t < 0)
        return;
    struct itimerspec its = {0};
    if (seconds > 0) {
        its.it_value.tv_sec = (time_t)seconds;
        its.it_value.tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9);
        if (!its.it_value.tv_sec && !its.it_value.tv_nsec)
            its.it_value.tv_nsec = 1;
    }
    (void)timerfd_settime(t, 0, &its, NULL);
}

int pt_plat_sleeper_rang(int t)
{
    uint64_t n;
    return t >= 0 && read(t, &n, sizeof(n)) == (ssize_t)sizeof(n);
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

void pt_plat_unacked_timeout(int fd, double seconds)
{
    unsigned ms = seconds > 4e6 ? 4000000000u : (unsigned)(seconds * 1000.0);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
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
